"""One short GRPO run per TRL loss type, same seed, same SFT start, same prompts: what the choice changes.

    python benchmarks/loss_types.py                      # lookup, SmolLM2-135M, every loss type (~45 min, 2 cores)
    python benchmarks/loss_types.py --types dapo grpo    # a subset
    python benchmarks/loss_types.py --smoke              # tiny model, seconds

Each run starts from the same SFT adapter (``--sft-steps`` 8 at lr 1e-3 on 48 expert demonstrations: an unfinished
start, so that eight steps of any loss have room to move; it is *not* a baseline, and the distance from it is not a
gain over SFT — `agentlab compare` measures that), trains ``--steps`` GRPO steps with one ``loss_type`` and
everything else equal (seed, lr 2e-4, 2 groups x G 4, T 1.0 as in the quickstart; TRL's RepeatSampler gives every
run the same prompts in the same order), and is evaluated greedily on the same validation tasks (never test: this
chooses a setting). Written: ``benchmarks/results/loss_types.json`` (each
type's validation success with its CI, the paired difference to TRL's default ``dapo``, seconds, and its
training diagnostics, with ``informative_steps``: the steps where at least one group's rewards differed, the only
steps with a gradient) and ``loss_types.png``.

Why 8 SFT steps and not fewer: the loss types differ in how they weigh tokens and sequences, and that only matters
when there is a gradient. From a 4-step start (greedy 0.27) a sample at T 1.0 almost never succeeded: 15 of the 16
groups in 8 steps had equal rewards, only the last step had a gradient, and every loss type ended within 0.04 of
``dapo`` — one Adam step, which is nearly blind to the gradient's scale, is not a comparison of losses. Notebook 04
predicts about half the groups informative at G 4 after 8 steps. Run folders ``runs/loss-types-sft<N>/<type>``
resume after a kill; a start other than 8 steps writes ``loss_types_sft<N>.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import statistics

from common import RESULTS, write_result

from agentlab.experiment import LOSS_TYPES


def main(argv=None) -> dict:
    from agentlab.evals import paired_bootstrap_ci, read_rollouts, success_entry
    from agentlab.paths import runs_dir
    from agentlab.pipeline import evaluate, load_split, synth
    from agentlab.plots import _plt, success_bars
    from agentlab.rollout import LoopConfig
    from agentlab.runs import RunDir
    from agentlab.train import Experiment, SFTSettings, run_grpo, run_sft

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=list(LOSS_TYPES), choices=LOSS_TYPES)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--validation", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-steps", type=int, default=8, help="SFT steps of the shared start (lr 1e-3)")
    parser.add_argument("--smoke", action="store_true", help="tiny random model and sizes (checks the script)")
    args = parser.parse_args(argv)
    model = "tiny-random" if args.smoke else "smollm2-135m"
    steps, n_val = (2, 4) if args.smoke else (args.steps, args.validation)
    sft_steps = 2 if args.smoke else args.sft_steps
    root = runs_dir() / ("loss-types-smoke" if args.smoke else f"loss-types-sft{sft_steps}")

    folder = root / "tasks"
    if not (folder / "demos.jsonl").exists():
        synth("lookup", {"train": 16 if args.smoke else 240, "validation": n_val, "test": 4}, seed=args.seed,
              demos=8 if args.smoke else 48, folder=folder)
    train, validation = load_split("lookup", "train", folder), load_split("lookup", "validation", folder)
    demos = [json.loads(line) for line in (folder / "demos.jsonl").read_text().splitlines()]
    sft_dir = root / "sft"
    adapter = sft_dir / "adapter"
    if not adapter.exists():
        run_sft(model, demos, sft_dir, SFTSettings(steps=sft_steps, lr=1e-3, seed=args.seed))
    loop = LoopConfig(max_turns=3, max_new_tokens=8 if args.smoke else 48, temperature=0.0)

    def validate(label: str, adapter_path) -> tuple[dict, list]:
        summary = evaluate(model, "lookup", validation, root / label / "validation", adapter=str(adapter_path),
                           loop=loop, label=label, reuse=True)
        return summary, read_rollouts(root / label / "validation" / "rollouts.jsonl")[0]

    start, start_eps = validate("sft", adapter)
    out = {"env": "lookup", "model": model, "seed": args.seed, "steps": steps, "n": len(validation),
           "start": {"sft_steps": sft_steps, "lr": 1e-3, "demos": len(demos)}, "sft": success_entry(start), "types": {}}
    episodes = {}
    for loss_type in args.types:
        run = RunDir(root / loss_type)
        exp = Experiment(name=f"loss-types/{loss_type}", model=model, env="lookup", loss_type=loss_type,
                         lr=2e-4, groups_per_step=1 if args.smoke else 2, group_size=2 if args.smoke else 4,
                         temperature=1.0, steps=steps, eval_every=steps, eval_tasks=2,
                         max_new_tokens=8 if args.smoke else 48, seed=args.seed)
        if not run.finished:
            run_grpo(exp, train, validation[:2], init_adapter=adapter, run=run)  # luspo: experiment.LOSS_RULES
        seconds = sum(m.get("time_step_s") or 0.0 for m in run.metrics())
        summary, episodes[loss_type] = validate(loss_type, run.path / "adapter")
        metrics = run.metrics()

        def mean(key, ms=metrics):
            values = [m[key] for m in ms if m.get(key) is not None]
            return statistics.fmean(values) if values else None

        out["types"][loss_type] = {
            "validation": success_entry(summary), "train_seconds": round(seconds, 1),
            "informative_steps": sum(1 for m in metrics if (m.get("zero_variance_groups") or 0.0) < 1.0),
            "train_reward_mean": mean("reward_mean"),
            "entropy_last": metrics[-1].get("entropy") if metrics else None, "grad_norm_mean": mean("grad_norm"),
            "clip_ratio_mean": mean("clip_ratio"), "zero_variance_groups_mean": mean("zero_variance_groups")}
        print(f"{loss_type:8s} validation {out['types'][loss_type]['validation']['success']:.3f} "
              f"({seconds:.0f} s of training)", flush=True)
    reference = "dapo" if "dapo" in episodes else next(iter(episodes))
    for loss_type, eps in episodes.items():
        if loss_type != reference:
            low, high = paired_bootstrap_ci(episodes[reference], eps)
            diff = out["types"][loss_type]["validation"]["success"] - out["types"][reference]["validation"]["success"]
            out["types"][loss_type][f"minus_{reference}"] = {"mean": diff, "ci_low": low, "ci_high": high}
    low, high = paired_bootstrap_ci(start_eps, episodes[reference])
    out[f"{reference}_minus_start"] = {"mean": out["types"][reference]["validation"]["success"] - out["sft"]["success"],
                                     "ci_low": low, "ci_high": high}
    if args.smoke:
        return out
    name = "loss_types" if sft_steps == 8 else f"loss_types_sft{sft_steps}"  # the default start's is the headline
    write_result(f"{name}.json", out)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    bars = {"SFT start": out["sft"], **{k: t["validation"] for k, t in out["types"].items()}}
    success_bars(ax, {k: {**v, "mean": v["success"]} for k, v in bars.items()},
                 f"lookup, {steps} GRPO steps per loss type from the same {sft_steps}-step SFT adapter (validation n={len(validation)})")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)
    return out


if __name__ == "__main__":
    main()
