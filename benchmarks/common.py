"""Shared by the benchmark scripts: which SFT adapter to start from, the greedy-eval setup, writing results."""

from __future__ import annotations

import json
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
# Run folders of studies longer than a working session, packed (`agentlab pack NAME --to benchmarks/carry`) so that
# the next session, on another machine, resumes them: runs/ is not committed, this folder is. A study's script
# unpacks them first (carry_in); a finished study's pack is deleted (its results are in RESULTS).
CARRY = Path(__file__).parent / "carry"


def carry_in() -> None:
    """Unpack every carried run folder that runs/ lacks (agentlab.carry.unpack), saying which."""
    from agentlab.carry import unpack

    for name, what in (unpack(CARRY) if CARRY.exists() else {}).items():
        if what == "unpacked":
            print(f"[{name}] carried in from {CARRY.name}/: resuming where the last session packed it", flush=True)


def adapter_or_quickstart(adapter: str | None) -> str | None:
    """``adapter`` if given, else the quickstart's SFT adapter when ``make quickstart`` has made it (the base model
    never calls a tool, so without an adapter every episode ends after one turn and measures little)."""
    if adapter:
        return adapter
    from agentlab.paths import runs_dir

    found = runs_dir() / "quickstart" / "sft" / "adapter"
    if (found / "adapter_config.json").exists():
        print(f"[benchmarks] starting from the quickstart's SFT adapter: {found}", flush=True)
        return str(found)
    print("[benchmarks] no --adapter and no runs/quickstart/sft/adapter: the base model (one-turn episodes)", flush=True)
    return None


def add_greedy_eval_args(parser, n: int, max_new_tokens: int) -> None:
    """The options of a greedy held-out run: environment, adapter, number of tasks, turn and token budgets."""
    parser.add_argument("--env", default="lookup")
    parser.add_argument("--adapter", default=None, help="SFT adapter (default: the quickstart's)")
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--max-context", type=int, default=None, help="context budget (default: the loop's)")


def greedy_eval_setup(args, split: str):
    """``(spec, tasks, model, tokenizer)`` for ``args`` from ``add_greedy_eval_args`` (adapter resolved in place)."""
    from agentlab.envs import load
    from agentlab.models import load_policy
    from agentlab.train import _threads

    args.adapter = adapter_or_quickstart(args.adapter)
    _threads()
    spec = load(args.env)
    model, tok = load_policy("smollm2-135m", adapter=args.adapter)
    return spec, spec.make_tasks(split, args.n, seed=0), model, tok


def timed_greedy(model, tok, spec, tasks, args, batch_size: int, precision: str = "auto", backend: str = "torch",
                 engine=None):
    """Greedy episodes of ``tasks`` with ``args``' budgets, as ``agentlab eval`` runs them: ``(episodes, seconds)``.
    ``engine(model, tok, config, greedy, seed)``: the ``GenerateFn`` factory (default: ``backend``'s)."""
    from agentlab.rollout import LoopConfig, run_episodes

    context = {"max_context": args.max_context} if getattr(args, "max_context", None) else {}
    cfg = LoopConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, temperature=0,
                     batch_size=batch_size, precision=precision, engine=backend, **context)
    t0 = time.perf_counter()
    generate = engine(model, tok, cfg, True, 0) if engine else None
    episodes = run_episodes(model, tok, spec, tasks, config=cfg, greedy=True, progress=False, generate_fn=generate)
    return episodes, time.perf_counter() - t0


def scripted_policies(spec) -> dict:
    """An environment's scripted strategies by name, in a study table's order — the expert, the cheap policy, its
    named strategies, the random floor — leaving out those it lacks: the calibration rows."""
    named = {"expert": spec.expert, "cheap": spec.cheap_policy, **spec.strategies, "random": spec.random_policy}
    return {name: policy for name, policy in named.items() if policy is not None}


def write_result(name: str, data: dict) -> Path:
    """Write ``benchmarks/results/<name>`` (JSON, indented) and return its path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2))
    return path
