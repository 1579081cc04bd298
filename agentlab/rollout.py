"""THE agent loop, shared by evaluation and GRPO training.

    from agentlab.rollout import LoopConfig, run_episodes
    episodes = run_episodes(model, tok, spec, tasks, samples=4, config=LoopConfig(max_turns=4))

Tokens are built exactly as TRL's multi-turn tool loop builds them — prompt rendered once, each generation
appended as generated, each tool result appended as the template's suffix tokens (never re-tokenising the
conversation) — so the same episode gives the same ids here and in ``GRPOTrainer`` (``tests/test_rollout.py``
checks this against TRL itself). Generated tokens carry mask 1 (trained), tool results mask 0.

Exits: ``final_answer`` (the environment's final tool ran), ``no_tool_call`` (the turn had no parsable call;
``off_form`` marks a turn that tried), ``max_turns``, ``context`` (the next turn would not fit), ``error``
(the environment kept failing after retries: an *infra* failure, never blamed on the model).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO

from agentlab.engines import BACKENDS, GenerateFn, make
from agentlab.quiet import in_notebook
from agentlab.retries import (
    INFRA_ERRORS,
    call_with_retries,
    generate_with_retries,
    reset_with_retries,
    score_with_retries,
)
from agentlab.trl_compat import parse_response, tool_suffix_ids
from agentlab.types import (
    BUDGET_FIELDS,
    EnvSpec,
    Episode,
    Task,
    ToolCall,
    ToolEnv,
    Turn,
    prompt_messages,
    tool_names,
)

# Episodes decoded together in a greedy evaluation (checkpoint evals, the test split). On a 2-core CPU the cost
# per episode falls until ~48 rows and is flat after (200 lookup episodes: batch 8 133.1 s, 32 80.7 s,
# 48 73.4 and 77.2 s, 100 75.7 s, 200 77.2 s); one size everywhere also makes a checkpoint's validation figure the same
# whichever stage evaluates it (batch composition can move a last bit, so a greedy choice).
EVAL_BATCH = 48
TASK_KEY = "agentlab_task"  # the key of a GRPO prompt's last message that names its task (Renderer.grpo_row)

# The declared format of a turn that calls tools: one or more blocks, nothing around them (qwen2.5's template).
_STRICT_CALLS = re.compile(r"(?:<tool_call>\n\{.*?\}\n</tool_call>\n?)+", re.DOTALL)

@dataclass(frozen=True)
class LoopConfig:
    """Budgets of one episode. Train and eval budgets may differ (a published product-finder run trained in 12 turns, scored in 30):
    keep them equal unless you mean to measure that gap."""

    max_turns: int | None = None  # None: the environment's budget (EnvSpec.budget), filled by resolved(spec)
    max_new_tokens: int | None = None  # per turn
    max_context: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    batch_size: int = 16          # episodes decoded together
    retries: int = 2              # extra attempts for a tool call that raised (environment fault)
    backoff_s: float = 0.05       # first retry delay; doubles each attempt
    precision: str = "auto"       # decoding: "auto" (bf16 where the CPU has it, agentlab.precision), "fp32", "bf16"
    engine: str = "torch"         # decoding engine: "torch", "llama_cpp" or "auto" (the one measured fastest here)

    @classmethod
    def of(cls, spec: EnvSpec, **overrides) -> LoopConfig:
        """The loop for ``spec``: its budget, then ``overrides`` (``None`` values keep the budget's)."""
        return cls(**{k: v for k, v in overrides.items() if v is not None}).resolved(spec)

    def resolved(self, spec: EnvSpec) -> LoopConfig:
        """This loop with every budget field left at ``None`` taken from ``spec.budget`` (run_episodes and
        evaluations call it, so a bare ``LoopConfig()`` runs in the environment's budget).

        >>> from agentlab.envs import load
        >>> LoopConfig(max_turns=2).resolved(load("doc_search")).max_context
        4096
        """
        return replace(self, **{name: getattr(spec.budget, name) for name in BUDGET_FIELDS
                                if getattr(self, name) is None})

    def __post_init__(self):
        for name in ("max_turns", "max_new_tokens", "max_context", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"LoopConfig.temperature must be >= 0, got {self.temperature}")
        from agentlab.precision import PRECISIONS

        for name, allowed in (("precision", PRECISIONS), ("engine", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"LoopConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")


class Renderer:
    """Chat-template rendering for one (tokenizer, environment) pair, as TRL does it."""

    def __init__(self, tokenizer, env_class: type[ToolEnv]):
        self.tok = tokenizer
        self.env_class = env_class
        probe = env_class()
        self.tools = [getattr(probe, n) for n in tool_names(env_class)]  # alphabetical, like TRL
        self._suffix_cache: dict[tuple, list[int]] = {}

    def messages(self, task: Task) -> list[dict]:
        return prompt_messages(self.env_class, task)

    def grpo_row(self, task: Task) -> dict:
        """GRPOTrainer's dataset row: the prompt's last message carries the task's id under ``TASK_KEY``.

        Why: TRL hands ``rollout_func`` the prompts alone, and the prompt text does not name the task where rows
        share it (every game of a TRL-style environment may start "Win this game", the game set by another column).
        Chat templates read a message's role and content, so the extra key changes no token."""
        *head, last = self.messages(task)
        return {"prompt": [*head, {**last, TASK_KEY: task.id}], "task": task.to_json()}

    def prompt_ids(self, task: Task, env: ToolEnv | None = None) -> list[int]:
        messages = (env._prompt_messages() if env is not None else None) or self.messages(task)
        return list(self.tok.apply_chat_template(messages, tools=self.tools, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))

    def suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """Tokens of tool results plus the next assistant header (``trl_compat.tool_suffix_ids``)."""
        return tool_suffix_ids(self.tok, tool_messages)

    def parse(self, new_ids: list[int], prefix: list[int]) -> dict:
        return parse_response(self.tok, new_ids, prefix=prefix, tools=self.tools)

    def assistant_ids(self, call: ToolCall, task: Task) -> list[int]:
        """The tokens a model would generate for ``call`` (a scripted turn), ending with EOS."""
        base = self.messages(task)
        before = self.tok.apply_chat_template(base, tools=self.tools, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
        after = self.tok.apply_chat_template(base + [call.as_message()], tools=self.tools, tokenize=True,
                                             return_dict=False)
        ids = list(after[len(before):])
        end = ids.index(self.tok.eos_token_id) if self.tok.eos_token_id in ids else len(ids) - 1
        return ids[: end + 1]


@dataclass
class _Live:
    """An episode in progress."""

    episode: Episode
    env: ToolEnv
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)  # the engine's, per token (None: not reported)
    started: float = field(default_factory=time.perf_counter)
    tool_s: float = 0.0
    gen_s: float = 0.0


def _finish(live: _Live, spec: EnvSpec, exit_reason: str, infra: bool, reward_fn,
            config: LoopConfig = LoopConfig()) -> Episode:
    ep = live.episode
    if not infra:
        try:
            live.env._finalize()
        except INFRA_ERRORS:
            infra = True
    ep.outcome = live.env.outcome
    ep.metrics = spec.evaluate(ep.task, ep.outcome)
    ep.exit_reason = exit_reason
    ep.failure = "infra" if infra else (None if ep.success >= 1.0 else "model")
    scored = score_with_retries(reward_fn, ep, config)
    if scored is None:  # the reward's service failed: infra, left out of training and of success rates
        ep.failure, scored = "infra", (0.0, {"reward_infra_failure": 1.0})
    total, terms = scored
    ep.reward, ep.reward_terms = float(total), dict(terms)
    ep.timings = {"total_s": time.perf_counter() - live.started, "generate_s": live.gen_s, "tools_s": live.tool_s}
    ep.tokens = {"prompt_ids": live.prompt_ids, "completion_ids": live.completion_ids, "mask": live.mask}
    if live.logprobs is not None and live.completion_ids:
        ep.tokens["logprobs"] = live.logprobs  # the behaviour policy's, when the engine reported them (vLLM)
    return ep


def _step(live: _Live, new_ids: list[int], renderer: Renderer, spec: EnvSpec, config: LoopConfig,
          reward_fn, observe=None) -> Episode | None:
    """Apply one generated turn to an episode; return the finished Episode, or None if it goes on."""
    ep = live.episode
    seq_before = live.prompt_ids + live.completion_ids
    parsed = renderer.parse(new_ids, prefix=seq_before)
    text = renderer.tok.decode(new_ids, skip_special_tokens=False)
    turn = Turn(text=text, n_generated=len(new_ids))
    ep.turns.append(turn)
    live.completion_ids += new_ids
    live.mask += [1] * len(new_ids)
    drawn = getattr(new_ids, "logprobs", None)
    live.logprobs = live.logprobs + drawn if live.logprobs is not None and drawn is not None else None
    calls = parsed.get("tool_calls") or []
    if not calls:
        turn.off_form = "<tool_call>" in text
        return _finish(live, spec, "no_tool_call", False, reward_fn, config)
    turn.lenient = _STRICT_CALLS.fullmatch(text.removesuffix(renderer.tok.eos_token or "")) is None
    tool_messages = []
    t0 = time.perf_counter()
    for raw in calls:
        fn = raw.get("function", {})
        call = ToolCall(str(fn.get("name", "")), fn.get("arguments", {}))
        result, error = call_with_retries(live.env, call, config)
        record = {"name": call.name, "arguments": call.arguments, "result": result, "error": error}
        seen = observe(ep, call, result) if observe is not None and error != "infra" else result
        if seen != result:
            record["hint"] = seen.removeprefix(result)
        turn.tool_calls.append(record)
        tool_messages.append({"role": "tool", "name": call.name, "content": seen})
        if error == "infra":
            live.tool_s += time.perf_counter() - t0
            return _finish(live, spec, "error", True, reward_fn, config)
    live.tool_s += time.perf_counter() - t0
    if live.env.done:
        return _finish(live, spec, "final_answer", False, reward_fn, config)
    if len(ep.turns) >= config.max_turns:
        return _finish(live, spec, "max_turns", False, reward_fn, config)
    suffix = renderer.suffix_ids(tool_messages)
    if len(live.prompt_ids) + len(live.completion_ids) + len(suffix) + config.max_new_tokens > config.max_context:
        return _finish(live, spec, "context", False, reward_fn, config)
    live.completion_ids += suffix
    live.mask += [0] * len(suffix)
    if live.logprobs is not None:
        live.logprobs += [0.0] * len(suffix)  # tool tokens are never trained; 0.0 as TRL's own tool loop fills them
    turn.n_context = len(suffix)
    return None


def run_episodes(model, tokenizer, spec: EnvSpec, tasks: list[Task], *, samples: int = 1,
                 config: LoopConfig = LoopConfig(), greedy: bool = False, seed: int = 0,
                 generate_fn: GenerateFn | None = None, env_factory: Callable[[], ToolEnv] | None = None,
                 reward_fn=None, out: IO[str] | None = None, progress: bool = True, step: int | None = None,
                 model_id: str = "", config_id: str = "", observe=None, group_offset: int = 0) -> list[Episode]:
    """Run ``samples`` episodes per task, decoding live episodes in batches; return them in (task, sample) order.

    ``generate_fn`` replaces the model (scripted tests, other backends). ``env_factory`` replaces
    ``spec.make_env`` (fault injection). ``reward_fn(ep) -> (total, terms)`` replaces ``spec.default_reward``.
    ``out``: a text file; each finished episode is appended as one JSON line and flushed.
    ``observe(ep, call, result) -> text``: what the model sees instead of a tool's raw result (training-time
    hints, ``agentlab.hints``); the raw result stays in the episode record, the addition under ``"hint"``.
    ``group_offset``: the first task's group number (several training processes number their groups across the
    run, so that ``(step, group)`` names one group, for the records and for ``observe`` alike).
    """
    from agentlab.evals import write_episode

    reward_fn = reward_fn or spec.default_reward
    config = config.resolved(spec)
    renderer = Renderer(tokenizer, spec.env_class)
    generate = generate_fn or make(config.engine, model, tokenizer, config, greedy, seed)
    make_env = env_factory or spec.make_env
    todo = [(g, s, task) for g, task in enumerate(tasks, start=group_offset) for s in range(samples)]
    done: dict[tuple[int, int], Episode] = {}
    bar = _progress(len(todo), progress, f"{spec.name} episodes")
    pending = list(todo)
    live: list[_Live] = []
    while pending or live:
        while pending and len(live) < config.batch_size:
            g, s, task = pending.pop(0)
            ep = Episode(task=task, group=g, sample=s, step=step, model_id=model_id, config_id=config_id)
            env = reset_with_retries(make_env, task, config)
            if isinstance(env, ToolEnv):
                live.append(_Live(ep, env, renderer.prompt_ids(task, env)))
                continue
            # the environment could not even start this episode: infra, recorded, never the policy's failure
            finished = _finish(_Live(ep, ToolEnv(), renderer.prompt_ids(task)), spec, "error", True, reward_fn,
                               config)
            finished.reward_terms["reset_failure"] = 1.0
            finished.metrics["reset_error"] = env
            done[(g, s)] = finished
            if out is not None:
                write_episode(out, finished)
            bar.update(1)
        t0 = time.perf_counter()
        new = generate_with_retries(generate, [lv.prompt_ids + lv.completion_ids for lv in live], config)
        if isinstance(new, str):  # the generation backend stayed down: every live episode is an infra failure
            for lv in live:
                finished = _finish(lv, spec, "error", True, reward_fn, config)
                finished.metrics["generation_error"] = new
                done[(finished.group, finished.sample)] = finished
                if out is not None:
                    write_episode(out, finished)
                bar.update(1)
            live = []
            continue
        share = (time.perf_counter() - t0) / len(live)
        still = []
        for lv, new_ids in zip(live, new, strict=True):
            lv.gen_s += share
            finished = _step(lv, new_ids, renderer, spec, config, reward_fn, observe)
            if finished is None:
                still.append(lv)
                continue
            done[(finished.group, finished.sample)] = finished
            if out is not None:
                write_episode(out, finished)
            bar.update(1)
        live = still
    bar.close()
    return [done[(g, s)] for g, s, _ in todo]


def _progress(total: int, enabled: bool, desc: str):
    """A bar that goes away when done. In the tutorial's kernels (``agentlab.quiet.in_notebook``) it also leaves one
    line, "<desc>: N in S s": a saved notebook keeps a widget bar only as its first frame."""
    from tqdm.auto import tqdm

    class Summarised(tqdm):
        def close(self):
            if not self.disable and self.n:  # tqdm disables a closed bar: said once
                print(f"{self.desc}: {self.n} in {self.format_dict['elapsed']:.0f} s", flush=True)
            super().close()

    kind = Summarised if in_notebook() else tqdm
    return kind(total=total, desc=desc, disable=not enabled, leave=False)
