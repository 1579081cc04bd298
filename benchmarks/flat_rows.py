"""GRPO's forward and backward with and without the rollouts that carry no advantage (``drop_flat_rows``), on the
same generated batches: seconds, rows trained, and how far the two gradients are apart.

    python benchmarks/flat_rows.py                       # 4 batches of lookup, 4 groups x 4, 2 timed passes a mode
    python benchmarks/flat_rows.py --adapter runs/…/adapter --batches 2 --reps 2
    python benchmarks/flat_rows.py --end-to-end 2       # two whole quickstart GRPO runs, without and with it

A flat group (every rollout earned the same reward) gets advantages of exactly 0 (with ``skip_zero_signal``, on
here, also where TRL's float32 mean would leave rounding-sized ones), and under TRL's dapo loss such a row adds
nothing to the loss: ``drop_flat_rows`` leaves it out of the forward and backward. Each batch is generated once
through the training path (``build_trainer``'s rollout), then its loss and backward are timed in both modes,
alternating, on the same weights. The gradients are compared (max |difference| / max |gradient|).

Beside the measurement, a projection for the doc_search study from its carried records (``benchmarks/carry``):
the share of its steps' seconds that the flat rollouts' forward and backward took, each step's forward and backward
seconds weighed by the share of its tokens those rollouts held. Writes ``benchmarks/results/flat_rows.json``. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

CARRIED_RUNS = Path(__file__).parent / "carry" / "seed-systems" / "doc_search" / "cheap-64"


def timed_pass(trainer, model, inputs: dict, drop: bool) -> tuple[float, dict, int]:
    """One step's forward and backward over ``inputs`` in TRL's micro-batches: (seconds, gradients, rows trained)."""
    trainer.drop_flat_rows, trainer.timing = drop, {}
    model.zero_grad()
    micro, rows = trainer.args.per_device_train_batch_size, len(inputs["advantages"])
    t0 = time.perf_counter()
    for start in range(0, rows, micro):
        part = {k: v[start:start + micro] if hasattr(v, "dim") and v.dim() else v for k, v in inputs.items()}
        trainer.compute_loss(model, part).backward()
    seconds = time.perf_counter() - t0
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return seconds, grads, trainer.timing["trained_rows"]


def measure(args) -> list[dict]:
    from grpo_step import make_trainer

    from agentlab.trl_compat import generate_and_score

    tmp = Path(tempfile.mkdtemp(prefix="flat_rows_"))
    trainer, _, _, _ = make_trainer("agentlab", 1, args.adapter, tmp, groups_per_step=args.groups,
                                    group_size=args.group_size, skip_zero_signal=True)
    model = trainer.model
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    loader = iter(trainer.get_train_dataloader())
    out = []
    for b in range(args.batches):
        model.eval()
        t0 = time.perf_counter()
        inputs = generate_and_score(trainer, next(loader))
        generate_s = time.perf_counter() - t0
        model.train()
        adv, mask = inputs["advantages"], inputs["completion_mask"]
        flat = (adv == 0).reshape(len(adv), -1).all(1)
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.reps + 1):  # the first pair warms up
            for drop in ((False, True) if r % 2 == 0 else (True, False)):
                s, grads, trained = timed_pass(trainer, model, inputs, drop)
                if r:
                    seconds[drop].append(s)
                if drop:
                    kept, dropped_grads = trained, grads
                else:
                    all_grads = grads
        scale = max(float(g.abs().max()) for g in all_grads.values())
        gap = max(float((dropped_grads[n] - g).abs().max()) for n, g in all_grads.items())
        row = {"batch": b, "rows": len(adv), "flat_rows": int(flat.sum()), "trained_rows": kept,
               "completion_tokens": int(mask.sum()), "flat_completion_tokens": int(mask[flat].sum()),
               "generate_s": round(generate_s, 1),
               "forward_backward_s": {"every_row": statistics.median(seconds[False]),
                                      "drop_flat_rows": statistics.median(seconds[True])},
               "gradient_gap": gap / scale if scale else None, "gradient_scale": scale}
        row["ratio"] = row["forward_backward_s"]["drop_flat_rows"] / row["forward_backward_s"]["every_row"]
        print(f"batch {b}: {row['flat_rows']}/{row['rows']} rows flat, {kept} trained; forward+backward "
              f"{row['forward_backward_s']['every_row']:.1f} s -> {row['forward_backward_s']['drop_flat_rows']:.1f} s "
              f"(x{row['ratio']:.2f}); gradient gap {row['gradient_gap']}", flush=True)
        out.append(row)
    return out


def end_to_end(seed: int) -> dict:
    """The quickstart's GRPO from ``zero_signal.py``'s default start (the AVX2 quickstart's SFT choice), TRL's way
    (``step`` mode), once training every rollout and once with ``drop_flat_rows``, one after the other: the runs'
    step seconds, rollouts trained and last validation. The gradients differ by rounding, so the two runs' rollouts
    may drift apart after the first update: this shows the saving in a real run, not a controlled ratio."""
    from dataclasses import replace

    import zero_signal as zs

    from agentlab.machine import describe
    from agentlab.paths import runs_dir
    from agentlab.runs import RunDir
    from agentlab.train import run_grpo

    start_args = SimpleNamespace(sft_lr=1e-3, sft_steps=4, eval_every=4)
    cmp, start = zs.start_adapter(start_args)
    splits, scored = cmp.tasks(), zs.scored_start(start)
    cmp.evaluate(scored, start, splits["validation"], "start")
    out = {"start": zs.start_name(start_args), "seed": seed, "machine": describe()}
    for drop in (False, True):
        mode = "drop_flat_rows" if drop else "every_row"
        exp = replace(zs.experiment(start_args, "step", seed), drop_flat_rows=drop,
                      name=f"flat-rows/{zs.start_name(start_args)}/{mode}/seed-{seed}")
        run = RunDir(runs_dir() / exp.name)
        if not run.finished:
            print(f"[flat-rows] end to end, {mode}, seed {seed}", flush=True)
            run_grpo(exp, splits["train"], splits["validation"], init_adapter=start, run=run, start_eval=scored)
        metrics, last = run.metrics(), run.evals()[-1]
        out[mode] = {"step_s": round(sum(m["time_step_s"] for m in metrics), 1),
                     "forward_backward_s": round(sum(m["time_forward_s"] + m["time_backward_s"] for m in metrics), 1),
                     "rollouts": len(metrics) * exp.groups_per_step * exp.group_size,
                     "trained_rollouts": sum(m["trained_rollouts"] for m in metrics),
                     "zero_variance_groups": [m["zero_variance_groups"] for m in metrics],
                     "last_validation": {k: last["success"][k] for k in ("mean", "ci_low", "ci_high")}}
    return out


def _dropped_token_share(episodes: list[dict]) -> float:
    """Of one step's rollouts, the share of the tokens the training forward runs (each row's tokens after the
    step's shared prefix, as ``shared_prefix_logps`` lays them out) that ``drop_flat_rows`` leaves out: the flat
    groups' rollouts, less the shortest one when every group is flat (a pass still trains one row)."""
    from agentlab.train import flat_groups

    episodes = sorted(episodes, key=lambda e: (e["group"], e["sample"]))
    size = sum(e["group"] == episodes[0]["group"] for e in episodes)
    rows = [e["tokens"]["prompt_ids"] + e["tokens"]["completion_ids"] for e in episodes]
    prefix = 0
    while all(len(r) > prefix and r[prefix] == rows[0][prefix] for r in rows):
        prefix += 1
    cost = [len(r) - prefix for r in rows]
    rewards = [SimpleNamespace(reward=e["reward"], failure=e["failure"]) for e in episodes]
    flat = [f for f in flat_groups(rewards, size) for _ in range(size)]
    dropped = sum(c for c, f in zip(cost, flat, strict=True) if f)
    if all(flat):
        dropped -= min(cost)
    return dropped / sum(cost)


def projection(folder: Path = CARRIED_RUNS) -> dict | None:
    """From the doc_search study's carried GRPO records: per seed, the flat share of its rollouts, the share of its
    steps' seconds (``time_step_s``: generation, forward and backward) that the forward and backward took, and the
    share ``drop_flat_rows`` would have saved, each step's forward and backward seconds weighed by the share of its
    tokens the flat rollouts held."""
    seeds = {}
    for metrics in sorted(folder.glob("seed-*/grpo/metrics.jsonl")):
        lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        lines = [m for m in lines if m.get("time_forward_s") is not None]
        by_step: dict[int, list[dict]] = {}
        for x in (metrics.parent / "rollouts.jsonl").read_text().splitlines():
            if x.strip():
                e = json.loads(x)
                by_step.setdefault(e["step"], []).append(e)
        total = sum(m["time_step_s"] for m in lines)  # a step's seconds: its generation, forward and backward
        fb = sum(m["time_forward_s"] + m["time_backward_s"] for m in lines)
        saved = sum(_dropped_token_share(by_step[m["step"]]) * (m["time_forward_s"] + m["time_backward_s"])
                    for m in lines)
        sessions = metrics.parent.parent / "sessions.jsonl"
        machines = sorted({json.loads(x)["cpu_class"] for x in sessions.read_text().splitlines() if x.strip()}
                          if sessions.exists() else ())
        seeds[metrics.parent.parent.name] = {
            "steps": len(lines), "machines": machines,
            "flat_share": statistics.fmean(m["zero_variance_groups"] for m in lines),
            "forward_backward_share": fb / total, "saved_share": saved / total}
    return seeds or None


def markdown_table(d: dict) -> str:
    """The measurement per batch, then the doc_search projection (docs/performance.md)."""
    m, c = d["machine"], d["config"]
    lines = [(f"*{m['cpu_class']}, {m['cpus']} cores, {m['precision']}; `lookup` from an SFT adapter, batches of "
              f"{c['groups']} groups × {c['group_size']} rollouts, `dapo`; median of {c['reps']} passes a mode:*"), "",
             ("| batch | flat rollouts | rollouts trained | completion tokens of flat rollouts | forward + backward, "
              "every rollout | with `--drop-flat-rows true` | ratio | gradient difference (max, relative) |"),
             "|---|---|---|---|---|---|---|---|"]
    for b in d["batches"]:
        fb = b["forward_backward_s"]
        lines.append(f"| {b['batch']} | {b['flat_rows']} / {b['rows']} | {b['trained_rows']} | "
                     f"{b['flat_completion_tokens'] / b['completion_tokens']:.0%} | {fb['every_row']:.1f} s | "
                     f"{fb['drop_flat_rows']:.1f} s | {b['ratio']:.2f} | "
                     + (f"{b['gradient_gap']:.1e} |" if b["gradient_gap"] is not None else "both exactly 0 |"))
    lines += ["", (f"All batches: forward + backward × {d['ratio_all_batches']:.2f} with {d['flat_share']:.0%} of the "
               f"rollouts flat.")]
    if e2e := d.get("end_to_end"):
        a, b = e2e["every_row"], e2e["drop_flat_rows"]

        def val(x):
            v = x["last_validation"]
            return f"{v['mean']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"

        lines += ["", (f"End to end (`--end-to-end {e2e['seed']}`, {e2e['machine']['cpu_class']}): the quickstart's GRPO "
                       f"from the start `{e2e['start']}`, one run after the other. Every rollout: {a['step_s']:.0f} s "
                       f"of steps, {a['forward_backward_s']:.0f} s of them forward + backward, last validation "
                       f"{val(a)}. With `--drop-flat-rows true`: {b['step_s']:.0f} s, {b['forward_backward_s']:.0f} s, "
                       f"{b['trained_rollouts']} of {b['rollouts']} rollouts trained, last validation {val(b)}.")]
    if seeds := d.get("doc_search_projection"):
        machines = sorted({c for p in seeds.values() for c in p.get("machines", ())})
        lines += ["", f"Projected for the doc_search study's GRPO runs (their records, {', '.join(machines)}; each "
                  f"step's forward and backward weighed by its flat rollouts' share of the tokens): "
                  + "; ".join(f"{name}: {p['flat_share']:.0%} of rollouts flat, forward + backward "
                              f"{p['forward_backward_share']:.0%} of the steps' seconds, {p['saved_share']:.0%} saved"
                              for name, p in seeds.items()) + "."]
    return "\n".join(lines)


def main() -> None:
    from common import RESULTS, adapter_or_quickstart, write_result

    from agentlab.machine import describe
    from agentlab.quiet import quiet_libraries

    quiet_libraries()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter", default=None, help="start from this SFT adapter (default: the quickstart's)")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--groups", type=int, default=4, help="groups a batch")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--reps", type=int, default=2, help="timed passes a mode and batch (after one warm-up pair)")
    p.add_argument("--refresh-projection", action="store_true",
                   help="measure nothing: recompute the doc_search projection in the existing results file")
    p.add_argument("--end-to-end", type=int, metavar="SEED", default=None,
                   help="instead: two quickstart GRPO runs from zero_signal.py's start, without and with the option")
    a = p.parse_args()
    if a.end_to_end is not None:
        result = json.loads((RESULTS / "flat_rows.json").read_text()) | {"end_to_end": end_to_end(a.end_to_end)}
        print(f"wrote {write_result('flat_rows.json', result)}")
        return
    if a.refresh_projection:
        result = json.loads((RESULTS / "flat_rows.json").read_text()) | {"doc_search_projection": projection()}
        print(f"wrote {write_result('flat_rows.json', result)}")
        return
    a.adapter = adapter_or_quickstart(a.adapter)
    batches = measure(a)
    every = sum(b["forward_backward_s"]["every_row"] for b in batches)
    dropped = sum(b["forward_backward_s"]["drop_flat_rows"] for b in batches)
    result = {"machine": describe(), "config": vars(a) | {"env": "lookup", "loss_type": "dapo"},
              "batches": batches, "ratio_all_batches": dropped / every,
              "flat_share": sum(b["flat_rows"] for b in batches) / sum(b["rows"] for b in batches),
              "max_gradient_gap": max(b["gradient_gap"] or 0.0 for b in batches),
              "doc_search_projection": projection()}
    path = write_result("flat_rows.json", result)
    print(f"forward+backward over {len(batches)} batches: x{result['ratio_all_batches']:.2f} with "
          f"{result['flat_share']:.0%} of rows flat; wrote {path}")


if __name__ == "__main__":
    main()
