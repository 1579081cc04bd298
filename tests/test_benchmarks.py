"""The study's gatherer keeps what earlier sessions recorded (run folders are not committed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from rl_vs_sft import merge_earlier


def _point(run, steps):
    return {"run": run, "arm": "sft_best", "lr": 1e-3, "steps": steps, "validation": {"success": 0.1}}


def test_earlier_tried_points_and_seeds_survive_unless_rerun_here():
    earlier = {"env": "product_finder", "regime": "cheap:64",
               "tried": [_point("search/old", 8), _point("pf/seed-0", 4)],
               "seeds": [{"seed": 0, "n": 200, "from": "earlier"}, {"seed": 1, "n": 200, "from": "earlier"}]}
    tried, seeds = merge_earlier(earlier, [_point("pf/seed-0", 2)], [{"seed": 1, "n": 200, "from": "here"}],
                                 "product_finder", "cheap:64")
    assert [(t["run"], t["steps"]) for t in tried] == [("search/old", 8), ("pf/seed-0", 2)]  # a re-run folder wins
    assert [(s["seed"], s["from"]) for s in seeds] == [(0, "earlier"), (1, "here")]


def test_seeds_of_another_regime_are_not_mixed_in():
    earlier = {"env": "product_finder", "regime": "expert:32", "tried": [_point("search/x", 4)],
               "seeds": [{"seed": 0, "n": 200}]}
    tried, seeds = merge_earlier(earlier, [], [], "product_finder", "cheap:64")
    assert len(tried) == 1 and seeds == []
