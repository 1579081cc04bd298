"""Shared fixtures. The shipped model is loaded for real (from the dequantised cache), once per session."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite checks the CPU path (CI has no GPU) and runs on the CPU on a GPU machine too, its tensors made where its
# assertions expect them; AGENTLAB_TEST_CUDA=1 shows it the GPU (benchmarks/gpu_check.py, the `gpu` marker's tests).
if os.environ.get("AGENTLAB_TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# `make test` runs two pytest-xdist workers. Each worker, and every process it starts (CLI subprocesses, notebook
# kernels, torchrun workers), then uses cores / workers threads (one on 2 cores): with OpenMP's default of one thread
# per core, two workers would run four spinning threads on two cores, which slows both by an order of magnitude.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = str(max(1, (os.cpu_count() or 2) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

# One cache of derived artefacts (the dequantised SmolLM2, search indexes) for the whole session, fixed before any test
# points AGENTLAB_DATA at a folder of its own: cache_dir() follows AGENTLAB_DATA, so such a test rebuilt the model's
# cache from its GGUF (~40 s on 2 AVX2 cores) in its process and in every CLI process it started.
from agentlab.paths import cache_dir  # after the switches above; imports nothing heavy

os.environ.setdefault("AGENTLAB_CACHE", str(cache_dir()))


@pytest.fixture(autouse=True)
def _registry_restored():
    """Environments a test registers (by name, or by loading a file reference) leave with it: the reliability test's
    ``lookup-faulty-tool-0.5`` stayed registered in its worker, and a later in-process ``agentlab envs``, which
    scores every registered name, crashed on its injected faults."""
    from agentlab import envs

    before = dict(envs._REGISTERED)
    yield
    envs._REGISTERED.clear()
    envs._REGISTERED.update(before)


@pytest.fixture(scope="session")
def smollm2():
    from agentlab.models import load_policy

    return load_policy("smollm2-135m")


@pytest.fixture(scope="session")
def tiny():
    from agentlab.models import load_policy

    return load_policy("tiny-random")


@pytest.fixture(scope="session")
def scripted_batch():
    """``make(tok, tasks) -> (input_ids, attention_mask, completion_width)``: two scripted ``lookup`` episodes per
    task laid out as GRPOTrainer lays out a batch (prompts left-padded, completions right-padded)."""

    def make(tok, tasks):
        import torch

        from agentlab.engines.scripted import scripted_generate_fn
        from agentlab.envs import load
        from agentlab.rollout import Renderer, run_episodes

        spec = load("lookup")
        renderer = Renderer(tok, spec.env_class)
        eps = run_episodes(None, tok, spec, tasks, samples=2, progress=False,
                           generate_fn=scripted_generate_fn(renderer, tasks, spec.random_policy))
        prompts = [e.tokens["prompt_ids"] for e in eps]
        comps = [e.tokens["completion_ids"] for e in eps]
        P, C = max(map(len, prompts)), max(map(len, comps))
        ids = torch.tensor([[0] * (P - len(p)) + p + c + [0] * (C - len(c)) for p, c in zip(prompts, comps)])
        mask = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c))
                             for p, c in zip(prompts, comps)])
        return ids, mask, C

    return make
