"""Where agentlab keeps data, caches and runs. Override with ``AGENTLAB_DATA`` / ``AGENTLAB_CACHE``.

Defaults sit in the checkout (``data/`` beside the package) so a learner sees and can delete them; a
non-editable install falls back to ``~/.cache/agentlab``.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


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


def runs_dir() -> Path:
    if env := os.environ.get("AGENTLAB_RUNS"):
        return Path(env)
    return _REPO / "runs" if (_REPO / "pyproject.toml").exists() else Path.cwd() / "runs"
