"""An LLM judge as a reward term (as in the 'How to Train an Agent' tutorial): any OpenAI-compatible endpoint grades the submitted answer 0..1.

Off by default. A judge that cannot be reached raises :class:`~agentlab.types.InfraError`: the loop retries it
with backoff and, if it stays down, the episode is an infra failure, never a 0 reward for the policy.

    >>> from agentlab.types import Episode, Task
    >>> round(llm_judge(Episode(task=Task(id="t", env="lookup", question="q", answer={"value": "Oslo"})),
    ...                 judge=FixedJudge(0.5), weight=0.2), 2)
    0.1
"""

from __future__ import annotations

import functools
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from agentlab.types import Episode, InfraError

JUDGE_PROMPT = (
    "You grade an assistant's final answer against a reference.\n"
    "Question: {question}\nReference answer: {reference}\nSubmitted answer: {answer}\n"
    "Reply with one number between 0 (wrong) and 1 (fully correct), and nothing else."
)


@dataclass(frozen=True)
class Judge:
    """Any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, a hosted API) that grades an answer 0..1.

    The API key is read, at call time, from the environment variable *named* by ``api_key_env`` — the key itself
    is never an attribute, so it cannot reach a config, a log or a run folder. ``api_key_env=""`` sends no key
    (local servers). An unreachable judge raises :class:`InfraError`: its outage is not the policy's fault.
    """

    base_url: str = "http://localhost:8000/v1"
    model: str = "judge"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    prompt: str = JUDGE_PROMPT

    def score(self, question: str, reference: str, answer: str) -> float:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ValueError(f"the judge's API key variable {self.api_key_env!r} is not set (or set "
                                 "api_key_env='' for a server that needs none)")
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 8, "messages": [
            {"role": "user", "content": self.prompt.format(question=question, reference=reference, answer=answer)}]}
        request = urllib.request.Request(self.base_url.rstrip("/") + "/chat/completions",
                                         data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = json.load(response)["choices"][0]["message"]["content"] or ""
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:  # URLError/HTTPError are OSErrors
            status = f" {exc.code}" if isinstance(exc, urllib.error.HTTPError) else ""
            raise InfraError(f"judge at {self.base_url} failed: {type(exc).__name__}{status}") from None
        return grade(text)


def grade(text: str) -> float:
    """The first number in a judge's reply, clipped to 0..1; no number is 0.

    >>> grade("0.8"), grade("Score: 3"), grade("no idea")
    (0.8, 1.0, 0.0)
    """
    number = re.search(r"\d+(?:\.\d+)?", text)
    return min(1.0, max(0.0, float(number.group()))) if number else 0.0


@functools.lru_cache(maxsize=2)
def _local_model(name: str):
    from agentlab.models import load_policy

    return load_policy(name)


@dataclass(frozen=True)
class LocalJudge:
    """The judge as a local model, by default the shipped policy model (SmolLM2-135M): no server, no network.

    Greedy, a few tokens, the same prompt as :class:`Judge`. A 135M model is a weak grader (use a bigger one where
    there is one: any name or folder ``agentlab.models.load_policy`` accepts); what this gives a CPU learner is a
    judged reward that trains end to end offline. Loaded once per process on first use.
    """

    model: str = "smollm2-135m"
    max_new_tokens: int = 6
    prompt: str = JUDGE_PROMPT

    def score(self, question: str, reference: str, answer: str) -> float:
        import torch

        policy, tok = _local_model(self.model)
        messages = [{"role": "user", "content": self.prompt.format(question=question, reference=reference,
                                                                   answer=answer)}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.no_grad():
            out = policy.generate(torch.tensor([ids], device=policy.device), max_new_tokens=self.max_new_tokens,
                                  do_sample=False, pad_token_id=tok.eos_token_id)
        return grade(tok.decode(out[0, len(ids):], skip_special_tokens=True))


def llm_judge(ep: Episode, weight: float = 1.0, judge: Judge | None = None) -> float:
    """``weight ×`` the judge's 0..1 grade of the submitted answer. Use it through ``compose``::

        compose(success=1.0, judge=functools.partial(llm_judge, weight=0.5, judge=Judge(model="qwen")))
    """
    judge = judge or Judge()
    reference = json.dumps(ep.task.answer, sort_keys=True)[:2000]
    return weight * judge.score(ep.task.question, reference, "; ".join(map(str, ep.outcome.final))[:2000])


@dataclass(frozen=True)
class FixedJudge:
    """A judge that gives every answer the same grade (doctests, dry runs of a judged reward)."""

    grade: float = 1.0

    def score(self, question: str, reference: str, answer: str) -> float:
        return self.grade
