"""The agent loop: scripted episodes, exits, masks, infra retries, JSONL records, and token identity with TRL."""

import io
import json

import pytest

from agentlab.engines.scripted import scripted_generate_fn
from agentlab.envs import load
from agentlab.envs.lookup import LookupEnv
from agentlab.rollout import LoopConfig, Renderer, run_episodes
from agentlab.types import Episode, InfraError, ToolCall

SPEC = load("lookup")


def _scripted(tok, tasks, policy=None, **kw):
    renderer = Renderer(tok, SPEC.env_class)
    gen = scripted_generate_fn(renderer, tasks, policy or SPEC.expert)
    return run_episodes(None, tok, SPEC, tasks, generate_fn=gen, progress=False, **kw)


def test_scripted_expert_succeeds_and_masks_tool_results(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 5, seed=1)
    episodes = _scripted(tok, tasks, samples=2)
    assert [(e.group, e.sample) for e in episodes] == [(g, s) for g in range(5) for s in range(2)]
    for ep in episodes:
        assert ep.exit_reason == "final_answer" and ep.success == 1.0 and ep.failure is None
        ids, mask = ep.tokens["completion_ids"], ep.tokens["mask"]
        assert len(ids) == len(mask) == sum(t.n_generated + t.n_context for t in ep.turns)
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        masked = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert "<tool_response>" in masked and "<tool_response>" not in trained
        assert trained.count("<tool_call>") == 2 and trained.endswith("<|im_end|>")


def test_off_form_call_is_recorded_not_raised(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 2, seed=0)
    bad = tok.encode('<tool_call>\n{"name": "search_people", "arguments": {"query": \n</tool_call><|im_end|>')
    episodes = run_episodes(None, tok, SPEC, tasks, generate_fn=lambda seqs: [bad for _ in seqs], progress=False)
    for ep in episodes:
        assert ep.exit_reason == "no_tool_call" and ep.turns[0].off_form and ep.failure == "model"


def test_turn_budget_and_context_budget(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 2, seed=0)

    def searcher(task):
        while True:
            yield ToolCall("search_people", {"query": "Ada"})

    eps = _scripted(tok, tasks, policy=searcher, config=LoopConfig(max_turns=3))
    assert all(e.exit_reason == "max_turns" and len(e.turns) == 3 for e in eps)
    eps = _scripted(tok, tasks, policy=searcher, config=LoopConfig(max_turns=50, max_context=700))
    assert all(e.exit_reason == "context" for e in eps)
    assert all(len(e.tokens["prompt_ids"]) + len(e.tokens["completion_ids"]) <= 700 for e in eps)


class _Flaky(LookupEnv):
    """Fails the first ``fail`` tool calls of every episode with an environment fault."""

    fail = 1

    def _start(self, task):
        self._calls = 0

    def search_people(self, query: str) -> str:
        """Search the people directory by name.

        Args:
            query: Words of the person's name.
        """
        self._calls += 1
        if self._calls <= self.fail:
            raise InfraError("database connection dropped")
        return super().search_people(query)


def test_transient_faults_are_retried_and_persistent_ones_are_infra(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=0)
    eps = _scripted(tok, tasks, env_factory=_Flaky, config=LoopConfig(retries=2, backoff_s=0))
    assert all(e.success == 1.0 for e in eps)

    class Dead(_Flaky):
        fail = 99

    eps = _scripted(tok, tasks, env_factory=Dead, config=LoopConfig(retries=2, backoff_s=0))
    for ep in eps:
        assert ep.failure == "infra" and ep.exit_reason == "error"
        assert ep.turns[-1].tool_calls[-1]["error"] == "infra"


def test_jsonl_records_one_line_per_episode(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=0)
    buf = io.StringIO()
    eps = _scripted(tok, tasks, out=buf, step=7, model_id="m", config_id="c")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    back = [Episode.from_json(line) for line in lines]
    assert {b.task.id for b in back} == {e.task.id for e in eps}
    assert all(b.step == 7 and b.model_id == "m" and json.loads(lines[0])["task"]["env"] == "lookup" for b in back)


def test_real_tiny_model_runs_batched_and_reproducibly(tiny):
    model, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=0)
    cfg = LoopConfig(max_turns=2, max_new_tokens=8, batch_size=4)
    a = run_episodes(model, tok, SPEC, tasks, samples=2, config=cfg, seed=3, progress=False)
    b = run_episodes(model, tok, SPEC, tasks, samples=2, config=cfg, seed=3, progress=False)
    assert len(a) == 6 and all(e.turns and e.exit_reason for e in a)
    assert [e.tokens["completion_ids"] for e in a] == [e.tokens["completion_ids"] for e in b]


def _contextual(tiny):
    """A copy of the tiny model with larger random weights: the default init emits one token whatever the context."""
    import copy

    import torch

    model, tok = tiny
    model = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.5)
    return model, tok


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_preallocated_decode_cache_changes_no_token(tiny, monkeypatch, temperature):
    """Decoding into buffers written in place (``trl_compat.decode_cache``) gives exactly the tokens of
    transformers' own growing cache, greedy and sampled from one seed, within its capacity and past it (growth)."""
    from agentlab import trl_compat
    from agentlab.engines import torch as hf_engine

    model, tok = _contextual(tiny)
    renderer = Renderer(tok, SPEC.env_class)
    seqs = [renderer.prompt_ids(t) for t in SPEC.make_tasks("test", 4, seed=5)]
    seqs[1] = seqs[1] + seqs[1][-7:]  # rows of different lengths: pads between the shared prefix and the rest
    cfg = LoopConfig(max_new_tokens=8, temperature=temperature, precision="fp32")

    def tokens():
        return hf_engine.hf_generate_fn(model, tok, cfg, greedy=temperature == 0, seed=3)(seqs)

    preallocated = tokens()
    monkeypatch.setattr(hf_engine, "decode_cache", lambda prefix, rows, capacity: None)  # generate's own cache
    growing = tokens()
    monkeypatch.setattr(hf_engine, "decode_cache",
                        lambda prefix, rows, capacity: trl_compat.decode_cache(prefix, rows, capacity - 6))
    outgrown = tokens()
    assert preallocated == growing == outgrown
    assert len({tuple(t) for t in growing}) > 1 and all(len(t) > 1 for t in growing)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_padded_prefill_on_the_key_value_heads_changes_no_bit(tiny, monkeypatch, dtype):
    """``trl_compat.gqa_prefill`` (the padded prefill attends on the key/value heads in place) gives the same logits
    bit for bit as transformers' SDPA path, and the same generated tokens; it is taken, and only without grad."""
    import torch

    from agentlab import trl_compat
    from agentlab.engines import torch as hf_engine

    model, tok = _contextual(tiny)  # a copy of its own
    model = model.to(getattr(torch, dtype))
    model.set_attn_implementation("sdpa")  # the shared tiny model may have decoded (and switched) before this test
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    renderer = Renderer(tok, SPEC.env_class)
    seqs = [renderer.prompt_ids(t) for t in SPEC.make_tasks("test", 3, seed=2)]
    seqs[0] = seqs[0][:-9]  # rows of different lengths: a padded prefill
    width = max(map(len, seqs))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + s for s in seqs], device=model.device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=model.device)
    cfg = LoopConfig(max_new_tokens=8, precision="fp32")

    def run():
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        return logits, hf_engine.hf_generate_fn(model, tok, cfg, greedy=True, seed=0)(seqs)

    calls = []  # (a padded prefill?, enable_gqa?) per attention call; decode steps pack query heads per key/value head
    original, heads = torch.nn.functional.scaled_dot_product_attention, model.config.num_attention_heads
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda q, *a, **kw: calls.append(
        (kw.get("attn_mask") is not None and q.shape[1] == heads and q.shape[2] > 1, kw.get("enable_gqa", False)))
        or original(q, *a, **kw))
    monkeypatch.setattr(hf_engine, "gqa_prefill", lambda m: False)
    stock_logits, stock_tokens = run()
    assert model.config._attn_implementation == "sdpa" and (True, False) in calls and (True, True) not in calls
    monkeypatch.setattr(hf_engine, "gqa_prefill", trl_compat.gqa_prefill)
    calls.clear()
    assert trl_compat.gqa_prefill(model) and trl_compat.gqa_prefill(model)  # applied once, idempotent
    ours_logits, ours_tokens = run()
    assert model.config._attn_implementation == trl_compat.GQA_PREFILL
    on_heads = model.device.type == "cpu"  # on CUDA transformers' own path stays (gqa_prefill says why)
    assert ((True, True) in calls) == on_heads and ((True, False) in calls) != on_heads  # every padded prefill
    assert torch.equal(stock_logits, ours_logits) and stock_tokens == ours_tokens
    calls.clear()
    model(input_ids=ids, attention_mask=mask).logits.sum().backward()  # with grad: transformers' path
    assert (True, False) in calls and (True, True) not in calls


def test_the_lm_head_gets_a_contiguous_input_in_generation(tiny):
    """generate keeps the last position of the prefill (a strided view); the head must see it contiguous, else
    torch copies the head's weight once per row (seconds at an eval batch of 48, see ``_fold_lm_head_input``)."""
    import torch

    from agentlab.engines.torch import _fold_lm_head_input

    model, _ = _contextual(tiny)
    seen = []
    _fold_lm_head_input(model)
    _fold_lm_head_input(model)  # once per model, however often asked
    model.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7, 8]] * 3, device=model.device), logits_to_keep=1)
    assert seen == [True]
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 2


def test_prefix_cached_generation_matches_uncached_token_for_token(tiny):
    """The shared-prefix cache changes no generated token (fp32, greedy), on a first turn and on a later turn
    whose rows carry tool results of different lengths."""
    from agentlab.engines.torch import hf_generate_fn

    model, tok = _contextual(tiny)
    renderer = Renderer(tok, SPEC.env_class)
    tasks = SPEC.make_tasks("test", 3, seed=5)
    cfg = LoopConfig(max_new_tokens=6, temperature=0, precision="fp32")
    cached = hf_generate_fn(model, tok, cfg, greedy=True, seed=0)
    plain = hf_generate_fn(model, tok, cfg, greedy=True, seed=0, prefix_cache=False)
    seqs = [renderer.prompt_ids(t) for t in tasks]
    first = cached(seqs)
    assert first == plain(seqs) and len({tuple(f) for f in first}) > 1  # context matters to this model
    results = ["Ada Vell | lives in Oslo", "no match"]
    turn2 = [s + g + renderer.suffix_ids([{"role": "tool", "name": "lookup_person", "content": r}])
             for s, g, r in zip([seqs[0], seqs[2]], [first[0], first[2]], results, strict=True)]
    assert cached(turn2) == plain(turn2)


def _agree_but_for_ties(model, seqs, got, want, precision):
    """``got`` are ``want``'s tokens, except that in bf16 a row may part from them where two tokens tie: at its first
    differing position both tokens' bf16 logits (uncached, one row alone) lie within two bf16 steps of each other.
    Keys computed one token at a time and keys prefilled in one call round differently in bf16 (AMX kernels pick
    different blocking by shape), so a tie may break either way; fp32 has no such slack. Seen on an AMX Xeon: two
    tokens at 7.125 each."""
    import torch

    from agentlab.engines.weights import for_generation

    if precision == "fp32":
        assert got == want
        return
    decoder = for_generation(model, precision)
    for seq, a, b in zip(seqs, got, want, strict=True):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if i is None:
            continue
        with torch.no_grad():
            logits = decoder(input_ids=torch.tensor([seq + b[:i]])).logits[0, -1].float()
        step = 2.0 ** (torch.floor(torch.log2(logits.abs().max())) - 7)  # one bf16 step at the top logit's size
        assert abs(logits[a[i]] - logits[b[i]]) <= 2 * step, (i, logits[a[i]].item(), logits[b[i]].item())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rows_reused_across_turns_match_uncached_decoding(tiny, precision):
    """A row that extends its last call's tokens starts from its kept keys and values (only its new tokens are
    prefilled), beside a row that starts fresh, over three turns of different-length tool replies: the same
    tokens as decoding without any cache (in bf16, but for ties), and the reuse really happened."""
    from agentlab.engines.torch import hf_generate_fn

    model, tok = _contextual(tiny)
    renderer = Renderer(tok, SPEC.env_class)
    tasks = SPEC.make_tasks("test", 4, seed=5)
    cfg = LoopConfig(max_new_tokens=6, temperature=0, precision=precision)
    reused = hf_generate_fn(model, tok, cfg, greedy=True, seed=0)
    plain = hf_generate_fn(model, tok, cfg, greedy=True, seed=0, prefix_cache=False)

    def reply(text):
        return renderer.suffix_ids([{"role": "tool", "name": "lookup_person", "content": text}])

    seqs = [renderer.prompt_ids(t) for t in tasks[:3]]
    out = reused(seqs)
    _agree_but_for_ties(model, seqs, out, plain(seqs), precision)
    seqs = [seqs[0] + out[0] + reply("Ada Vell | lives in Oslo"), renderer.prompt_ids(tasks[3]),
            seqs[2] + out[2] + reply("no match")]
    out = reused(seqs)
    _agree_but_for_ties(model, seqs, out, plain(seqs), precision)
    seqs = [seqs[0] + out[0] + reply("no match"), seqs[2] + out[2] + reply("Bo Lind | born 1970 | lives in Rome")]
    _agree_but_for_ties(model, seqs, reused(seqs), plain(seqs), precision)
    assert reused.stats["rows_reused"] == 4 and reused.stats["rows"] == 8
    assert reused.stats["tokens_reused"] > reused.stats["tokens_prefilled"] / 2


def test_same_tokens_as_trl_tool_loop(tiny, tmp_path):
    """Render the same scripted episodes with TRL's GRPOTrainer tool loop and with ours: identical ids and masks."""
    import copy

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = tiny
    model = copy.deepcopy(model)  # GRPOTrainer patches the model it is given; the session's shared one stays as loaded
    tasks = SPEC.make_tasks("test", 2, seed=4)
    renderer = Renderer(tok, SPEC.env_class)
    rows = [{"prompt": renderer.messages(t), "task": t.to_json()} for t in tasks]
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=1024, max_tool_calling_iterations=1, report_to=[], logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                          environment_factory=LookupEnv)
    scripted = scripted_generate_fn(renderer, tasks, SPEC.expert)
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (scripted([list(p) for p in prompt_ids]), None)
    inputs = [rows[0], rows[0], rows[1], rows[1]]
    out = trainer._generate_and_score_completions(inputs)

    ours = _scripted(tok, tasks, samples=2)
    for i, ep in enumerate(ours):
        n = int(out["completion_mask"][i].sum())
        trl_ids = out["completion_ids"][i][:n].tolist()
        trl_mask = out["tool_mask"][i][:n].tolist()
        assert out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist() == ep.tokens["prompt_ids"]
        assert trl_ids == ep.tokens["completion_ids"]
        assert trl_mask == ep.tokens["mask"]


def test_bad_loop_config_is_refused():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        LoopConfig(max_turns=0)


def test_injected_faults_are_all_infra_and_rescoring_recovers_the_fault_free_result(tiny):
    """Acceptance (issue 4): 200 episodes at 10% injected faults; every fault is attributed to infra, none to the
    model, and re-running only the infra-failed instances gives the fault-free result."""
    from agentlab.evals import rescore_infra, summarize
    from agentlab.faults import fault_for, inject_faults

    _, tok = tiny
    tasks = SPEC.make_tasks("test", 200, seed=5)
    faulty = inject_faults(LookupEnv, rate=0.10, seed=11)
    no_retry = LoopConfig(retries=0, backoff_s=0)
    first = _scripted(tok, tasks, env_factory=faulty, config=no_retry)
    # With no retries an episode of the expert's two calls fails exactly when attempt 0 or attempt 1 faults.
    expected = {t.id for t in tasks
                if any(fault_for(11, t.id, a, 0.10, ("exception", "timeout", "dropped")) for a in (0, 1))}
    assert {e.task.id for e in first if e.failure == "infra"} == expected and len(expected) > 10
    assert not any(e.failure == "model" for e in first)

    def rerun(subset):
        return _scripted(tok, subset, env_factory=faulty, config=LoopConfig(retries=3, backoff_s=0))

    corrected, report = rescore_infra(first, rerun)
    clean = summarize(_scripted(tok, tasks))
    assert summarize(corrected)["success"] == clean["success"] and clean["success"]["mean"] == 1.0
    assert report["provisional"]["mean"] < 1.0


def test_calls_a_lenient_parser_recovers_are_flagged_not_lost(tiny):
    """A call wrapped in chatter still runs (the parser is lenient) but its turn is flagged, so a format penalty
    (reward term ``lenient``) has something to bite on; the scripted expert's clean calls are not flagged."""
    from agentlab.rewards import Reward

    _, tok = tiny
    task = SPEC.make_tasks("test", 1, seed=0)[0]
    renderer = Renderer(tok, SPEC.env_class)
    clean = run_episodes(None, tok, SPEC, [task], progress=False,
                         generate_fn=scripted_generate_fn(renderer, [task], SPEC.expert))[0]
    assert clean.turns and not any(t.lenient for t in clean.turns)
    call = '<tool_call>\n{"name": "search_people", "arguments": {"query": "Ada"}}\n</tool_call>'
    chatty = tok.encode("Let me search.\n" + call) + [tok.eos_token_id]
    ep = run_episodes(None, tok, SPEC, [task], progress=False, config=LoopConfig(max_turns=1),
                      generate_fn=lambda seqs: [chatty for _ in seqs],
                      reward_fn=Reward({"success": 1.0, "lenient": -0.1}))[0]
    assert ep.turns[0].tool_calls and ep.turns[0].tool_calls[0]["name"] == "search_people"
    assert ep.turns[0].lenient and not ep.turns[0].off_form and ep.reward_terms["lenient"] == -0.1


def test_a_failing_reset_is_retried_then_infra_never_a_crash(tiny):
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=4)
    broken, flaky = tasks[0].id, tasks[1].id
    attempts = {broken: 0, flaky: 0}

    class Env(SPEC.env_class):
        def reset(self, **row):
            task_id = json.loads(row["task"])["id"]
            if task_id in attempts:
                attempts[task_id] += 1
                if task_id == broken or attempts[task_id] == 1:
                    raise ConnectionError(f"sandbox for {task_id} unreachable")
            return super().reset(**row)

    renderer = Renderer(tok, SPEC.env_class)
    eps = run_episodes(None, tok, SPEC, tasks, env_factory=Env, progress=False, config=LoopConfig(backoff_s=0.001),
                       generate_fn=scripted_generate_fn(renderer, tasks, SPEC.expert))
    assert [e.failure for e in eps] == ["infra", None, None] and eps[0].exit_reason == "error"
    assert "unreachable" in eps[0].metrics["reset_error"] and not eps[0].turns
    assert attempts == {broken: 3, flaky: 2}  # retries + 1 attempts for the broken one, one retry for the flaky one


def test_a_bare_loop_config_runs_in_the_environments_budget(tiny):
    """``LoopConfig()`` leaves the budget to the environment: run_episodes fills it from ``spec.budget`` (lookup: 3
    turns, not ``types.Budget``'s 4); a field given explicitly wins; an engine refuses a budget left unset."""
    from agentlab.engines import make
    from agentlab.types import Budget

    _, tok = tiny
    assert SPEC.budget.max_turns != Budget.max_turns
    tasks = SPEC.make_tasks("test", 2, seed=0)
    call = tok.encode('<tool_call>\n{"name": "search_people", "arguments": {"query": "Ada"}}\n</tool_call><|im_end|>')
    for config, turns in ((LoopConfig(), SPEC.budget.max_turns), (LoopConfig(max_turns=2), 2)):
        episodes = run_episodes(None, tok, SPEC, tasks, config=config, progress=False,
                                generate_fn=lambda seqs: [call for _ in seqs])
        assert [len(ep.turns) for ep in episodes] == [turns, turns]
        assert {ep.exit_reason for ep in episodes} == {"max_turns"}
    assert LoopConfig.of(SPEC) == LoopConfig().resolved(SPEC) == LoopConfig(**vars(SPEC.budget))
    with pytest.raises(ValueError, match="resolved"):
        make("torch", None, tok, LoopConfig(), greedy=True, seed=0)


def test_in_a_notebook_a_progress_bar_leaves_one_summary_line(tiny, monkeypatch, capsys):
    """A saved notebook keeps a widget bar only as its first frame, so in the tutorial's kernels the bar also says
    once how many episodes ran and in how long."""
    monkeypatch.setenv("AGENTLAB_NOTEBOOK", "1")
    _, tok = tiny
    tasks = SPEC.make_tasks("test", 3, seed=1)
    run_episodes(None, tok, SPEC, tasks, samples=2, progress=True,
                 generate_fn=scripted_generate_fn(Renderer(tok, SPEC.env_class), tasks, SPEC.expert))
    said = capsys.readouterr().out
    assert said.count("lookup episodes: 6 in ") == 1, said
