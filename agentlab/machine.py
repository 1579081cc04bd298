"""What machine made a result: a dict for reports, a sentence for notebooks.

A notebook's committed outputs say which machine and settings made them. Typed by hand, that sentence goes stale
the first time someone re-runs the notebook elsewhere; rendered from the running kernel, it is always the truth
about the outputs beneath it:

    from IPython.display import Markdown
    from agentlab.machine import made_on
    Markdown(made_on("the quickstart's run folder, read back"))
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def describe() -> dict:
    """Cores, processor, memory, accelerator, the precision ``"auto"`` resolves to, library versions, commit."""
    import torch
    import transformers
    import trl

    from agentlab.precision import resolve

    try:
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3)
    except (ValueError, OSError, AttributeError):  # not every platform exposes both
        memory_gb = None
    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gb": memory_gb,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_class": cpu_class(), "precision": resolve("auto"),
        "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
        "commit": _commit(),
    }


def session_line(started: str | None = None, **done) -> dict:
    """One line of a run folder's ``sessions.jsonl``: when a session (re)started the run, on what machine (CPU
    class, the precision ``"auto"`` resolved to, commit), and ``done``: what the run had finished before it. A study
    carried across sessions (``agentlab.carry``) may run its parts on different machines; these lines say which ran
    where. The caller appends it with its ``RunDir.append`` (the one JSONL rule; ``runs.py`` shares this line)."""
    m = describe()
    return {"started": started or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **done,
            **{k: m[k] for k in ("cpu_class", "precision", "commit")}}


def cpu_class() -> str:
    """The class of CPU a number was made on, as its speed and arithmetic differ: ``"amx"`` (Intel with AMX tiles,
    bf16), ``"avx512-bf16"`` (AVX-512 with bf16 instructions, no AMX), ``"avx2"`` (fp32 only), else the machine.

    >>> cpu_class() in ("amx", "avx512-bf16", "avx512", "avx2", platform.machine())
    True
    """
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:  # not Linux
        flags = []
    for flag, name in (("amx_tile", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return platform.machine()


def made_on(what: str, settings: str = "") -> str:
    """One markdown sentence: ``what`` was made today on this machine (cores, memory, accelerator, precision),
    with ``settings`` appended. Rendered by the kernel that made the outputs, so it cannot drift from them."""
    m = describe()
    machine = (f"{m['cpus']} CPU cores ({m['processor']}), {m['memory_gb']} GB RAM, "
               f"{'GPU: ' + m['gpu'] if m['gpu'] else 'no GPU'}, precision {m['precision']}")
    commit = f", agentlab commit `{m['commit']}`" if m["commit"] else ""
    return (f"> **Outputs below:** {what}; made {datetime.date.today().isoformat()} on {machine} "
            f"(torch {m['torch']}, transformers {m['transformers']}, TRL {m['trl']}{commit})."
            + (f" {settings}" if settings else ""))


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
