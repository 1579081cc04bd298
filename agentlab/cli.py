"""``agentlab`` command line: ``agentlab quickstart | preflight | envs``.

Each subcommand is a thin wrapper over a library call, so everything here can also be done from a notebook.
"""

from __future__ import annotations

import argparse
import sys
import time


def _preflight(args) -> int:
    from agentlab.envs import load
    from agentlab.models import load_policy, preflight

    spec = load(args.env)
    model, tok = load_policy(args.model)
    report = preflight(model, tok, spec.env_class, system_prompt=spec.env_class.system_prompt, strict=False)
    print(report)
    return 0 if report.ok else 1


def _envs(args) -> int:
    from agentlab.envs import load, names
    from agentlab.types import run_policy

    for name in names():
        try:
            spec = load(name)
        except ImportError as exc:
            print(f"{name:16s} unavailable: {exc}")
            continue
        tasks = spec.make_tasks("test", args.n, seed=0)
        expert = sum(spec.evaluate(t, run_policy(spec, t, spec.expert)[0])["success"] for t in tasks) / len(tasks)
        rand = sum(spec.evaluate(t, run_policy(spec, t, spec.random_policy)[0])["success"] for t in tasks) / len(tasks)
        print(f"{name:16s} scripted expert {expert:.2f}   random {rand:.2f}   ({len(tasks)} test tasks)  "
              f"{spec.description}")
    return 0


def _quickstart(args) -> int:
    t0 = time.time()
    print("agentlab quickstart — step 1/2: the shipped model and its tool-calling template")
    rc = _preflight(argparse.Namespace(env=args.env, model="smollm2-135m"))
    print("\nstep 2/2: environments, scripted expert vs random policy")
    rc |= _envs(argparse.Namespace(n=args.n))
    print(f"\nquickstart finished in {time.time() - t0:.0f} s")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("quickstart", help="the CPU quickstart")
    p.add_argument("--env", default="lookup")
    p.add_argument("--n", type=int, default=50)
    p.set_defaults(func=_quickstart)
    p = sub.add_parser("preflight", help="check a model's template, tool calls and loss mask")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="lookup")
    p.set_defaults(func=_preflight)
    p = sub.add_parser("envs", help="list environments with scripted-expert and random scores")
    p.add_argument("--n", type=int, default=50)
    p.set_defaults(func=_envs)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
