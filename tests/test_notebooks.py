"""Every tutorial notebook runs top to bottom in smoke mode (AGENTLAB_SMOKE=1: tiny model, tiny sizes)."""

import time
import warnings
from pathlib import Path

import nbformat
import pytest

from agentlab.notebook import notebook_client

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTLAB_SMOKE", "1")
    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), "needs a parameters cell"
    started, slow = {}, []

    def start(cell, cell_index, **_):
        started[cell_index] = time.perf_counter()

    def done(cell, cell_index, **_):
        if (seconds := time.perf_counter() - started[cell_index]) > 60:
            slow.append(f"cell {cell_index}: {seconds:.0f} s")

    # Once in a while a smoke run that takes seconds alone sat for minutes in the full suite: the kernel writes its
    # threads' stacks every 120 s a cell runs, so a slow run says where it waited (the cell is taken out again).
    stacks = tmp_path / "kernel-stacks.txt"
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        f"import faulthandler\nfaulthandler.dump_traceback_later(120, repeat=True, file=open({str(stacks)!r}, 'w'))"))
    t0 = time.perf_counter()
    notebook_client(nb, path.parent, 600, kernel_name="python3", on_cell_start=start, on_cell_executed=done).execute()
    nb.cells.pop(0)
    if time.perf_counter() - t0 > 120:  # a smoke run takes seconds; say where a slow one spent its time
        where = stacks.read_text()[-4000:] if stacks.exists() else ""
        warnings.warn(f"{path.name} took {time.perf_counter() - t0:.0f} s in smoke mode; slow cells (counting the "
                      f"stack-dump cell as 0): {slow or 'none'}\n{where}", stacklevel=1)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
