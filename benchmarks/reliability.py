"""Reliability under faults: a short GRPO run per fault kind and rate; crashes, attribution, lost records.

    python benchmarks/reliability.py                      # kinds tool, reset, generation, judge x rates 0.1 0.3 0.6
    python benchmarks/reliability.py --rates 0.3 --steps 2

Each case is :func:`reliability_case`: GRPO on ``lookup`` (tiny model trained for real; its generation
replays the scripted expert so that tools are called), faults injected at the given rate into tool calls, episode
resets, generation or an LLM-judge reward term, each retried twice with backoff by the loop. Counted per case:
``crashed`` (goal: never), ``attributed_to_infra`` (share of the episodes an injected fault broke after its retries
that were recorded as infra; goal 1.0), ``mislabelled_infra`` (infra episodes without an injected cause; goal 0),
``lost_records`` and ``duplicate_records`` (goal 0). Writes ``benchmarks/results/reliability.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result

from agentlab.faults import INJECTED, FlakyTerm, faulty_spec, flaky_generate

KINDS = ("none", "tool", "reset", "generation", "judge")


def _injected_cause(ep) -> bool:
    """Whether an injected fault that outlived its retries is on record in this episode."""
    texts = [c.get("result") or "" for t in ep.turns for c in t.tool_calls if c.get("error") == "infra"]
    texts += [str(ep.metrics.get(k, "")) for k in ("reset_error", "generation_error")]
    return any("injected" in t for t in texts) or ep.reward_terms.get("reward_infra_failure") == 1.0


def reliability_case(kind: str, rate: float, folder, steps: int = 4, seed: int = 0, eval_tasks: int = 4) -> dict:
    """Train GRPO for ``steps`` steps on ``lookup`` with faults of ``kind`` at ``rate``, then count what the issue's
    reliability table asks: did the run crash, were the episodes the faults broke attributed to infra (and no
    other), were any records lost or duplicated.

    The policy (the tiny random model) is trained for real, but its *generation* replays the scripted expert
    (``agentlab.engines.scripted``, ``run_grpo``'s engine): a random model never calls a tool, and tool and judge
    faults need tool calls to strike. Trainer, loop, retries, rewards and the run folder are the real ones.
    """
    from pathlib import Path

    from agentlab.engines.scripted import scripted_generate_fn
    from agentlab.envs import load, register
    from agentlab.evals import read_rollouts
    from agentlab.rewards import Reward
    from agentlab.rollout import Renderer
    from agentlab.runs import RunDir
    from agentlab.train import Experiment, run_grpo

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    base = load("lookup")
    spec = base
    if kind in ("tool", "reset"):
        spec = register(faulty_spec(base, rate, seed=seed, sites=(kind,), name=f"lookup-faulty-{kind}-{rate:g}"))
    reward = Reward({"success": 1.0, **({"judge": FlakyTerm(rate, seed)} if kind == "judge" else {})})
    tasks = base.make_tasks("train", 8, seed=seed)
    val = base.make_tasks("validation", eval_tasks, seed=seed)
    exp = Experiment(name="reliability", model="tiny-random", env=spec.name, steps=steps, eval_every=2,
                     eval_tasks=eval_tasks, groups_per_step=2, group_size=4, max_turns=3, reward=reward, seed=seed)

    def scripted(model, tok, config, greedy, seed):
        generate = scripted_generate_fn(Renderer(tok, spec.env_class), tasks + val, base.expert)
        return flaky_generate(generate, rate, seed) if kind == "generation" else generate

    run = RunDir(Path(folder))
    crash = None
    INJECTED.clear()
    try:
        run_grpo(exp, tasks, val, run=run, overwrite=True, engine=scripted)
    except Exception as exc:  # noqa: BLE001 — a crash is what this measures
        crash = f"{type(exc).__name__}: {exc}"
    train_eps = read_rollouts(run.rollouts_file)[0] if run.rollouts_file.exists() else []
    eval_eps = [ep for f in sorted((run.path / "evals").glob("*.rollouts.jsonl")) for ep in read_rollouts(f)[0]]
    episodes = train_eps + eval_eps
    keys = [(ep.step, ep.group, ep.sample) for ep in train_eps]
    infra = [ep for ep in episodes if ep.failure == "infra"]
    caused = [ep for ep in episodes if _injected_cause(ep)]
    expected = steps * exp.groups_per_step * exp.group_size + (steps // exp.eval_every + 1) * eval_tasks
    return {"kind": kind, "rate": rate, "faults_injected": sum(INJECTED.values()), "crashed": crash is not None,
            "crash": crash, "episodes": len(episodes),
            "expected_episodes": expected, "lost_records": expected - len(episodes),
            "duplicate_records": len(keys) - len(set(keys)), "infra": len(infra),
            "broken_by_faults": len(caused),
            "attributed_to_infra": sum(ep.failure == "infra" for ep in caused) / len(caused) if caused else None,
            "mislabelled_infra": sum(not _injected_cause(ep) for ep in infra),
            "metrics_lines": sum(1 for _ in open(run.metrics_file)) if run.metrics_file.exists() else 0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="tool,reset,generation,judge")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.3, 0.6])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    rows = []
    cases = [("none", 0.0)] + [(k, r) for k in args.kinds.split(",") for r in args.rates]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, rate) in enumerate(cases):
            t0 = time.time()
            row = reliability_case(kind, rate, Path(tmp) / f"case-{i}", steps=args.steps)
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            print(f"{kind:10s} {rate:4.1f}: injected {row['faults_injected']:3d}, crashed {row['crashed']}, infra "
                  f"{row['infra']}/{row['episodes']}, attributed {row['attributed_to_infra']}, mislabelled "
                  f"{row['mislabelled_infra']}, lost {row['lost_records']}, duplicates {row['duplicate_records']}",
                  flush=True)
    print(f"-> {write_result('reliability.json', {'steps': args.steps, 'retries': 2, 'cases': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
