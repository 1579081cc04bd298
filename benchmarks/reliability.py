"""Reliability under faults: a short GRPO run per fault kind and rate; crashes, attribution, lost records.

    python benchmarks/reliability.py                      # kinds tool, reset, generation, judge x rates 0.1 0.3 0.6
    python benchmarks/reliability.py --rates 0.3 --steps 2

Each case is ``agentlab.faults.reliability_case``: GRPO on ``lookup`` (tiny model trained for real; its generation
replays the scripted expert so that tools are called), faults injected at the given rate into tool calls, episode
resets, generation or an LLM-judge reward term, each retried twice with backoff by the loop. Counted per case:
``crashed`` (goal: never), ``attributed_to_infra`` (share of the episodes an injected fault broke after its retries
that were recorded as infra; goal 1.0), ``mislabelled_infra`` (infra episodes without an injected cause; goal 0),
``lost_records`` and ``duplicate_records`` (goal 0). Writes ``benchmarks/results/reliability.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result

from agentlab.faults import reliability_case


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="tool,reset,generation,judge")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.3, 0.6])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    rows = []
    cases = [("none", 0.0)] + [(k, r) for k in args.kinds.split(",") for r in args.rates]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, rate) in enumerate(cases):
            t0 = time.time()
            row = reliability_case(kind, rate, Path(tmp) / f"case-{i}", steps=args.steps)
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            print(f"{kind:10s} {rate:4.1f}: injected {row['faults_injected']:3d}, crashed {row['crashed']}, infra "
                  f"{row['infra']}/{row['episodes']}, attributed {row['attributed_to_infra']}, mislabelled "
                  f"{row['mislabelled_infra']}, lost {row['lost_records']}, duplicates {row['duplicate_records']}",
                  flush=True)
    print(f"-> {write_result('reliability.json', {'steps': args.steps, 'retries': 2, 'cases': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
