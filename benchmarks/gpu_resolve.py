"""Does the ``[gpu]`` extra install beside the CPU pins? Asked of pip's resolver, nothing installed.

    python benchmarks/gpu_resolve.py        # ~1-2 min of the package index; writes benchmarks/results/gpu_resolve.json

Two questions, each a ``pip install --dry-run --ignore-installed --report``: (1) the GPU packages alone (vllm,
unsloth, deepspeed) with torch at our pin: which versions pip picks and what those versions demand of
transformers, TRL, torch and PEFT; (2) the project's own ``[gpu]`` extra, i.e. the same with our pins of
transformers and TRL: does it resolve, and if not, what pip said. The GPU path needs a pin set that resolves; this
records where the CPU pins and the GPU packages part.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
GPU = ("vllm", "unsloth", "unsloth-zoo", "deepspeed")
WATCHED = ("torch", "transformers", "trl", "peft", "accelerate")


def dry_run(requirements: list[str]) -> dict:
    """pip's dry-run report for ``requirements`` (``{"ok", "install", "error"}``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                              "--report", str(report), *requirements], capture_output=True, text=True, timeout=900,
                             cwd=ROOT, check=False)
        if out.returncode != 0 or not report.exists():
            lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
            return {"ok": False, "error": lines[-6:]}
        return {"ok": True, "install": json.loads(report.read_text())["install"]}


def main() -> dict:
    from common import write_result

    pins = {m.group(1).lower(): m.group(2) for m in re.finditer(r'"(torch|transformers|trl|peft)==([^"]+)"',
                                                                   (ROOT / "pyproject.toml").read_text())}
    alone = dry_run(["vllm", "unsloth", "deepspeed", f"torch=={pins['torch']}"])
    picked = {}
    if alone["ok"]:
        for item in alone["install"]:
            meta = item["metadata"]
            name = meta["name"].lower().replace("_", "-")
            if name in GPU:
                picked[name] = {"version": meta["version"], "requires": sorted(
                    d for d in meta.get("requires_dist", []) if "extra ==" not in d
                    and re.match(r"(torch|transformers|trl|peft|accelerate)\b", d))}
            elif name in WATCHED:
                picked.setdefault("with", {})[name] = meta["version"]
    extra = dry_run(["-e", ".[gpu]"])
    result = {"our_pins": pins, "gpu_packages_alone": picked if alone["ok"] else alone,
              "gpu_extra_with_our_pins": {"resolves": extra["ok"], **({} if extra["ok"] else {"pip": extra["error"]})}}
    write_result("gpu_resolve.json", result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
