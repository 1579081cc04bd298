"""Shared fixtures. The shipped model is loaded for real (from the dequantised cache), once per session."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2():
    from agentlab.models import load_policy

    return load_policy("smollm2-135m")


@pytest.fixture(scope="session")
def tiny():
    from agentlab.models import load_policy

    return load_policy("tiny-random")
