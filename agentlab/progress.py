"""A GRPO run's progress in the tutorial's notebooks: a bar while it trains, then one line that says what it did.

    from agentlab.progress import summarise_steps
    from agentlab.quiet import in_notebook
    if in_notebook():
        summarise_steps(trainer, run)

Why not transformers' own: in a Jupyter kernel a Trainer draws an HTML table of its training loss, one row a step,
and a saved notebook keeps that table as it last stood. GRPO's loss is no reading of progress (the advantages are
centred within each group, so it sits near 0 whether the policy improves or not: notebooks 06, 07, 09 and 10 kept
columns of 0.000000), and a code host shows the table as a static page of numbers. The bar here goes away when the
run ends (``agentlab.notebook.drop_progress_widgets`` drops its saved first frame) and leaves one line with the
steps, the seconds and the training reward at the first and last step this call trained, read from the run's
``metrics.jsonl``. Outside a notebook the Trainer's text bar is kept.
"""

from __future__ import annotations

import time


def steps_line(name: str, records: list[dict], seconds: float) -> str:
    """The line a GRPO call leaves: its steps (``records``: the ``metrics.jsonl`` rows it wrote), its seconds and
    the mean training reward of its first and last step."""
    if not records:
        return f"GRPO {name}: no step left to train"
    first, last = records[0], records[-1]
    steps = f"step {first['step']}" if first is last else f"steps {first['step']}–{last['step']}"
    reward = (f"reward {first['reward_mean']:.2f}" if first is last else
              f"training reward {first['reward_mean']:.2f} → {last['reward_mean']:.2f} (each step's rollouts' mean)")
    return f"GRPO {name}: {steps} in {seconds:.0f} s, {reward}"


def summarise_steps(trainer, run) -> None:
    """Replace ``trainer``'s notebook table (or text bar) with a bar of its steps that leaves :func:`steps_line`."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback
    from transformers.trainer_callback import ProgressCallback

    from agentlab.runs import read_jsonl

    try:
        from transformers.utils.notebook import NotebookProgressCallback
    except ImportError:  # no IPython: no notebook table to replace
        NotebookProgressCallback = ProgressCallback
    metrics = run.metrics_file

    class Steps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.first, self.t0 = state.global_step, time.time()
            self.bar = tqdm(total=max(0, args.max_steps - state.global_step), desc=f"GRPO {run.path.name} steps",
                            leave=False, disable=not state.is_world_process_zero)

        def on_step_end(self, args, state, control, **kw):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kw):
            self.bar.close()
            if state.is_world_process_zero:
                records = [r for r in read_jsonl(metrics)[0] if r["step"] > self.first] if metrics.exists() else []
                print(steps_line(run.label, records, time.time() - self.t0), flush=True)

    for table in {NotebookProgressCallback, ProgressCallback}:
        trainer.pop_callback(table)
    trainer.add_callback(Steps())
