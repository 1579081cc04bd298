"""Run folders: ``runs/<name>/`` holds ``config.json``, ``metrics.jsonl``, ``rollouts.jsonl``, checkpoints, evals.

Runs write files; analysis reads files. Every JSONL file is append-only with one object a line, flushed per
record, so a ``kill -9`` loses at most the line being written; ``read_jsonl`` drops (and counts) a torn last line,
raises on a bad line anywhere else, and ``truncate_after(step)`` drops records newer than the checkpoint a resumed run restarts from, so a resumed
run has no duplicated and no missing lines.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

from agentlab.paths import runs_dir


class RunExistsError(RuntimeError):
    """A finished run would be overwritten."""


def read_jsonl(path: str | Path) -> tuple[list[dict], int]:
    """Parse a JSONL file; return ``(records, n_torn)``.

    The one rule for every JSONL file agentlab writes: a torn *last* line (a kill mid-write) is dropped with a
    warning and counted; a bad line anywhere else means the file is corrupt and raises, naming the file and line.
    """
    import warnings

    path = Path(path)
    if not path.exists():
        return [], 0
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise json.JSONDecodeError("not a JSON object", line, 0)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                warnings.warn(f"{path}:{number}: dropped a torn last line (a kill mid-write)", stacklevel=2)
                return records, 1
            raise ValueError(f"{path}:{number}: not a JSON record ({exc.msg}); the file is corrupt") from None
        records.append(record)
    return records, 0


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _parses(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """``rows`` as a JSONL file, written whole or not at all (a kill leaves the old file or the new one)."""
    _atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


class RunDir:
    """One run folder. ``RunDir("quickstart")`` and ``RunDir("lr-sweep/lr=0.0001")`` live under ``runs_dir()``;
    an absolute path is used as it is."""

    def __init__(self, name_or_path: str | Path, root: str | Path | None = None):
        p = Path(name_or_path)
        self.path = p if p.is_absolute() else Path(root or runs_dir()) / p
        self.name = self.path.name

    @property
    def label(self) -> str:
        """The folder as a learner names it: its path under ``runs_dir()`` (``own-task/guess/grpo``: a comparison's
        ``grpo`` alone says little), else its own name."""
        try:
            return self.path.absolute().relative_to(runs_dir().absolute()).as_posix()
        except ValueError:
            return self.name

    # files
    config_file = property(lambda self: self.path / "config.json")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    rollouts_file = property(lambda self: self.path / "rollouts.jsonl")
    evals_dir = property(lambda self: self.path / "evals")
    done_file = property(lambda self: self.path / "DONE")

    @property
    def finished(self) -> bool:
        return self.done_file.exists()

    def prepare(self, config, overwrite: bool = False, defaults: dict | None = None, write: bool = True) -> None:
        """Create the folder and write ``config.json``; refuse a finished run, or a different config, unless
        ``overwrite``. ``defaults``: a field added to the config since the run started, at its default value,
        does not count as a change (old runs stay resumable); nor does a path recorded absolute before paths were
        stored relative (:meth:`rel`) that names the same place. ``write=False``: check only (the processes of a
        multi-process run that do not write; the main one, writing the same config, cannot change the verdict)."""
        if hasattr(config, "to_config"):
            cfg = config.to_config()
        else:
            cfg = asdict(config) if is_dataclass(config) else dict(config)
        if overwrite and not write:
            return
        if self.path.exists() and overwrite:
            shutil.rmtree(self.path)
        if self.finished:
            raise RunExistsError(f"run {self.path} is finished; pass --overwrite to start it again, or pick "
                                 f"another --name")
        if self.config_file.exists():
            try:
                old = json.loads(self.config_file.read_text())
            except ValueError:
                raise RunExistsError(f"{self.config_file} is not valid JSON (cut by a full disk, or not written by "
                                     f"agentlab); move {self.path} away, or pass --overwrite") from None
            new = json.loads(json.dumps(cfg))
            old.update({k: v for k, v in new.items() if k not in old and k in (defaults or {})
                        and json.loads(json.dumps(defaults[k])) == v})
            old.update({k: v for k, v in new.items() if isinstance(v, str) and isinstance(old.get(k), str)
                        and Path(old[k]).is_absolute() and Path(old[k]) == self.resolve(v).resolve()})
            if old != new:
                changed = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
                raise RunExistsError(f"run {self.path} exists with a different config ({', '.join(changed)}); "
                                     f"resume it with the same settings, or pass --overwrite")
        if not write:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.config_file, json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    def append(self, file: Path, record: dict | str) -> None:
        line = record if isinstance(record, str) else json.dumps(record, sort_keys=True)
        with open(file, "a") as fh:
            fh.write(line.rstrip("\n") + "\n")
            fh.flush()

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_file)[0]

    def evals(self) -> list[dict]:
        """Checkpoint eval summaries (``evals/step-N.json``), by step."""
        return sorted((json.loads(p.read_text()) for p in self.evals_dir.glob("step-*.json")), key=lambda e: e["step"])

    def truncate_after(self, step: int) -> None:
        """Keep only records with ``step <= step`` (and drop torn lines) in metrics and rollouts."""
        for file in (self.metrics_file, self.rollouts_file):
            if not file.exists():
                continue
            records, _ = read_jsonl(file)
            kept = [r for r in records if (r.get("step") or 0) <= step]
            _atomic_write(file, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def mark_finished(self, summary: dict) -> None:
        _atomic_write(self.done_file, json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def write_json(self, relative: str, data: dict) -> Path:
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        return path

    def rel(self, path: str | Path) -> str:
        """``path`` as a run record stores it: relative to this run folder (``..`` where it lies outside), so that
        a moved, copied or shared folder still points at its own files; :meth:`resolve` reads it back."""
        return Path(os.path.relpath(Path(path).absolute(), self.path.absolute())).as_posix()

    def resolve(self, stored: str | Path) -> Path:
        """A path read from this run's records: a relative one lies under this run folder; an absolute one (records
        written before paths were stored relative) is used as it is."""
        p = Path(stored)
        return p if p.is_absolute() else self.path / p

    def read_json(self, relative: str) -> dict | None:
        path = self.path / relative
        return json.loads(path.read_text()) if path.exists() else None

    def checkpoints(self, under: str = "checkpoints") -> list[Path]:
        """Trainer checkpoints in ``under``, oldest first; only complete ones: the Trainer writes
        ``trainer_state.json`` last, so a checkpoint is complete when that file exists and parses (a kill mid-write
        leaves it torn)."""
        root = self.path / under
        found = [p for p in root.glob("checkpoint-*") if _parses(p / "trainer_state.json")]
        return sorted(found, key=checkpoint_step)

    def prune_checkpoints(self, keep, under: str = "checkpoints") -> None:
        """Delete the complete checkpoints in ``under`` older than the newest whose step ``keep(step)`` refuses:
        the newest stays, a resume starts there."""
        for ckpt in self.checkpoints(under)[:-1]:
            if not keep(checkpoint_step(ckpt)):
                shutil.rmtree(ckpt)


def checkpoint_step(checkpoint: str | Path) -> int:
    """The step of a trainer checkpoint folder (``.../checkpoint-12`` -> 12)."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


class StageClock:
    """Wall seconds of a run's stages, in ``seconds.json``, counted over every process that worked on a stage.

    A stage cut short by a kill and finished by a resume took the time of both: while a stage runs, what it has
    spent is saved to ``seconds-open.json`` every ``tick_s`` (a thread: a ``kill -9`` runs no handler, so a kill
    loses at most a tick), and the stage's entry in ``seconds.json``, written when it returns, adds it up.

    A stage timed while another runs (an arm's checkpoint validations inside the arm's stage) is recorded with that
    parent in ``seconds-within.json``: its seconds are already the parent's, and :meth:`total` counts them once.
    """

    def __init__(self, run: RunDir, tick_s: float = 60.0):
        self.run, self.tick_s, self._lock = run, tick_s, threading.Lock()
        self.seconds: dict[str, float] = run.read_json("seconds.json") or {}
        self.open: dict[str, float] = run.read_json("seconds-open.json") or {}
        self.within: dict[str, str] = run.read_json("seconds-within.json") or {}
        self._running: list[str] = []  # the stages now open, outermost first

    def _save_open(self, key: str, spent: float | None) -> None:
        with self._lock:
            if spent is not None:
                self.open[key] = round(spent, 1)
            elif self.open.pop(key, None) is None:
                return  # a stage shorter than a tick, never saved open: nothing to clear
            self.run.write_json("seconds-open.json", self.open)

    def record(self, key: str, seconds: float) -> None:
        """Set ``key``'s seconds (a budget spent piece by piece, such as a sampling loop's), inside the open stage."""
        with self._lock:
            self.seconds[key] = seconds
            self.run.write_json("seconds.json", self.seconds)
            if self._running and self.within.get(key) != self._running[-1]:
                self.within[key] = self._running[-1]
                self.run.write_json("seconds-within.json", self.within)

    def total(self) -> float:
        """The run's wall seconds: every recorded stage once, none counted inside its parent too."""
        return round(sum(v for k, v in self.seconds.items() if k not in self.within), 1)

    def timed(self, key: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``; its seconds (with those of earlier tries that did not finish) recorded under
        ``key`` the first time it returns. A stage already recorded is run (it reads its output back) and not timed."""
        if key in self.seconds:
            return fn(*args, **kwargs)
        before, t0, stop = self.open.get(key, 0.0), time.time(), threading.Event()

        def tick():
            while not stop.wait(self.tick_s):
                self._save_open(key, before + time.time() - t0)

        def halt() -> float:
            """Stop the ticker (so it cannot save after us); the stage's seconds over every try."""
            stop.set()
            ticker.join()
            self._running.pop()
            return before + time.time() - t0

        ticker = threading.Thread(target=tick, name=f"clock:{key}", daemon=True)
        ticker.start()
        self._running.append(key)
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            self._save_open(key, halt())
            raise
        self.record(key, round(halt(), 1))
        self._save_open(key, None)
        return out


HELD_OUT = "held_out:"  # a metric named "held_out:<name>": checkpoint evaluations' <name> (f4, curated, reward, ...)


def held_out(evaluation: dict, metric: str) -> dict | None:
    """A checkpoint evaluation's ``{mean, ci_low, ci_high}`` for ``metric`` (``success``, or ``held_out:<name>``: the
    evaluation's own figure, such as reward, else the environment's metric, such as doc_search's curated-set size);
    None where the evaluation lacks it."""
    name = metric.removeprefix(HELD_OUT)
    value = evaluation.get(name)
    if not (isinstance(value, dict) and "mean" in value):
        value = evaluation.get("env_metrics", {}).get(name)
    return value
