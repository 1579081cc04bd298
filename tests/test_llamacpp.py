"""The llama.cpp rollout engine: the GGUF export carries exactly our weights, and decoding it agrees with torch."""

import numpy as np
import pytest
import torch

from agentlab.engines import llamacpp


@pytest.fixture(scope="module")
def bf16_copy(smollm2):
    from agentlab.engines.weights import MergedCopy

    model, _ = smollm2
    return MergedCopy(model, torch.bfloat16).sync(model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_export_round_trips_through_transformers_gguf_loader(tiny, tmp_path, dtype):
    """transformers' own GGUF reader (which undoes llama.cpp's q/k layout) reads back our weights bit for bit, and
    the model's own shape (the 2-layer model: 4 query heads, 2 key/value heads): a wrong head permutation, a dropped
    tensor or the source file's hyperparameters fail here."""
    import copy

    from transformers import AutoModelForCausalLM

    from agentlab.models import smollm2_gguf_path

    src = copy.deepcopy(tiny[0]).to(dtype)
    path = llamacpp.export_gguf(src, smollm2_gguf_path(), tmp_path / "policy.gguf")
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, torch_dtype=dtype)
    theirs = back.state_dict()
    for name, ours in src.state_dict().items():
        assert name in theirs, name
        assert torch.equal(theirs[name].to(dtype), ours), name


def test_export_refuses_mixed_precision(smollm2, tmp_path):
    import copy

    from agentlab.models import smollm2_gguf_path

    model, _ = smollm2
    mixed = copy.deepcopy(model)
    mixed.model.norm.to(torch.bfloat16)
    with pytest.raises(ValueError, match="all-fp32 or all-bf16"):
        llamacpp.export_gguf(mixed, smollm2_gguf_path(), tmp_path / "x.gguf")


def test_sampler_is_seeded_and_respects_temperature_and_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.2, 1e-9]] * 4000, dtype=np.float32))
    draw = llamacpp.sampler(False, 1.0, 1.0, np.random.default_rng(0))
    ids = draw(logits)
    freq = np.bincount(ids, minlength=4) / len(ids)
    assert np.allclose(freq[:3], [0.5, 0.3, 0.2], atol=0.03) and freq[3] == 0
    assert np.array_equal(ids, llamacpp.sampler(False, 1.0, 1.0, np.random.default_rng(0))(logits))
    nucleus = llamacpp.sampler(False, 1.0, 0.6, np.random.default_rng(1))(logits)
    assert set(np.unique(nucleus)) == {0, 1}  # 0.5 alone is under 0.6; 0.5 + 0.3 covers it
    assert np.array_equal(llamacpp.sampler(True, 0.7, 1.0, None)(logits), np.zeros(4000))


def test_unknown_engine_is_refused():
    from agentlab.rollout import LoopConfig

    with pytest.raises(ValueError, match="engine"):
        LoopConfig(engine="vllm-cpu")


def test_engine_reaches_every_loop_a_run_builds():
    """One setting chooses the engine for GRPO's rollouts, its checkpoint evals and a comparison's evaluations."""
    from agentlab.compare import CompareConfig
    from agentlab.experiment import Experiment
    from agentlab.quickstart import QuickstartConfig

    assert Experiment(rollout_backend="llama_cpp").loop().engine == "llama_cpp"
    assert Experiment().loop().engine == "torch"
    with pytest.raises(ValueError, match="rollout_backend"):
        Experiment(rollout_backend="llamacpp")
    cmp = QuickstartConfig.of(rollout_backend="llama_cpp")
    assert cmp.grpo.loop().engine == cmp.eval_loop().engine == "llama_cpp"
    assert CompareConfig().eval_loop().engine == "torch"


@pytest.mark.parametrize(("machine", "precision", "installed", "engine"), [
    ("avx512-bf16", "bf16", True, "torch"),        # 103 s vs 104.9 s: a tie goes to torch, the reference
    ("avx512-bf16", "fp32", True, "llama_cpp"),    # 210.8 s vs 141.0 s
    ("avx512-bf16", "fp32", False, "torch"),       # faster where installed only
    ("avx2", "fp32", True, "llama_cpp"),           # 221.6 s vs 201.0 s: just past MARGIN
    ("avx512", "fp32", True, "llama_cpp"),         # 224.5 s vs 196.7 s (AVX-512 without bf16 instructions)
    ("amx", "bf16", True, "torch"),                # a class never measured: torch, and how to measure it
])
def test_auto_is_the_engine_measured_fastest_on_this_class_of_machine(monkeypatch, machine, precision, installed,
                                                                        engine):
    from agentlab import machine as machine_module
    from agentlab.engines import choice, make

    monkeypatch.setattr(machine_module, "cpu_class", lambda: machine)
    picked = choice.choose(precision, available=installed)
    assert picked["engine"] == engine and picked["machine"] == f"{machine}/{precision}"
    assert ("never measured" in picked["why"]) == (picked["seconds"] is None)
    assert ("not installed" in picked["why"]) == (not installed and precision == "fp32")
    from agentlab.envs import load
    from agentlab.experiment import Experiment
    from agentlab.rollout import LoopConfig

    assert Experiment(rollout_backend="auto").loop().engine == "auto"  # a config may name it
    monkeypatch.setattr(choice, "choose", lambda precision="auto", available=None: {"engine": "what-choose-said"})
    with pytest.raises(ValueError, match="what-choose-said"):  # make() decodes with the engine choose() names
        make("auto", None, None, LoopConfig.of(load("lookup")), True, 0)


needs_llama = pytest.mark.skipif(not llamacpp.available(), reason="llama-cpp-python is not installed "
                                 "(make setup-llamacpp)")


def _prompts(tok, n):
    from agentlab.envs import load
    from agentlab.rollout import Renderer

    spec = load("lookup")
    renderer = Renderer(tok, spec.env_class)
    return [renderer.prompt_ids(t) for t in spec.make_tasks("validation", n, seed=0)]


def _torch_greedy(model, tok, seqs, max_new):
    from agentlab.engines.torch import hf_generate_fn
    from agentlab.rollout import LoopConfig

    cfg = LoopConfig(max_new_tokens=max_new, temperature=0, batch_size=len(seqs))
    return hf_generate_fn(model, tok, cfg, greedy=True, seed=0)(seqs)


def _first_logits(engine, seqs, eos):
    seen = []
    engine.generate(seqs, 1, eos, lambda logits: (seen.append(logits), logits.argmax(1))[1])
    return seen[0]


@needs_llama
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_logits_and_greedy_tokens_agree_with_torch(smollm2, bf16_copy, tmp_path, precision):
    """Same weights, another engine: every row's next-token logits within float noise of torch's (its f16 KV cache,
    its GEMM order), and greedy text that mostly agrees (near-ties may flip; a wrong export, RoPE layout or
    shared-prefix copy would agree on nothing)."""
    from agentlab.models import smollm2_gguf_path

    model, tok = smollm2
    weights = model if precision == "fp32" else bf16_copy
    seqs = _prompts(tok, 4 if precision == "fp32" else 2)  # bf16 forwards are slow without bf16 hardware
    path = llamacpp.export_gguf(weights, smollm2_gguf_path(), tmp_path / "p.gguf")
    engine = llamacpp.Engine(path, n_seq=len(seqs), n_ctx_seq=1024, n_threads=1)
    ours = _first_logits(engine, seqs, tok.eos_token_id)
    with torch.no_grad():
        ref = torch.stack([weights(input_ids=torch.tensor([s])).logits[0, -1].float() for s in seqs]).numpy()
    gap = np.abs(ours - ref).max()
    assert gap < (0.05 if precision == "fp32" else 0.5), gap
    # llama.cpp's pick is torch's pick or within that noise of it (the base model's first token is a near-tie on
    # one of these prompts; torch's bf16 logits are rounded to 1/8 near 20)
    tie = 0.05 if precision == "fp32" else 0.25
    assert all(ref[i, ours[i].argmax()] >= ref[i].max() - tie for i in range(len(seqs)))
    if precision == "bf16":
        engine.close()
        return
    mine = engine.generate(seqs, 24, tok.eos_token_id, llamacpp.sampler(True, 0, 1, None))
    theirs = _torch_greedy(model, tok, seqs, 24)
    # Greedy texts may part (how many do depends on the CPU: 4 of 4 rows agreed on an AVX2-only EPYC, 1 of 4 on an
    # AMX Xeon and on an AVX-512 EPYC); where one does, it must be at a near-tie. At the first token that differs,
    # the two engines' logits for the shared text agree within float noise (the f16 KV cache's error grows along
    # the text: 0.04-0.08 measured at positions 0-13 on the AVX-512 EPYC, against several units for a wrong
    # engine), and torch ranks llama.cpp's pick within twice that gap of its own best — what any two argmaxes of
    # logits that close can do. A wrong engine (export, RoPE layout, a row's stream) parts where torch is sure.
    margins = []
    for seq, a, b in zip(seqs, mine, theirs, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is None:
            assert a == b, (a, b)
            continue
        shared = seq + a[:k]
        with torch.no_grad():
            ref_k = model(input_ids=torch.tensor([shared])).logits[0, -1].float().numpy()
        ours_k = _first_logits(engine, [shared], tok.eos_token_id)[0]
        margins.append((k, float(ref_k.max() - ref_k[a[k]]), float(np.abs(ours_k - ref_k).max())))
    assert all(gap_k < 0.2 and margin <= 2 * gap_k for _, margin, gap_k in margins), margins
    engine.close()


@needs_llama
def test_rows_decode_as_they_would_alone(smollm2, tmp_path):
    """Per-row KV streams and the shared-prefix copy: a row's greedy tokens do not depend on its batch mates.

    With the weights this machine decodes with (``for_generation``: bf16 where the CPU multiplies bf16, fp32
    elsewhere). On an AVX-512 Xeon without bf16 instructions, a bf16 copy decoded row 0 otherwise in a batch of 3
    than alone (the 15th token parted; in fp32 there it does not): llama.cpp's bf16 arithmetic on such a CPU depends
    on the batch, and no run decodes that way there (``precision="auto"`` is fp32)."""
    from agentlab.engines.weights import for_generation
    from agentlab.models import smollm2_gguf_path

    model, tok = smollm2
    seqs = _prompts(tok, 3)
    seqs[1] = seqs[1] + tok.encode("Let me think", add_special_tokens=False)  # rows of different lengths
    path = llamacpp.export_gguf(for_generation(model), smollm2_gguf_path(), tmp_path / "p.gguf")
    engine = llamacpp.Engine(path, n_seq=3, n_ctx_seq=1024, n_threads=1)
    greedy = llamacpp.sampler(True, 0, 1, None)
    together = engine.generate(seqs, 16, tok.eos_token_id, greedy)
    alone = [engine.generate([s], 16, tok.eos_token_id, greedy)[0] for s in seqs]
    assert together == alone
    with pytest.raises(ValueError, match="positions"):
        engine.generate([seqs[0] * 3], 16, tok.eos_token_id, greedy)
    engine.close()


@needs_llama
def test_a_rows_next_turn_encodes_only_what_is_new(smollm2, tmp_path):
    """A row's stream keeps its conversation across calls: the next turn (its generated tokens and a tool's answer
    appended, rows in another order) encodes only the answer and the one generated token never fed back, and
    decodes what an engine starting from scratch decodes."""
    from agentlab.models import smollm2_gguf_path

    model, tok = smollm2
    seqs = _prompts(tok, 3)
    path = llamacpp.export_gguf(model, smollm2_gguf_path(), tmp_path / "p.gguf")
    engine = llamacpp.Engine(path, n_seq=3, n_ctx_seq=1024, n_threads=1)
    greedy = llamacpp.sampler(True, 0, 1, None)
    first = engine.generate(seqs, 12, tok.eos_token_id, greedy)
    answer = tok.encode("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)
    turn2 = [s + f + answer for s, f in zip(seqs, first, strict=True)][::-1]
    encoded, logits = [], []
    decode = engine._decode
    engine._decode = lambda items: (encoded.append(len(items)), decode(items))[1]
    again = engine.generate(turn2, 12, tok.eos_token_id, lambda z: (logits.append(z), z.argmax(1))[1])
    assert encoded[1] == 3 * (1 + len(answer)), encoded  # [0]: the shared prefix, unchanged, encodes nothing
    fresh = llamacpp.Engine(path, n_seq=3, n_ctx_seq=1024, n_threads=1)
    assert np.abs(_first_logits(fresh, turn2, tok.eos_token_id) - logits[0]).max() < 0.05
    assert sum(x == y for x, y in zip(again, fresh.generate(turn2, 12, tok.eos_token_id, greedy))) >= 2
    engine.close()
    fresh.close()


@needs_llama
def test_run_episodes_on_llama_cpp_follows_weight_updates(tmp_path):
    """The loop through llama.cpp: episodes complete with TRL's token layout, sampling is reproducible from the
    seed, and a change of the trained weights is exported before the next rollout (not served stale)."""
    from peft import get_peft_model

    from agentlab.envs import load
    from agentlab.experiment import lora_config
    from agentlab.models import load_policy
    from agentlab.rollout import LoopConfig, run_episodes

    base, tok = load_policy("smollm2-135m")
    model = get_peft_model(base, lora_config(4))
    spec = load("lookup")
    tasks = spec.make_tasks("validation", 2, seed=0)
    cfg = LoopConfig(max_turns=2, max_new_tokens=12, batch_size=4, engine="llama_cpp")
    a = run_episodes(model, tok, spec, tasks, samples=2, config=cfg, seed=3, progress=False)
    b = run_episodes(model, tok, spec, tasks, samples=2, config=cfg, seed=3, progress=False)
    assert [e.tokens for e in a] == [e.tokens for e in b]
    for ep in a:
        assert len(ep.tokens["completion_ids"]) == len(ep.tokens["mask"]) > 0
    greedy = LoopConfig(max_turns=1, max_new_tokens=8, temperature=0, batch_size=4, engine="llama_cpp")
    before = run_episodes(model, tok, spec, tasks, config=greedy, greedy=True, progress=False)
    engine = llamacpp._ENGINES[model]["engine"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    c = run_episodes(model, tok, spec, tasks, config=greedy, greedy=True, progress=False)
    assert llamacpp._ENGINES[model]["engine"] is not engine
    ref = run_episodes(model, tok, spec, tasks, config=LoopConfig(max_turns=1, max_new_tokens=8, temperature=0,
                                                                   batch_size=4), greedy=True, progress=False)
    assert [e.tokens for e in c] != [e.tokens for e in before]  # the new weights, not the exported old ones
    assert sum(e.tokens == f.tokens for e, f in zip(c, ref)) >= 1


@needs_llama
def test_tiny_model_decodes_the_same_in_both_engines(tiny, tmp_path):
    """The export writes the model's own shape (layers, widths, heads, RoPE), not the source file's: a 2-layer
    random model with the shipped tokenizer decodes greedily to the same tokens in llama.cpp as in torch."""
    import copy

    from agentlab.models import smollm2_gguf_path

    model, tok = copy.deepcopy(tiny[0]), tiny[1]  # the torch path switches a model's attention: not the shared one's
    seqs = _prompts(tok, 3)
    path = llamacpp.export_gguf(model, smollm2_gguf_path(), tmp_path / "tiny.gguf")
    engine = llamacpp.Engine(path, n_seq=3, n_ctx_seq=1024, n_threads=1)
    mine = engine.generate(seqs, 12, tok.eos_token_id, llamacpp.sampler(True, 0, 1, None))
    engine.close()
    assert sum(x == y for x, y in zip(mine, _torch_greedy(model, tok, seqs, 12))) >= 2


@needs_llama
def test_comparison_end_to_end_on_llama_cpp(tmp_path, monkeypatch):
    """SFT search, GRPO (rollouts and checkpoint evals) and the test evaluations of a smoke comparison, every
    episode decoded by llama.cpp with the weights of the moment."""
    import json

    from agentlab.compare import CompareConfig, run_compare

    monkeypatch.setenv("AGENTLAB_RUNS", str(tmp_path))
    cfg = CompareConfig.smoke(name="cmp-llama", rollout_backend="llama_cpp")
    run_compare(cfg, arms=("sft_best", "grpo"))
    saved = json.loads((tmp_path / "cmp-llama" / "result.json").read_text())
    assert saved["grpo"]["n"] == cfg.test and saved["choices"]["grpo"]["step"] >= 1
    assert json.loads((tmp_path / "cmp-llama" / "config.json").read_text())["rollout_backend"] == "llama_cpp"
