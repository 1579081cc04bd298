"""Each notebook's header states its minutes from a real execution, per machine class (agentlab.notebook)."""

import json
from pathlib import Path

import nbformat

from agentlab.notebook import SLOW_S, cell_seconds, execute, notebook_header, record_timings


def _executed(tmp_path, seconds: list[float]):
    nb = nbformat.v4.new_notebook()
    for i, s in enumerate(seconds):
        cell = nbformat.v4.new_code_cell(f"# cell {i}\nx = {i}")
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-03T10:00:00.000000Z",
                                      "shell.execute_reply": f"2026-12-03T10:{int(s // 60):02d}:{s % 60:06.3f}Z"}
        nb.cells.append(cell)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# title"))
    path = tmp_path / "07_demo.ipynb"
    nbformat.write(nb, path)
    return path


def test_minutes_and_slow_cells_come_from_the_execution_stamps(tmp_path):
    path = _executed(tmp_path, [2.5, SLOW_S + 30, 10.0])
    assert [s for _, s, _ in cell_seconds(nbformat.read(path, as_version=4))] == [2.5, SLOW_S + 30, 10.0]
    timings = tmp_path / "timings.json"
    entry = record_timings(path, machine="avx512-bf16", timings=timings)
    assert entry["minutes"] == round((2.5 + SLOW_S + 30 + 10) / 60, 1) and [c[0] for c in entry["slow"]] == [2]
    record_timings(_executed(tmp_path, [600.0]), machine="amx", timings=timings)  # the same notebook, another class
    assert set(json.loads(timings.read_text())["07_demo"]) == {"avx512-bf16", "amx"}
    header = notebook_header("07_demo", reads="runs/quickstart/", timings=timings)
    assert "on amx" in header and "on avx512-bf16" in header
    assert "not timed on avx2, avx512 (expect several times longer there, in fp32)" in header, header
    assert "[1] `# cell 0`" in header and "Reads: runs/quickstart/." in header  # the amx run's one slow cell
    assert "not timed yet —" in notebook_header("99_none", timings=timings)  # not "not timed yet; not timed on …"
    record_timings(_executed(tmp_path, [600.0]), machine="avx2", timings=tmp_path / "avx2.json")
    only_avx2 = notebook_header("07_demo", timings=tmp_path / "avx2.json")
    assert "not timed on avx512-bf16, amx (expect several times shorter there" in only_avx2, only_avx2
    record_timings(_executed(tmp_path, [600.0]), machine="avx512", timings=tmp_path / "avx2.json")  # fp32 too
    assert "not timed on avx512-bf16, amx (expect several times shorter there" in notebook_header(
        "07_demo", timings=tmp_path / "avx2.json")
    record_timings(_executed(tmp_path, [600.0]), machine="amx", timings=tmp_path / "avx2.json")
    assert "not timed on avx512-bf16 —" in notebook_header("07_demo", timings=tmp_path / "avx2.json")  # amx says it
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "import time\nfrom math import pi\ntime.sleep(pi)"
    assert cell_seconds(nb)[0][2] == "time.sleep(pi)"  # named by what it does, not by its imports
    nb.cells[1].source = "import time\nt_start = time.time()\nx = 1\n# evaluate every checkpoint\ny = 2"
    assert cell_seconds(nb)[0][2] == "# evaluate every checkpoint"  # a comment says what the cell is for
    nbformat.write(nb, path)  # the header names a recorded slow cell as the notebook beside it names it now
    assert "[1] `# evaluate every checkpoint`" in notebook_header("07_demo", timings=tmp_path / "timings.json")


def test_a_run_that_reads_finished_folders_back_keeps_the_whole_run_time(tmp_path):
    timings = tmp_path / "timings.json"
    record_timings(_executed(tmp_path, [1080.0]), machine="amx", timings=timings)           # 18 min from scratch
    entry = record_timings(_executed(tmp_path, [40.0]), machine="amx", timings=timings)     # read back: 0.7 min
    assert entry["minutes"] == 18.0 and entry["read_back_minutes"] == 0.7
    assert json.loads(timings.read_text())["07_demo"]["amx"] == entry and entry["slow"][0][1] == 1080.0
    renamed = nbformat.read(path := _executed(tmp_path, [40.0]), as_version=4)
    renamed.cells[1].source = "import time\ntime.sleep(1)"
    nbformat.write(renamed, path)
    record_timings(path, machine="amx", timings=timings)
    header = notebook_header("07_demo", timings=timings)
    assert "[1] `time.sleep(1)` (18 min on amx)" in header  # the whole run's slow cell, named as the cell reads now
    assert "**18 min** on amx" in header and "under a minute when its run folders are read back" in header
    record_timings(_executed(tmp_path, [700.0]), machine="amx", timings=timings, fresh=False)  # declared read-back
    assert json.loads(timings.read_text())["07_demo"]["amx"]["minutes"] == 18.0
    record_timings(_executed(tmp_path, [700.0]), machine="amx", timings=timings)  # over half the recorded: whole
    assert json.loads(timings.read_text())["07_demo"]["amx"]["minutes"] == 11.7
    record_timings(_executed(tmp_path, [40.0]), machine="avx2", timings=timings, fresh=False)  # nothing to keep
    assert "avx2" not in json.loads(timings.read_text())["07_demo"]
    record_timings(_executed(tmp_path, [60.0]), machine="amx", timings=timings, fresh=True)  # said to be whole
    assert json.loads(timings.read_text())["07_demo"]["amx"]["minutes"] == 1.0


def test_execute_runs_the_notebook_and_renders_its_header_from_that_run(tmp_path, monkeypatch):
    from agentlab import notebook

    timings = tmp_path / "timings.json"
    monkeypatch.setattr(notebook, "TIMINGS", timings)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 07 · demo"),
                nbformat.v4.new_code_cell("from agentlab.notebook import notebook_header\n"
                                          f"notebook_header('07_demo', reads='nothing', timings={str(timings)!r})"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(1.2)\nprint('done')")]
    path = tmp_path / "07_demo.ipynb"
    nbformat.write(nb, path)
    entry = execute(path, timeout=120)
    ran = nbformat.read(path, as_version=4)
    assert ran.cells[2].outputs[0]["text"] == "done\n" and entry["minutes"] >= 0.0
    header = ran.cells[1].outputs[0]["data"]["text/markdown"]
    assert header == notebook_header("07_demo", reads="nothing", timings=timings) and "not timed yet" not in header


def test_each_committed_header_says_what_the_timings_render():
    """A header is rendered from ``notebooks/timings.json`` and the notebook's cells; one left stale (a class timed
    since, a slow cell renamed) would state minutes or cells the file no longer does."""
    from agentlab.notebook import header_text

    notebooks = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9]*.ipynb"))
    checked = 0
    for path in notebooks:
        header = next(c for c in nbformat.read(path, as_version=4).cells if header_text(c) is not None)
        if not header.outputs:  # not executed yet: nothing stated
            continue
        assert header.outputs[0]["data"]["text/plain"] == header_text(header), path.name
        checked += 1
    assert checked >= len(notebooks) - 1


def test_a_full_size_run_is_recorded_apart_from_the_default_size(tmp_path, monkeypatch):
    """Notebooks 06 and 10 run a reduced size unless ``AGENTLAB_FULL=1``: the larger run's minutes must not stand for
    the default's on that class, nor the default's be replaced by them."""
    timings = tmp_path / "timings.json"
    record_timings(_executed(tmp_path, [600.0]), machine="avx512", timings=timings)          # the default: 10 min
    monkeypatch.setenv("AGENTLAB_FULL", "1")
    record_timings(_executed(tmp_path, [1800.0]), machine="amx", timings=timings)            # the larger run: 30 min
    assert set(json.loads(timings.read_text())["07_demo"]) == {"avx512", "amx with AGENTLAB_FULL=1"}
    header = notebook_header("07_demo", timings=timings)
    assert header.index("**10 min** on avx512") < header.index("**30 min** on amx with AGENTLAB_FULL=1"), header
    # bf16 several times shorter than the avx512 run; avx2 about as long (fp32 both)
    assert ("not timed on avx512-bf16, amx (expect several times shorter there, in bf16), avx2 (fp32 too: expect "
            "about as long)") in header, header
    assert "[1] `# cell 0` (10 min on avx512, 30 min on amx with AGENTLAB_FULL=1)" in header  # which run, each
    monkeypatch.delenv("AGENTLAB_FULL")
    record_timings(_executed(tmp_path, [120.0]), machine="amx", timings=timings, fresh=True)
    assert json.loads(timings.read_text())["07_demo"]["amx with AGENTLAB_FULL=1"]["minutes"] == 30.0
