"""Environment feedback enrichment for training: hints in the tool results, held consistent within a group.

Seed 004 (Environments as Scaffold): on sparse-reward agent tasks, adding hints to the environment's feedback
*during training* — procedural action guidance early in an episode and early in training, switching to enriched
state observations later — raised success on the **unmodified** environment by a few points, with a hybrid
schedule beating fixed ones; on some task families it hurt. Feedback is held consistent within a rollout group
(all G rollouts of a prompt see hints or none do), so the group's advantages compare like with like.

    from agentlab.hints import HintSchedule
    exp = Experiment(..., hint_p=0.5, hint_switch=0.5)   # run_grpo builds the observer from these

Evaluation never uses hints: ``evaluate_policy`` and ``agentlab eval`` run the plain environment.

Why hand-written: TRL's ``environment_factory`` has no notion of a group, a training-time schedule or an
observation hook; ours is a small function the shared rollout loop calls on each tool result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentlab.types import Episode, Task, ToolCall, seeded_rng

# observe(episode_so_far, call, result) -> the text the model sees as the tool result
Observer = Callable[[Episode, ToolCall, str], str]


@dataclass(frozen=True)
class HintSchedule:
    """Which groups get hints, and which kind.

    ``p``: probability that a group's feedback is enriched (drawn per (step, group) from ``seed``).
    ``switch``: fraction of training during which enriched groups get *procedural guidance* on their first
    ``guidance_turns`` turns (enriched observations after that); later in training, enriched observations only.
    """

    p: float = 0.5
    switch: float = 0.5
    guidance_turns: int = 1
    seed: int = 0

    def __post_init__(self):
        if not 0 <= self.p <= 1 or not 0 <= self.switch <= 1:
            raise ValueError(f"HintSchedule p={self.p} and switch={self.switch} must lie in [0, 1]")
        if self.guidance_turns < 0:
            raise ValueError(f"HintSchedule guidance_turns={self.guidance_turns} must be >= 0")

    def enriched(self, step: int, group: int) -> bool:
        return seeded_rng("hints", self.seed, step, group).random() < self.p

    def kind(self, step: int, total_steps: int, group: int, turn: int) -> str | None:
        """``"guidance"``, ``"state"`` or ``None`` for the tool results of ``turn`` (1-based) of a group."""
        if not self.enriched(step, group):
            return None
        early_training = step <= self.switch * total_steps
        return "guidance" if early_training and turn <= self.guidance_turns else "state"


# -- the generic hint (an environment may bring its own: EnvSpec.hint) -----------------------------------------


def _generic(kind: str, task: Task, call: ToolCall, result: str, final_tool: str) -> str:
    """Procedural guidance only: an enriched *state* observation says what the plain result does not (which record
    matches, what the task still needs), and only the environment knows that (every shipped one has its own
    ``hint``). A state hint without that knowledge would teach nothing, so an environment without one gets none."""
    if kind == "guidance":
        return f"Hint: when a result answers the question, call `{final_tool}` with it; otherwise search again."
    return ""


def observer(env_name: str, final_tool: str, schedule: HintSchedule, step: int, total_steps: int) -> Observer:
    """The hook ``run_episodes(observe=...)`` calls on every tool result of training step ``step``. What a hint
    says is the environment's own (``EnvSpec.hint``, in its file), else a generic one."""
    from agentlab.envs import load

    own = load(env_name).hint

    def observe(ep: Episode, call: ToolCall, result: str) -> str:
        kind = schedule.kind(step, total_steps, ep.group, len(ep.turns))
        if kind is None or result.startswith("Error:"):
            return result
        hint = own(kind, ep.task, call, result) if own is not None else \
            _generic(kind, ep.task, call, result, final_tool)
        return f"{result}\n{hint}" if hint else result

    return observe

