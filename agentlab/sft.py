"""SFT warm start: LoRA on TRL's SFTTrainer, loss on the assistant's tokens only.

    from agentlab.sft import SFTSettings, run_sft
    adapter = run_sft("smollm2-135m", demos, Path("runs/sft"), SFTSettings(steps=16, lr=1e-3))
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentlab.experiment import _bf16, _cuda, _threads, lora_config
from agentlab.quiet import in_notebook
from agentlab.runs import RunDir
from agentlab.trl_compat import scored_positions_only


@dataclass(frozen=True)
class SFTSettings:
    """SFT warm start on scripted demonstrations (defaults finish in a few minutes on 2 cores)."""

    steps: int = 8
    batch_size: int = 2
    lr: float = 1e-3
    lora_r: int = 16
    seed: int = 0
    precision: str = "auto"       # bf16 mixed precision where the hardware has it (agentlab.precision)
    schedule: str = "constant"    # the learning rate over the run: "constant", or decaying to 0 ("cosine", "linear")


CHECKPOINT_S = 300.0  # seconds between an SFT run's resume points (a long study's run loses at most this to a kill)


def save_whole(model, path: Path) -> None:
    """Save an adapter under a temporary name, then rename it: a kill mid-save leaves no folder that a resumed
    search would take for a finished adapter (it checks for ``adapter_config.json``)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def longest(rows: list[dict]) -> int:
    """SFT's ``max_length``: the longest tokenized demonstration, so no demonstration is cut (a fixed 2,048 cut
    doc_search's expert trajectories, up to ~3,300 tokens, at the end, where they curate and finish)."""
    return max(len(r["input_ids"]) for r in rows)


def run_sft(model_name: str, demos: list[dict], out_dir: Path, settings: SFTSettings = SFTSettings(),
            report_to: tuple[str, ...] = (), save_at: tuple[int, ...] = (), init_adapter: str | Path | None = None,
            max_seconds: float | None = None, save_every_s: float | None = None) -> Path:
    """LoRA SFT with TRL's SFTTrainer, loss on assistant tokens only (prompts and tool results masked).

    ``demos``: conversations (``expert_demos`` rows) or pre-tokenized rows (``input_ids`` + ``assistant_masks``,
    e.g. verified rollouts for rejection-sampling fine-tuning). ``save_at``: also save the adapter after these
    steps, as ``adapter-step-N`` (one run gives every point of a steps search). ``init_adapter``: continue
    training that LoRA instead of a fresh one. ``max_seconds``: stop after the first step that ends past this
    wall-clock budget (compute-matched baselines); ``settings.steps`` stays the upper bound. ``save_every_s``: also
    save ``adapter-step-N`` after the first step past each multiple of these seconds (checkpoints of a time-budgeted
    run, for choosing one on validation as GRPO's checkpoints are).
    """
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from agentlab.models import load_policy

    if not demos:
        raise ValueError("no demonstrations to train on")
    _threads()
    from agentlab.synth import tokenize_demos

    resumable = max_seconds is None and save_every_s is None
    model, tok = load_policy(model_name)
    if init_adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    rows = [d for d in demos if "input_ids" in d] + tokenize_demos([d for d in demos if "input_ids" not in d], tok)
    args = SFTConfig(
        output_dir=str(out_dir / "trainer"), max_steps=settings.steps, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.lr, lr_scheduler_type=settings.schedule, warmup_steps=0, logging_steps=1,
        # Our pre-tokenized rows carry ``assistant_masks``, which SFTTrainer always applies: assistant-only loss.
        assistant_only_loss=False, save_strategy="no", save_total_limit=1, report_to=list(report_to), seed=settings.seed,
        use_cpu=not _cuda(), gradient_checkpointing=False, max_length=longest(rows), dataloader_num_workers=0,
        disable_tqdm=in_notebook(), bf16=_bf16(settings.precision))

    class Checkpoints(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            elapsed = time.time() - t0
            due = save_every_s is not None and elapsed >= save_every_s * (len(timed) + 1)
            if due:
                timed.append(state.global_step)
            if state.global_step in save_at or due:
                save_whole(model, out_dir / f"adapter-step-{state.global_step}")
                saved.append(state.global_step)
            if max_seconds is not None and elapsed >= max_seconds:
                control.should_training_stop = True
            elif resumable and time.time() - last_checkpoint[0] >= CHECKPOINT_S:
                control.should_save = True  # the Trainer's checkpoint (adapter, optimiser, data position, RNG)
                last_checkpoint[0] = time.time()

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         peft_config=None if init_adapter is not None else lora_config(settings.lora_r),
                         callbacks=[Checkpoints()])
    if in_notebook():  # disable_tqdm makes the Trainer print every step's log dict instead: the one line below
        from transformers.trainer_callback import PrinterCallback

        trainer.pop_callback(PrinterCallback)
    if max_seconds is not None:
        # transformers 5.24's notebook progress bar divides by None when training stops before max_steps; the
        # text bar handles an early stop (seen running notebook 00's quickstart smoke in Jupyter).
        from transformers.trainer_callback import ProgressCallback

        try:
            from transformers.utils.notebook import NotebookProgressCallback
        except ImportError:  # no IPython (a bare GPU image): no notebook bar to replace
            NotebookProgressCallback = None
        if NotebookProgressCallback is not None and trainer.pop_callback(NotebookProgressCallback) is not None:
            trainer.add_callback(ProgressCallback)
    t0, saved, timed = time.time(), [], []
    last_checkpoint = [t0]
    # A run with no time budget resumes from its last checkpoint after a kill (a budgeted one restarts: its clock
    # would not survive the kill). Checkpoints are the Trainer's own, every CHECKPOINT_S, the last one kept.
    checkpoints = RunDir(out_dir).checkpoints("trainer") if resumable else []
    with scored_positions_only():
        trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
    adapter = out_dir / "adapter"
    save_whole(trainer.model, adapter)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if in_notebook():  # one line a run where a script shows the Trainer's bar (notebook 04 trains a dozen runs)
        print(f"SFT {RunDir(out_dir).label}: {trainer.state.global_step} steps at lr {settings.lr:g}, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {time.time() - t0:.0f} s", flush=True)
    for done in (out_dir / "trainer").glob("checkpoint-*"):  # the run is whole: its resume points are not needed
        shutil.rmtree(done, ignore_errors=True)
    (out_dir / "sft_summary.json").write_text(json.dumps(
        {"steps": trainer.state.global_step, "demos": len(demos), "seconds": time.time() - t0,
         "loss_first": losses[0], "loss_last": losses[-1], "losses": losses, "settings": asdict(settings),
         "init_adapter": RunDir(out_dir).rel(init_adapter) if init_adapter else None,  # relative: folders move
         "saved_steps": saved}, indent=2))
    return adapter
