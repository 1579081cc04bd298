"""Shared by the benchmark scripts: which SFT adapter to start from."""

from __future__ import annotations


def adapter_or_quickstart(adapter: str | None) -> str | None:
    """``adapter`` if given, else the quickstart's SFT adapter when ``make quickstart`` has made it (the base model
    never calls a tool, so without an adapter every episode ends after one turn and measures little)."""
    if adapter:
        return adapter
    from agentlab.paths import runs_dir

    found = runs_dir() / "quickstart" / "sft" / "adapter"
    if (found / "adapter_config.json").exists():
        print(f"[benchmarks] starting from the quickstart's SFT adapter: {found}", flush=True)
        return str(found)
    print("[benchmarks] no --adapter and no runs/quickstart/sft/adapter: the base model (one-turn episodes)", flush=True)
    return None
