"""One call at the top of every notebook, so its committed outputs read the same on any machine and code host.

    from agentlab.api import setup_notebook
    setup_notebook()

What it quiets, and why: transformers' and TRL's deprecation notices (``FutureWarning``) and TRL's
experimental-feature warning say nothing about the lesson and carry the maker's absolute site-packages paths;
the progress bars of transformers' weight loading and of datasets' ``map``/``filter`` are widgets that a code host
shows as "0%| | 0/272"; an SFT run prints one summary line instead of the Trainer's bar (notebook 04 trains a
dozen), and a GRPO run one line instead of the Trainer's table of its loss (``agentlab.progress``). Our own progress
(episodes, GRPO steps) still shows, and every path we print is relative to the repository
(:func:`agentlab.paths.shown`). Warnings raised by agentlab itself are never hidden.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from datetime import date, datetime
from pathlib import Path

from agentlab.quiet import NOTEBOOK_ENV, quiet_libraries


def setup_notebook(seed: int | None = 0) -> None:
    """Quiet the libraries' notices and bars (``agentlab.quiet``; see the module docstring) and seed Python's and
    numpy's generators (``None``: leave them). Safe to call again."""
    quiet_libraries()
    os.environ.setdefault(NOTEBOOK_ENV, "1")  # our bars leave one line each (agentlab.quiet.in_notebook)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        pass
    else:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights: 0/272"
    if seed is not None:
        import numpy as np

        random.seed(seed)
        np.random.seed(seed)


# -- minutes, measured: each notebook's header says how long it took, on which machines ------------------------------

TIMINGS = Path(__file__).resolve().parent.parent / "notebooks" / "timings.json"
SLOW_S = 60.0  # a cell at least this long is named in the header
# the machine classes users meet (agentlab.machine.cpu_class); a header names each, timed or not
CLASSES = ("avx512-bf16", "amx", "avx2", "avx512")


def cell_label(source: str) -> str:
    """How a header names a cell: its first comment (what the cell is for), else its first line that does something
    ("import matplotlib.pyplot as plt" and "t_start = time.time()" name no slow cell)."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    bookkeeping = ("import ", "from ", "t_start = time.time()", "t0 = time.")
    first = next((line for line in lines if line.startswith("# ")), None) or next(
        (line for line in lines if not line.startswith(bookkeeping)), lines[0] if lines else "")
    return first[:80]


def cell_seconds(nb) -> list[tuple[int, float, str]]:
    """``(cell index, seconds, label)`` (:func:`cell_label`) of each executed code cell, from the timing metadata
    the executing client stamps on it (``metadata.execution``: ``iopub.execute_input`` → ``shell.execute_reply``)."""
    out = []
    for index, cell in enumerate(nb.cells):
        stamps = cell.get("metadata", {}).get("execution", {})
        start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
        if cell.cell_type != "code" or not (start and end):
            continue
        seconds = (datetime.fromisoformat(end) -
                   datetime.fromisoformat(start)).total_seconds()
        out.append((index, round(seconds, 1), cell_label(cell.source)))
    return out


# A run under this share of the recorded minutes read earlier runs' folders back: not a new whole-run time.
READ_BACK_SHARE = 0.5
# A notebook whose long cells are opt-in (06, 10: ``AGENTLAB_FULL=1``) records a run of the larger size apart from
# its default's: under "<class> with AGENTLAB_FULL=1", so the header does not pass one size's minutes for the other's.
FULL_RUN = " with AGENTLAB_FULL=1"


def record_timings(path: str | Path, machine: str | None = None, timings: str | Path | None = None,
                   fresh: bool | None = None) -> dict:
    """Write an executed notebook's minutes and slow cells into ``timings`` under its machine class (default: this
    machine's, ``agentlab.machine.cpu_class``; with ``AGENTLAB_FULL=1`` set, as the kernel that ran it had it:
    ``FULL_RUN`` appended); return the entry.

    Notebooks read finished run folders back instead of redoing them, so a second run may take a minute where the
    first took twenty. Such a run (``fresh=False``; ``None``: under ``READ_BACK_SHARE`` of the recorded minutes)
    keeps the recorded whole-run entry and adds its own minutes to it as ``read_back_minutes``: the header says
    both. A declared read-back with no whole-run entry records nothing (its minutes would pass for a whole run's)."""
    import nbformat

    from agentlab.machine import cpu_class, describe

    path, timings = Path(path), Path(timings or TIMINGS)
    cells = cell_seconds(nbformat.read(path, as_version=4))
    if not cells:
        raise ValueError(f"{path} carries no execution timing: execute it first (nbclient records it)")
    entry = {"minutes": round(sum(s for _, s, _ in cells) / 60, 1),
             "slow": [[i, s, line] for i, s, line in cells if s >= SLOW_S],
             "date": date.today().isoformat(), "commit": describe().get("commit")}
    table = json.loads(timings.read_text()) if timings.exists() else {}
    row, cls = table.setdefault(path.stem, {}), (machine or cpu_class()) + (
        FULL_RUN if os.environ.get("AGENTLAB_FULL") == "1" else "")
    recorded = row.get(cls)
    if fresh is None:
        fresh = recorded is None or entry["minutes"] >= READ_BACK_SHARE * recorded["minutes"]
    if fresh:
        row[cls] = entry
    elif recorded is not None:  # the whole run's slow cells (the header names them as the notebook does now)
        entry = row[cls] = {**recorded, "read_back_minutes": entry["minutes"], "read_back_date": entry["date"]}
    timings.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return entry


def _minutes(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes >= 1 else "under a minute"


class _Markdown(str):
    """Markdown a notebook cell displays as such (and a string everywhere else)."""

    def _repr_markdown_(self) -> str:
        return str(self)


def _labels(path: Path) -> dict[int, str]:
    import nbformat

    if not path.exists():
        return {}
    return {i: cell_label(c.source) for i, c in enumerate(nbformat.read(path, as_version=4).cells)
            if c.cell_type == "code"}


FP32_CLASSES = ("avx2", "avx512")  # no bf16 instructions: fp32, several times the bf16 classes' minutes


def _untimed(untimed: list[str], timed: list[str]) -> str:
    """The classes a notebook was not timed on, each with what to expect there: the fp32 classes (avx2, avx512) run
    several times longer than the bf16 ones, and about as long as each other (``benchmarks/results/
    quickstart_avx2.json`` and ``_avx512.json``: 38 and 39 minutes of stages)."""
    bf16 = [cls for cls in untimed if cls not in FP32_CLASSES]
    fp32 = [cls for cls in untimed if cls in FP32_CLASSES]
    if not any(cls in FP32_CLASSES for cls in timed):  # timed in bf16 only
        return ", ".join(bf16 + ([", ".join(fp32) + " (expect several times longer there, in fp32)"] if fp32 else []))
    shorter = " (expect several times shorter there, in bf16)" if all(cls in FP32_CLASSES for cls in timed) else ""
    return ", ".join(([", ".join(bf16) + shorter] if bf16 else [])
                     + ([", ".join(fp32) + " (fp32 too: expect about as long)"] if fp32 else []))


def notebook_header(stem: str, reads: str = "", timings: str | Path | None = None) -> str:
    """The line under a notebook's title: its minutes on each machine class it was timed on (and the classes it was
    not), its slow cells, and what it reads from earlier notebooks. Rendered from ``timings`` (written by
    ``record_timings`` after a real execution), never typed."""
    timings = Path(timings or TIMINGS)
    table = json.loads(timings.read_text()).get(stem, {}) if timings.exists() else {}
    runs = sorted(table.items(), key=lambda kv: (kv[0].endswith(FULL_RUN), kv[0]))  # the default size's first
    timed = [f"**{_minutes(e['minutes'])}** on {cls} ({e['date']})"
             + (f", {_minutes(e['read_back_minutes'])} when its run folders are read back" if "read_back_minutes" in e
                else "") for cls, e in runs]
    default = [cls for cls, _ in runs if not cls.endswith(FULL_RUN)]  # the classes that ran the default size
    untimed = [cls for cls in CLASSES if cls not in default]
    parts = ["> **Time, measured:** " + ("; ".join(timed) if timed else "not timed yet")
             + (f"; not timed on {_untimed(untimed, default)}" if untimed and timed else "")
             + " — 2 cores, a whole top-to-bottom run."]
    slow, labels = {}, _labels(timings.parent / f"{stem}.ipynb")  # cells as the notebook names them now
    for cls, e in runs:
        for index, seconds, line in e["slow"]:
            line = labels.get(index, line)
            slow.setdefault((index, line), []).append(f"{_minutes(seconds / 60)} on {cls}")
    if slow:
        parts.append("Slow cells: " + "; ".join(f"[{i}] `{line}` ({', '.join(v)})" for (i, line), v in
                                               sorted(slow.items())) + ".")
    if reads:
        parts.append(f"Reads: {reads}.")
    return _Markdown(" ".join(parts))


_BAR = re.compile(r"\d+%\|")  # tqdm's text form: "episodes:   0%|          | 0/96"


def drop_progress_widgets(nb) -> int:
    """Remove the progress-bar widgets from executed outputs; returns how many. A saved widget keeps only its first
    frame as text ("0%| | 0/96" on a code host); our bars print their one-line summary beside it
    (``rollout._progress``). Other widgets (sliders, pickers) stay."""
    dropped = 0
    for cell in (c for c in nb.cells if "outputs" in c):
        keep = [o for o in cell.outputs if not ("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                                                and _BAR.search(str(o["data"].get("text/plain", ""))))]
        dropped += len(cell.outputs) - len(keep)
        cell.outputs = keep
    return dropped


def notebook_client(nb, folder: Path, timeout: int, **options):
    """nbclient's ``NotebookClient`` for ``nb``, run from ``folder`` (``options``: its other settings and hooks),
    that waits for each cell's reply in one-second polls up to ``timeout`` instead of one poll of it: after a cell
    that opens widgets (notebook 08's rollout explorer) the reply sometimes came only when that one poll ran out —
    600 s of the smoke tests' 600, the kernel idle all along (nbclient issue #312, open upstream)."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, resources={"metadata": {"path": str(folder)}}, **options)
    client.on_notebook_start = lambda **_: _poll_in_slices(client.kc.shell_channel)
    return client


def _poll_in_slices(channel, every: float = 1.0) -> None:
    """Replace an async kernel channel's ``get_msg(timeout)`` with polls of at most ``every`` seconds up to the same
    deadline (``Empty`` once it passes, as before)."""
    from queue import Empty

    get = channel.get_msg

    async def get_msg(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = every if deadline is None else min(every, max(0.0, deadline - time.monotonic()))
            try:
                return await get(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg


def execute(path: str | Path, timeout: int = 3600, fresh: bool | None = None) -> dict:
    """Run a notebook top to bottom in place (from its own folder), record its minutes (:func:`record_timings`), and
    render its header cell again from them, so the header states the run it sits on. Returns the timing entry.

        python -m agentlab.notebook notebooks/00_quickstart.ipynb ...      # make notebooks NB="00 01"
        python -m agentlab.notebook --read-back notebooks/08_*.ipynb       # make notebooks NB=08 READ_BACK=1

    ``fresh``: as :func:`record_timings` (``False``, ``--read-back``: the run read earlier run folders back, so its
    minutes are recorded beside the whole-run ones, not instead of them).
    """
    import nbformat

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    notebook_client(nb, path.parent, timeout, record_timing=True).execute()
    drop_progress_widgets(nb)
    nbformat.write(nb, path)
    entry = record_timings(path, fresh=fresh)
    render_header(path)
    return entry


def render_header(path: str | Path) -> None:
    """Render a notebook's header cell's output again from ``notebooks/timings.json`` (``execute`` does it after a
    run; a change to how headers read needs only this)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if (text := header_text(cell)) is not None:
            cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/markdown": text, "text/plain": text},
                                                   execution_count=cell.execution_count)]
    nbformat.write(nb, path)


def header_text(cell) -> str | None:
    """What a notebook's header cell renders to now (``None``: not the header cell)."""
    import ast

    if cell.cell_type != "code" or "notebook_header(" not in cell.source:
        return None
    call = ast.parse(cell.source).body[-1].value  # notebook_header("<stem>", reads="…"): literal arguments
    return notebook_header(*map(ast.literal_eval, call.args), **{k.arg: ast.literal_eval(k.value) for k in call.keywords})


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    read_back = "--read-back" in args
    for arg in [a for a in args if a != "--read-back"]:
        print(arg, execute(arg, fresh=False if read_back else None), flush=True)
