"""``engine="auto"``: the decoding engine measured fastest on this class of machine.

    from agentlab.engines.choice import choose
    choose("auto")   # {"engine": "torch", "machine": "avx512-bf16/bf16", "seconds": {...}, "why": "..."}

Which engine is faster depends on the CPU, not on the code: 200 greedy ``lookup`` test episodes took 103 s with
torch and 105 s with llama.cpp on an AVX-512 EPYC in bf16, but 211 s against 141 s on the same machine in fp32 (and
54.5 s against 156.5 s on an Intel Xeon with AMX in an earlier session). On AVX2-only EPYCs (fp32) llama.cpp was faster
on both hosts measured, by a margin that moves with the host: 221.6 s against 201.0 s in `engine_agreement.json`, 406 s against 260 s on an earlier host.
On an Intel Xeon with AVX-512 but no bf16 instructions (class ``avx512``, so fp32) llama.cpp too: 224.5 s against
196.7 s.
``MEASURED`` holds what ``benchmarks/engine_agreement.py`` measured per machine class and precision (a test holds it
to ``benchmarks/results/engine_agreement.json``; run that script on a new class of machine and copy its seconds
here). llama.cpp is chosen only where it is installed and measured faster by more than ``MARGIN``: torch is the
reference engine (every other engine states its agreement with it), so a tie goes to it. A class never measured
decodes with torch, and the choice says how to measure it.
"""

from __future__ import annotations

MARGIN = 1.1  # llama.cpp must take less than 1/MARGIN of torch's seconds

# machine class / resolved precision -> seconds for 200 greedy lookup test episodes, per engine
MEASURED = {
    "avx512-bf16/bf16": {"torch": 103.0, "llama_cpp": 104.9},
    "avx512-bf16/fp32": {"torch": 210.8, "llama_cpp": 141.0},
    "avx2/fp32": {"torch": 221.6, "llama_cpp": 201.0},
    "avx512/fp32": {"torch": 224.5, "llama_cpp": 196.7},
}


def choose(precision: str = "auto", available: bool | None = None) -> dict:
    """The engine for this machine at ``precision`` (``"auto"`` resolved as decoding resolves it), with its reason:
    ``{"engine", "machine", "seconds" (or None), "why"}``. ``available``: whether llama.cpp is installed (default:
    checked)."""
    from agentlab.machine import cpu_class
    from agentlab.precision import resolve

    machine = f"{cpu_class()}/{resolve(precision)}"
    seconds = MEASURED.get(machine)
    if available is None:
        from agentlab.engines.llamacpp import available as installed

        available = installed()
    if seconds is None:
        why = (f"{machine} was never measured: torch, the reference engine (python benchmarks/engine_agreement.py "
               f"measures both engines here)")
        return {"engine": "torch", "machine": machine, "seconds": None, "why": why}
    faster = seconds["torch"] > MARGIN * seconds["llama_cpp"]
    if faster and not available:
        why = (f"llama.cpp measured faster on {machine} ({seconds['llama_cpp']:g} s vs {seconds['torch']:g} s) but "
               f"llama-cpp-python is not installed (make setup-llamacpp): torch")
        return {"engine": "torch", "machine": machine, "seconds": seconds, "why": why}
    engine = "llama_cpp" if faster else "torch"
    why = (f"measured on {machine}: torch {seconds['torch']:g} s, llama.cpp {seconds['llama_cpp']:g} s for 200 "
           f"greedy lookup episodes")
    return {"engine": engine, "machine": machine, "seconds": seconds, "why": why}
