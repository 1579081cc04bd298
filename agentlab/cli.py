"""``agentlab`` command line: quickstart, compare, synth, sft, replay, train, sweep, eval, pack, unpack, preflight, envs.

Each subcommand is a thin wrapper over a library call, so everything here can also be done from a notebook:

    agentlab synth --env lookup                       # data/tasks/lookup/{train,validation,test}.jsonl + demos
    agentlab sft --env lookup --name sft-lookup       # runs/sft-lookup/adapter
    agentlab train --env lookup --name grpo-lookup --init-adapter runs/sft-lookup/adapter
    agentlab sweep --name lr-sweep --init-adapter runs/sft-lookup/adapter --lr 5e-5,1e-4,2e-4,5e-4,1e-3
    agentlab eval --env lookup --adapter runs/grpo-lookup/adapter --n 100
    agentlab quickstart                     # compare on lookup in miniature: runs/quickstart/report.{json,png}
    agentlab compare --env product_finder --regime cheap:64   # does GRPO beat tuned SFT, matched SFT and RFT?
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import sys
from pathlib import Path

from agentlab.engines import BACKENDS
from agentlab.paths import shown
from agentlab.pipeline import evaluate, load_split, print_summary, synth, tasks_dir, tasks_of
from agentlab.quiet import quiet_libraries

__all__ = ["build_parser", "evaluate", "load_split", "main", "print_summary", "synth", "tasks_dir"]  # notebooks' names

ENV_HELP = "a shipped or registered name, path/to/file.py:NAME or package.module:NAME (an EnvSpec)"


def resolve_env(a) -> str:
    """``--env`` as a loadable name (a TRL-style class built from ``--tasks`` rows: :func:`pipeline.resolve_env`)."""
    from agentlab.pipeline import resolve_env as resolve

    return resolve(a.env, getattr(a, "tasks_rows", None), getattr(a, "eval_tasks_rows", None),
                   getattr(a, "reward_method", None), getattr(a, "success_threshold", 1.0))


def _add_trl_class_args(p) -> None:
    p.add_argument("--tasks", dest="tasks_rows", default=None, metavar="ROWS.jsonl",
                   help="with --env file.py:Class (TRL-style): one JSON object per line, the keyword arguments of reset")
    p.add_argument("--eval-rows", dest="eval_tasks_rows", default=None, metavar="ROWS.jsonl",
                   help="held-out rows (default: a hash split of --tasks)")
    p.add_argument("--reward-method", default=None, help="the class's reward method (default: reward or get_reward)")
    p.add_argument("--success-threshold", type=float, default=1.0, help="success = reward >= this (default 1.0)")


# -- subcommands ------------------------------------------------------------------------------------------------------


def _cmd_synth(a) -> int:
    a.env = resolve_env(a)
    synth(a.env, {"train": a.train, "validation": a.validation, "test": a.test}, seed=a.seed, demos=a.demos)
    return 0


def _cmd_sft(a) -> int:
    from agentlab.runs import RunDir
    from agentlab.train import SFTSettings, run_sft

    a.env = resolve_env(a)
    from agentlab.envs import load

    if not a.demos.isdigit():  # a user's own demonstrations, rendered for this environment
        from agentlab.demos import load_demos

        demos = load_demos(load(a.env), a.demos)
        adapter = run_sft(a.model, demos, RunDir(a.name).path, SFTSettings(steps=a.steps, lr=a.lr, seed=a.seed))
        print(f"SFT on {len(demos)} demonstrations from {shown(a.demos)} -> {shown(adapter)}")
        return 0
    if load(a.env).expert is None:
        raise ValueError(f"environment {a.env!r} has no scripted expert to write demonstrations: give your own "
                         f"with --demos FILE.jsonl (conversations in TRL's format: agentlab.demos)")
    demos_file = tasks_dir(a.env) / "demos.jsonl"
    if not demos_file.exists():
        raise SystemExit(f"{demos_file} does not exist; run `agentlab synth --env {a.env}` first")
    demos = [json.loads(line) for line in demos_file.read_text().splitlines()][: int(a.demos)]
    system = load(a.env).env_class.system_prompt
    foreign = [d.get("task_id", "?") for d in demos if d["messages"][0].get("content") != system]
    if foreign:
        raise ValueError(f"{demos_file}: {len(foreign)} demonstrations were not written for {a.env!r} (their system "
                         f"prompt differs, e.g. task {foreign[0]}); run `agentlab synth --env {a.env}` again")
    adapter = run_sft(a.model, demos, RunDir(a.name).path, SFTSettings(steps=a.steps, lr=a.lr, seed=a.seed))
    print(f"SFT adapter -> {shown(adapter)}")
    return 0


def _cmd_replay(a) -> int:
    from agentlab.demos import replay
    from agentlab.envs import load
    from agentlab.runs import write_jsonl

    spec = load(resolve_env(a))
    tasks = spec.make_tasks(a.split, a.n)
    rows, failures = replay(spec, tasks, a.column, final=a.final)
    print("".join(f"  not kept: {f['why']}\n" for f in failures[:20]) + ("  ...\n" if len(failures) > 20 else ""), end="")
    if not rows:
        raise ValueError(f"no replay of the {len(tasks)} {a.split} tasks succeeded; nothing written to {a.out}")
    write_jsonl(Path(a.out), rows)
    print(f"{len(rows)} of {len(tasks)} {a.split} tasks replayed into demonstrations -> {shown(a.out)} "
          f"({len(failures)} not kept, listed above); train on them: agentlab sft --env {a.env} --demos {a.out}")
    return 0


def _experiment_from_args(a):
    from agentlab.train import Experiment

    fields = {f.name for f in dataclasses.fields(Experiment)}
    kwargs = {k: v for k, v in vars(a).items() if k in fields and v is not None}
    if "report_to" in kwargs:
        kwargs["report_to"] = tuple(kwargs["report_to"])
    return Experiment(**kwargs)


def _cmd_train(a) -> int:
    from agentlab.train import run_grpo

    overrides, loader = {}, "hf"
    if a.recipe:  # GPU recipe: its fields are defaults, explicit flags still win
        from agentlab.gpu import grpo_overrides, recipe_experiment_fields

        for key, value in recipe_experiment_fields(a.recipe).items():
            if getattr(a, key, None) is None:
                setattr(a, key, value)
        overrides = grpo_overrides(a.recipe, None if a.vllm_mode == "none" else a.vllm_mode)
        loader = "unsloth"
    a.env = resolve_env(a) if a.env else None
    exp = _experiment_from_args(a)  # validated before any work starts
    train_tasks = tasks_of(exp.env, "train")
    eval_tasks = tasks_of(exp.env, a.eval_split)
    run = run_grpo(exp, train_tasks, eval_tasks, init_adapter=a.init_adapter, overwrite=a.overwrite,
                   loader=loader, recipe=a.recipe, trainer_overrides=overrides)
    print(f"GRPO run finished -> {shown(run.path)}")
    return 0


def _cmd_sweep(a) -> int:
    from agentlab.fields import field_type, parse_value
    from agentlab.sweeps import SWEEPABLE, plan, run_sweep
    from agentlab.train import Experiment

    axes, fixed = {}, {}
    for name in SWEEPABLE:
        raw = getattr(a, name)
        if raw is None:
            continue
        values = parse_value(name, raw, field_type(Experiment.__dataclass_fields__[name]), many=True)
        if len(values) == 1:
            fixed[name] = values[0]
        else:
            axes[name] = list(values)
    if not axes:
        raise ValueError("nothing to sweep: give at least one field several values, e.g. --lr 1e-4,2e-4,5e-4")
    for f in ("steps", "eval_every", "eval_tasks", "max_new_tokens", "model", "env"):
        if getattr(a, f) is not None:
            fixed[f] = getattr(a, f)
    seeds = tuple(int(v) for v in a.seeds.split(",") if v.strip()) if a.seeds else ()
    sweep = plan(a.name, Experiment(name=a.name, **fixed), axes, a.mode, seeds)  # every run validated up front
    print(sweep.describe(), flush=True)
    folder = Path(a.tasks) if a.tasks else None
    env = sweep.base.env
    run_sweep(sweep, load_split(env, "train", folder), load_split(env, a.eval_split, folder),
              init_adapter=a.init_adapter)
    print(f"sweep finished -> runs/{a.name}")
    return 0


def _cmd_eval(a) -> int:
    from agentlab.rollout import LoopConfig
    from agentlab.runs import RunDir

    if a.n < 1 or a.samples < 1:
        raise ValueError(f"--n {a.n} and --samples {a.samples} must be >= 1")
    a.env = resolve_env(a)
    tasks = tasks_of(a.env, a.split)[: a.n]
    if not tasks:
        raise ValueError(f"no {a.split} tasks for {a.env}: give more rows, or held-out rows with --eval-rows")
    name = a.name or f"eval-{a.env}-{a.split}"
    from agentlab.envs import load

    loop = LoopConfig.of(load(a.env), max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                         temperature=0 if a.greedy else 0.7, engine=a.rollout_backend)
    summary = evaluate(a.model, a.env, tasks, RunDir(name).path, adapter=a.adapter, samples=a.samples,
                       greedy=a.greedy, loop=loop, label=name)
    print_summary(summary)
    print(f"-> {shown(RunDir(name).path)}")
    return 0


def _cmd_preflight(a) -> int:
    from agentlab.envs import load
    from agentlab.models import load_policy, preflight

    spec = load(a.env)
    model, tok = load_policy(a.model)
    report = preflight(model, tok, spec.env_class, system_prompt=spec.env_class.system_prompt, strict=False)
    print(report)
    return 0 if report.ok else 1


def _cmd_envs(a) -> int:
    from agentlab.envs import load, names
    from agentlab.types import run_policy

    for ref in a.env or names():
        spec = load(resolve_env(argparse.Namespace(**{**vars(a), "env": ref})))  # a TRL-style class takes --tasks
        tasks = spec.make_tasks("test", a.n, seed=0)
        if not tasks:
            raise ValueError(f"no test tasks for {spec.name}: give more rows, or held-out rows with --eval-rows")
        rate = {p: sum(spec.evaluate(t, run_policy(spec, t, policy)[0])["success"] for t in tasks) / len(tasks)
                for p in ("expert", "random_policy") if (policy := getattr(spec, p)) is not None}
        score = {p: f"{rate[p]:.2f}" if p in rate else "- (none)" for p in ("expert", "random_policy")}
        print(f"{spec.name:15s} expert {score['expert']}  random {score['random_policy']}  "
              f"({len(tasks)} test tasks)  {spec.description}")
    return 0


def _cmd_compare(a) -> int:
    from agentlab.compare import CompareConfig, run_compare

    if a.env:
        a.env = resolve_env(a)
    cfg = CompareConfig.from_text(vars(a), smoke=a.smoke)
    arms = tuple(x for x in a.arms.split(",") if x) if a.arms else None  # None: every arm the environment can run
    run_compare(cfg, arms=arms, overwrite=a.overwrite)
    return 0


def _cmd_quickstart(a) -> int:
    from agentlab.quickstart import QuickstartConfig, run_quickstart

    cfg = QuickstartConfig.smoke() if a.smoke else QuickstartConfig()
    run_quickstart(cfg.replace(name=a.name or cfg.name, rollout_backend=a.rollout_backend or cfg.grpo.rollout_backend),
                   overwrite=a.overwrite)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from agentlab.carry import add_commands as add_carry_commands
    from agentlab.sweeps import SWEEPABLE
    from agentlab.train import LOSS_TYPES, SCALE_REWARDS, Experiment

    parser = argparse.ArgumentParser(prog="agentlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("quickstart", help="lookup: base model, SFT chosen on validation, GRPO, SFT for GRPO's seconds; test -> report")
    p.add_argument("--smoke", action="store_true", help="tiny model and sizes (seconds; for CI)")
    p.add_argument("--name", default=None)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--rollout-backend", default=None, choices=BACKENDS,
                   help="decoding engine for rollouts and evaluations (llama_cpp: after make setup-llamacpp; "
                   "auto: the one measured fastest on this machine class)")
    p.set_defaults(func=_cmd_quickstart)

    from agentlab.compare import ARMS, CompareConfig
    from agentlab.fields import flag_type

    p = sub.add_parser("compare", help="does RL beat SFT here? GRPO vs tuned SFT, compute-matched SFT and RFT")
    for name, default in CompareConfig.flat_defaults().items():
        flag = "--" + name.replace("_", "-")
        many = isinstance(default, tuple)  # comma-separated values, parsed by CompareConfig.from_text
        p.add_argument(flag, type=None if many else flag_type(default), default=None,
                       help=f"comma-separated, default {','.join(map(str, default))}" if many else f"default {default}")
    p.add_argument("--arms", default=None, help=f"comma-separated subset of {','.join(ARMS)} (default: every arm the environment can run)")
    _add_trl_class_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny model and sizes (about a minute; for CI)")
    p.add_argument("--overwrite", action="store_true", help="start the comparison's run folder again")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("synth", help="task splits (audited disjoint) and expert demonstrations")
    p.add_argument("--env", default="lookup", help=ENV_HELP)
    p.add_argument("--train", type=int, default=240)
    p.add_argument("--validation", type=int, default=48)
    p.add_argument("--test", type=int, default=120)
    p.add_argument("--demos", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    _add_trl_class_args(p)
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("sft", help="LoRA SFT warm start on expert demonstrations")
    p.add_argument("--env", default="lookup", help=ENV_HELP)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--name", default="sft")
    p.add_argument("--demos", default="48", metavar="N|FILE.jsonl",
                   help="how many of the synthesised expert demonstrations (default 48), or your own file of "
                        "conversations in TRL's format, checked against the environment's tools (agentlab.demos)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    _add_trl_class_args(p)
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("replay", help="demonstrations from ground-truth calls in your task rows, played through "
                                      "the environment and kept where its verifier says success")
    p.add_argument("--env", required=True, help=ENV_HELP)
    p.add_argument("--column", default="calls", help="the row column holding each task's calls (default: calls)")
    p.add_argument("--split", default="train", choices=["train", "validation", "test"])
    p.add_argument("--n", type=int, default=100_000, help="at most this many tasks of the split")
    p.add_argument("--final", default="", help="the closing assistant message where the environment has no final tool")
    p.add_argument("--out", required=True, metavar="DEMOS.jsonl")
    _add_trl_class_args(p)
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("train", help="LoRA GRPO (resumes from the last checkpoint of --name)")
    for f in dataclasses.fields(Experiment):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "report_to":
            p.add_argument(flag, nargs="*", choices=["wandb", "trackio"], default=None)
        elif f.name == "reward":
            p.add_argument(flag, default=None, metavar="SPEC",
                           help="e.g. success, 'f4=1,empty=-0.2,trajectory_recall=0.1', or module:attr / file.py:attr "
                                "(default: the environment's own reward)")
        elif f.name in ("loss_type", "scale_rewards"):
            p.add_argument(flag, default=None, choices=LOSS_TYPES if f.name == "loss_type" else SCALE_REWARDS,
                           help=f"default {f.default} (passed to TRL's GRPOConfig)")
        else:
            p.add_argument(flag, type=flag_type(f.default), default=None, help=f"default {f.default}")
    _add_trl_class_args(p)
    p.add_argument("--init-adapter", default=None, help="start from this LoRA adapter (e.g. the SFT one)")
    p.add_argument("--eval-split", default="validation", choices=["validation", "test"],
                   help="checkpoint evals (default validation: keep the test split for the final, chosen policy)")
    p.add_argument("--recipe", default=None, help="GPU recipe, e.g. qwen3-4b-instruct-2507 (CUDA only)")
    p.add_argument("--vllm-mode", default="colocate", choices=["colocate", "server", "none"])
    p.add_argument("--overwrite", action="store_true", help="replace a finished run of the same name")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("sweep", help="one GRPO run per setting (comma-separated values), as run folders")
    p.add_argument("--name", required=True)
    for f in SWEEPABLE:
        p.add_argument("--" + f.replace("_", "-"), default=None, help="one value, or several separated by commas")
    p.add_argument("--env", default=None, help=ENV_HELP)
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--eval-tasks", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--mode", default="axes", choices=["axes", "grid"], help="one field at a time, or all combinations")
    p.add_argument("--seeds", default=None, help="repeat every setting once per seed, e.g. 0,1,2 (prompt order and "
                                                 "sampling change with the seed)")
    p.add_argument("--init-adapter", default=None)
    p.add_argument("--tasks", default=None, help="folder with train/validation/test.jsonl (default data/tasks/<env>)")
    p.add_argument("--eval-split", default="validation", choices=["validation", "test"])
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("eval", help="evaluate a model (+ adapter) with 95%% bootstrap CIs")
    p.add_argument("--env", default="lookup", help=ENV_HELP)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", default=None)
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--max-turns", type=int, default=None, help="default: the environment's budget")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the environment's budget")
    p.add_argument("--name", default=None)
    p.add_argument("--rollout-backend", default="torch", choices=BACKENDS,
                   help="decoding engine (llama_cpp: after make setup-llamacpp; auto: the one measured fastest here)")
    _add_trl_class_args(p)
    p.set_defaults(func=_cmd_eval)

    add_carry_commands(sub)  # pack, unpack
    p = sub.add_parser("preflight", help="check a model's template, tool calls and loss mask")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="lookup", help=ENV_HELP)
    p.set_defaults(func=_cmd_preflight)

    p = sub.add_parser("envs", help="environments with scripted-expert and random scores")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--env", nargs="*", default=None, help="only these (names, file.py:NAME or module:NAME)")
    _add_trl_class_args(p)
    p.set_defaults(func=_cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    from agentlab.models import ModelLoadError
    from agentlab.runs import RunExistsError
    from agentlab.train import TrainingDiverged

    args = build_parser().parse_args(argv)
    quiet_libraries()  # the libraries' deprecation notices and bars are not the user's business; ours stay
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RunExistsError, ModelLoadError, TrainingDiverged) as exc:  # one clear line
        print(f"agentlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" while writing {exc.filename}" if exc.filename else ""
        print(f"agentlab {args.command}: error: the disk is full{where}; free some space and run the same command "
              f"again (a run resumes from its last complete checkpoint; nothing already written is lost)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
