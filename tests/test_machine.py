"""The machine sentence notebooks render above their outputs."""

import datetime
import os

from agentlab.machine import describe, made_on


def test_made_on_states_today_this_machine_and_the_precision(monkeypatch):
    monkeypatch.setenv("AGENTLAB_PRECISION", "fp32")
    text = made_on("a test run", settings="T = 0.7.")
    m = describe()
    assert datetime.date.today().isoformat() in text and "precision fp32" in text and text.endswith("T = 0.7.")
    assert f"{len(os.sched_getaffinity(0))} CPU cores" in text and m["precision"] == "fp32"
    assert ("no GPU" in text) == (m["gpu"] is None)
    assert m["commit"] is None or f"`{m['commit']}`" in text
