"""Where agentlab keeps data, caches and runs. Override with ``AGENTLAB_DATA`` / ``AGENTLAB_CACHE``.

Defaults sit in the checkout (``data/`` beside the package) so a learner sees and can delete them; a
non-editable install falls back to ``~/.cache/agentlab``.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
QUICKSTART_RUN = "quickstart"  # the quickstart's run folder under runs_dir(); the next commands find its tasks there


def data_dir() -> Path:
    if env := os.environ.get("AGENTLAB_DATA"):
        return Path(env)
    if (_REPO / "pyproject.toml").exists():
        return _REPO / "data"
    return Path.home() / ".cache" / "agentlab" / "data"


def cache_dir() -> Path:
    """Derived artefacts (dequantised weights, search indexes): safe to delete, rebuilt on demand."""
    if env := os.environ.get("AGENTLAB_CACHE"):
        return Path(env)
    return data_dir() / "cache"


def shown(path: str | Path) -> str:
    """``path`` as printed for a person: relative to the working directory when both lie in the checkout (or the
    path lies under the working directory), so outputs committed from notebooks and logs shared between machines
    carry no machine's absolute paths.

    >>> shown(Path.cwd() / "runs" / "quickstart")
    'runs/quickstart'
    """
    p, cwd = Path(path).absolute(), Path.cwd()
    if p.is_relative_to(cwd) or (p.is_relative_to(_REPO) and cwd.is_relative_to(_REPO)):
        return Path(os.path.relpath(p, cwd)).as_posix()
    return str(path)


def runs_dir() -> Path:
    if env := os.environ.get("AGENTLAB_RUNS"):
        return Path(env)
    return _REPO / "runs" if (_REPO / "pyproject.toml").exists() else Path.cwd() / "runs"
