"""References to Python objects by text, as the command line takes them: ``package.module:NAME`` or
``path/to/file.py:NAME`` (an environment's ``EnvSpec``, a reward function).

    >>> import_object("agentlab.rewards:success").__name__
    'success'
"""

from __future__ import annotations


def import_object(target: str):
    """``module:attr`` or ``file.py:attr`` -> the object; one clear error naming what failed."""
    import importlib
    import importlib.util
    from pathlib import Path

    module_name, _, attr = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.exists():
                raise ValueError(f"{target!r}: file {path} does not exist")
            import hashlib
            import sys

            # a unique module name per file, registered before it runs (dataclasses and pickling look it up)
            name = f"agentlab_ref_{path.stem}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
            loaded = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loaded)
            sys.modules[name] = module
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 — an import that fails is bad input: say which and why
        raise ValueError(f"{target!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    if not hasattr(module, attr):
        raise ValueError(f"{target!r}: {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)
