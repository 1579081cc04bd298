"""The two environment descriptions (pyproject.toml for pip, environment.yml for conda) must agree."""

import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _norm(req: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*(.*)$", req.strip()).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_pyproject_and_environment_yml_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_reqs = dict(_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"])
    lines = (ROOT / "environment.yml").read_text().splitlines()
    conda_reqs = dict(
        _norm(line.strip()[2:]) for line in lines
        if line.startswith("      - ") and not line.strip().startswith("- -e")
    )
    assert conda_reqs == pip_reqs


def test_torch_is_pinned_to_the_cpu_build_version():
    # An unpinned torch pulls a multi-GB CUDA build on a CPU machine.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]


def test_ci_runs_exactly_make_test():
    script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert script[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make quickstart" in readme


def test_importing_agentlab_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, agentlab, agentlab.types, agentlab.envs, agentlab.models; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_modules_stay_under_400_lines_except_those_architecture_md_explains():
    package = ROOT / "agentlab"
    over = {p.relative_to(package).as_posix(): n for p in package.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    explained = (ROOT / "ARCHITECTURE.md").read_text()
    assert all(f"`{name.split('/')[-1]}`" in explained or f"`{name}`" in explained for name in over), over
    assert set(over) <= {"trl_compat.py", "envs/doc_search.py"}, f"a new module over 400 lines: {over}"


def _layers() -> dict[str, int]:
    """ARCHITECTURE.md's layer block: unit name (module, or package for `envs/`, `corpora/`, `engines/`) -> line
    rank, the top line highest. Continuation lines (starting with spaces) belong to the line above."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("## The layers", 1)[1].split("```", 2)[1]
    rank, lines = {}, [ln for ln in block.splitlines() if ln.strip() and not ln.startswith(" ")]
    for i, line in enumerate(reversed(lines)):
        for word in line.split("  ")[0].split() + line.split():
            if word[0].isalpha() and (word.endswith(".py") or (word.endswith("/") and (ROOT / "agentlab" / word).is_dir())):
                rank.setdefault(word.removesuffix(".py").removesuffix("/"), i)
    return rank


def _unit(module: str) -> str:
    parts = module.split(".")[1:]
    return parts[0] if parts else "agentlab"


def test_no_import_climbs_a_layer_or_forms_a_circle():
    """Every import inside the package (function-level ones too, where nothing else would see them) goes to a unit
    on a lower line of ARCHITECTURE.md's layer block; imports inside a package stay inside it."""
    import ast

    rank = _layers()
    package = ROOT / "agentlab"
    units = {p.stem if p.parent == package else p.relative_to(package).parts[0] for p in package.rglob("*.py")}
    assert units - {"__init__"} <= set(rank), f"units missing from ARCHITECTURE.md's layers: {units - set(rank)}"
    climbs = []
    for path in package.rglob("*.py"):
        me = path.stem if path.parent == package else path.relative_to(package).parts[0]
        if me == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                other = _unit(name) if name.startswith("agentlab.") else me
                if other != me and other in rank and rank[other] >= rank[me]:
                    climbs.append(f"{path.relative_to(ROOT)}:{node.lineno} {me} -> {other}")
    assert climbs == [], climbs


# Private names of other libraries used outside trl_compat, each with its reason and fallback.
FOREIGN_PRIVATE_ALLOWED = {
    # torch's CPU capability probes (no public API); precision.cpu_has_fast_bf16 falls back to "no bf16" without them
    "agentlab/precision.py": {"_is_amx_tile_supported", "_is_avx512_bf16_supported"},
}


def test_library_internals_are_reached_only_through_trl_compat():
    """A private attribute (``x._name``) that agentlab does not define itself is another library's internal: it is
    read in ``trl_compat.py`` only (its table lists each with a fallback), never in the package or the benchmarks —
    function-level code included (``trainer._metrics`` in a benchmark, ``config._attn_implementation`` in an engine
    were found this way)."""
    import ast

    files = [p for d in ("agentlab", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    trees = {p: ast.parse(p.read_text()) for p in files}
    ours = set()  # names agentlab defines or sets itself (not trl_compat's settings on library objects)
    for path, tree in trees.items():
        if path.name == "trl_compat.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ours.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
            elif isinstance(node, ast.alias):
                ours.add(node.asname or node.name.split(".")[-1])
    found = []
    for path, tree in trees.items():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "agentlab/trl_compat.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and node.attr not in ours and node.attr not in FOREIGN_PRIVATE_ALLOWED.get(rel, ())):
                found.append(f"{rel}:{node.lineno} .{node.attr}")
    assert found == [], found


def test_notebooks_import_only_from_the_api_and_every_api_name_resolves():
    """The tutorial has one door (agentlab.api): a notebook importing from another module, or an api name whose
    home moved, fails here."""
    import importlib
    import json
    import re

    from agentlab import api

    elsewhere = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                elsewhere += [f"{nb.name}: {line.strip()}" for line in "".join(cell["source"]).splitlines()
                              if re.match(r"\s*(from|import) agentlab(?!\.api\b)", line)]
    assert elsewhere == []
    for name, home in api.HOMES.items():
        assert getattr(importlib.import_module(home), name) is getattr(api, name), name
    with pytest.raises(AttributeError, match="agentlab.api has no 'nope'"):
        api.nope  # noqa: B018


def test_every_command_quiets_the_libraries_notices_but_never_ours(monkeypatch):
    """``agentlab`` commands call quiet_libraries before running: a terminal shows transformers' deprecation notices
    as lines carrying site-packages paths, and datasets' tokenising bars once per SFT run (seen in a fresh clone's
    quickstart); a warning agentlab raises still shows."""
    import warnings

    from agentlab import cli
    from agentlab.quiet import LIBRARY_ENV

    for key in LIBRARY_ENV:  # each restored after the test (other tests may run with them unset)
        monkeypatch.delenv(key, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["envs"]) == 0
        warnings.warn_explicit("`x` is deprecated", FutureWarning, "training_args.py", 1, module="transformers.training_args")
        warnings.warn_explicit("a reward term is NaN", UserWarning, "rewards.py", 1, module="agentlab.rewards")
    assert [str(w.message) for w in caught] == ["a reward term is NaN"]
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"


def test_the_notebook_setup_quiets_the_libraries_notices_but_never_ours():
    """setup_notebook hides transformers-style deprecation notices and TRL's experimental warning (they leak the
    maker's site-packages paths into committed outputs) and keeps a warning agentlab raises."""
    import warnings

    from agentlab.api import setup_notebook

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setup_notebook()
        warnings.warn_explicit("`x` is deprecated", FutureWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        warnings.warn_explicit("This API is experimental", UserWarning, "import_utils.py", 1, module="trl.import_utils")
        warnings.warn_explicit("a reward term is NaN", UserWarning, "rewards.py", 1, module="agentlab.rewards")
    assert [str(w.message) for w in caught] == ["a reward term is NaN"]
