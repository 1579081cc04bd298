"""Carry a run folder to another machine, or past the end of a working session: what a resume needs, nothing else.

    agentlab pack seed-systems/doc_search/cheap-64/seed-0 --to carried/    # -> carried/seed-systems/doc_search/...
    agentlab unpack carried/                                               # every carried run missing from runs/

A comparison's folder keeps every adapter its searches saved (SmolLM2's LoRA r16: ~20 MB each) and every GRPO
checkpoint with its optimiser state (~60 MB); resuming it needs few of them. :func:`carried` keeps

- every file that is not part of an adapter: configs, records, rollouts, evaluations (a half-done evaluation resumes
  from its rollouts);
- the adapter each stage's ``choice.json`` names (a stage with a choice is done: ``agentlab compare`` reads the
  choice back instead of searching again, ``Comparison.done``);
- in a stage still running, all its adapters; of an unfinished GRPO run's checkpoints the newest whole (optimiser,
  scheduler and RNG state: the resume is exact) and the older ones without their optimiser state (one of them may
  still be chosen on validation);
- of a finished GRPO run, only a checkpoint some choice names, without its optimiser state.

The copy is plain files (no archive): a version-control system stores an adapter that did not change once, however
often the folder is carried. Pack a run that is not running (a checkpoint being written is half a checkpoint).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentlab.runs import RunDir

__all__ = ["add_commands", "carried", "pack", "records", "unpack"]

ADAPTER_CONFIG = "adapter_config.json"
OPTIMISER_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt")  # and rng_state*.pth: what only a resume reads


def _optimiser_state(name: str) -> bool:
    return name in OPTIMISER_STATE or (name.startswith("rng_state") and name.endswith(".pth"))


def _named_adapters(run: Path) -> set[Path]:
    """Adapters the run's choices name (``choice.json`` stores them relative to the comparison's folder, or to its
    own folder in a run that is not a comparison)."""
    named = set()
    for file in run.rglob("choice.json"):
        stored = json.loads(file.read_text()).get("adapter")
        for root in (run, file.parent) if stored else ():
            if (adapter := RunDir(root).resolve(stored) / ADAPTER_CONFIG).exists():
                named.add(adapter.parent.resolve())
    return named


def carried(run: str | Path) -> list[Path]:
    """The files of run folder ``run`` that a resume needs, relative to it, sorted (the rules are the module's)."""
    run = Path(run).resolve()
    if not run.is_dir():
        raise FileNotFoundError(f"no run folder at {run}")
    named = _named_adapters(run)
    # the units a verdict applies to: adapters, and trainer checkpoints (one torn by a kill may lack its adapter)
    units = {p.parent for p in run.rglob(ADAPTER_CONFIG)} | {
        p for p in run.rglob("checkpoint-*") if p.is_dir() and p.parent.name == "checkpoints"}
    # each GRPO run's complete checkpoints, oldest first (RunDir.checkpoints: a torn one is not among them)
    complete = {grpo: RunDir(grpo).checkpoints() for grpo in {u.parent.parent for u in units
                                                              if u.parent.name == "checkpoints"}}

    def verdict(unit: Path) -> str:
        """'all', 'adapter' (without optimiser state) or 'none'."""
        if unit == run:
            return "all"
        stage = run / unit.relative_to(run).parts[0]
        grpo = unit.parent.parent if unit.parent.name == "checkpoints" else None
        if grpo is not None and unit not in complete[grpo]:
            return "none"  # torn by a kill: a resume skips it too
        if grpo is not None and not RunDir(grpo).finished and unit == complete[grpo][-1]:
            return "all"  # the newest checkpoint of an unfinished run: where its resume starts
        if unit in named:
            return "adapter"
        if (stage / "choice.json").exists():
            return "none"  # a finished stage: its choice names the adapter it keeps
        if grpo is not None:
            return "none" if RunDir(grpo).finished else "adapter"
        return "all"

    verdicts = {u: verdict(u) for u in units}
    out = []
    for file in run.rglob("*"):
        if not file.is_file() or "__pycache__" in file.parts:
            continue
        keep = verdicts.get(file.parent, "all")  # a verdict covers a unit's own files, not folders inside it
        if keep == "all" or (keep == "adapter" and not _optimiser_state(file.name)):
            out.append(file.relative_to(run))
    return sorted(out)


def records(run: str | Path) -> list[Path]:
    """Of :func:`carried`, the records only: no adapter, no checkpoint — what reading a finished run back needs (its
    configs, metrics, rollouts and evaluations), not evaluating its policy again. A ~20 MB adapter a run is ~80% of
    a short GRPO run's pack: the seed lessons' runs, which are only read back, travel this way."""
    run = Path(run).resolve()
    if not RunDir(run).finished:
        raise ValueError(f"{run} has not finished: a pack without its checkpoints could not resume it")
    units = {p.parent.relative_to(run) for p in run.rglob(ADAPTER_CONFIG)}
    return [f for f in carried(run) if f.parent not in units and "checkpoints" not in f.parts]


def pack(run: str | Path, to: str | Path, name: str | None = None, records_only: bool = False) -> Path:
    """Copy what a resume of ``run`` needs (:func:`carried`; with ``records_only``, :func:`records`) to
    ``to/<name>`` (default: the run's path under ``runs_dir()``, else its folder name), replacing an earlier pack of
    it whole; the destination folder."""
    from agentlab.paths import runs_dir

    run = RunDir(run).path.resolve()
    if name is None:
        root = runs_dir().resolve()
        name = str(run.relative_to(root)) if run.is_relative_to(root) else run.name
    dest = Path(to) / name
    files = records(run) if records_only else carried(run)
    staging = dest.with_name(dest.name + ".packing")
    shutil.rmtree(staging, ignore_errors=True)
    for rel in files:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / rel, staging / rel)
    (staging / "CARRIED").write_text(json.dumps({"from": name, "files": len(files)}) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)
    return dest


def unpack(carry: str | Path, runs: str | Path | None = None) -> dict[str, str]:
    """Copy every carried run under ``carry`` (folders holding a ``CARRIED`` mark) into ``runs`` (default
    ``runs_dir()``) at the same relative path. A run already there is left as it is — it may be further on than the
    pack — and reported ``"kept"``; the others ``"unpacked"``. Returns ``{name: what happened}``."""
    from agentlab.paths import runs_dir

    carry, runs = Path(carry), Path(runs or runs_dir())
    done = {}
    for mark in sorted(carry.rglob("CARRIED")):
        name = mark.parent.relative_to(carry).as_posix()
        target = runs / name
        if target.exists():
            done[name] = "kept"
            continue
        staging = target.with_name(target.name + ".unpacking")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(mark.parent, staging, ignore=shutil.ignore_patterns("CARRIED"))
        staging.rename(target)
        done[name] = "unpacked"
    return done


def add_commands(sub) -> None:
    """``agentlab pack`` and ``agentlab unpack``, on the command line's subparsers (``agentlab.cli``)."""
    from agentlab.paths import shown

    def pack_command(a) -> int:
        files = [f for f in pack(a.run, a.to, records_only=a.records).rglob("*") if f.is_file() and f.name != "CARRIED"]
        print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB -> {shown(Path(a.to))} "
              f"(agentlab unpack {shown(Path(a.to))} puts it back under runs/)")
        return 0

    def unpack_command(a) -> int:
        done = unpack(a.carry)
        if not done:
            raise FileNotFoundError(f"no packed run under {a.carry} (agentlab pack RUN --to {a.carry} makes one)")
        print("".join(f"{name}: {what}" + (" (a run folder of that name is here already: left as it is)\n"
                                            if what == "kept" else "\n") for name, what in done.items()), end="")
        return 0

    p = sub.add_parser("pack", help="copy what resuming a run needs (records, chosen adapters, last checkpoint) to "
                       "another folder: to carry it to another machine")
    p.add_argument("run", help="a run folder: a name under runs/ or a path")
    p.add_argument("--to", required=True, metavar="DIR", help="the run lands in DIR/<its name under runs/>")
    p.add_argument("--records", action="store_true", help="a finished run's records only (configs, metrics, rollouts, "
                   "evaluations): no adapter or checkpoint, for a run that is read back, never evaluated again")
    p.set_defaults(func=pack_command)
    p = sub.add_parser("unpack", help="put every run packed under a folder back under runs/ (never over a run there)")
    p.add_argument("carry", metavar="DIR")
    p.set_defaults(func=unpack_command)
