"""A scripted policy replayed as tokens: the engine of tests and demonstrations (no model involved).

    from agentlab.engines.scripted import scripted_generate_fn
    generate = scripted_generate_fn(Renderer(tok, spec.env_class), tasks, spec.expert)
"""

from __future__ import annotations

import re

from agentlab.engines.base import GenerateFn
from agentlab.types import Task


def scripted_generate_fn(renderer, tasks: list[Task], policy) -> GenerateFn:
    """A generate function that 'generates' a scripted policy's calls as tokens (tests, demonstrations).

    Stateless: each sequence is matched to its task by its prompt prefix, and the policy is replayed from the
    start with every tool result found in the sequence so far, so any number of samples per task works.
    """
    prompts = {tuple(renderer.prompt_ids(t)): t for t in tasks}

    def generate(seqs: list[list[int]]) -> list[list[int]]:
        out = []
        for seq in seqs:
            key = next(p for p in prompts if tuple(seq[: len(p)]) == p)
            task = prompts[key]
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", renderer.tok.decode(seq[len(key):]),
                                 flags=re.DOTALL)
            gen = policy(task)
            try:
                call = next(gen)
                for result in results:
                    call = gen.send(result)
            except StopIteration:
                out.append([renderer.tok.eos_token_id])
                continue
            out.append(renderer.assistant_ids(call, task))
        return out

    return generate
