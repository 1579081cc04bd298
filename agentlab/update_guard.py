"""Which GRPO updates reach the optimiser: one callback, just before each optimiser step.

    guard = update_guard(stats, limit=3, skip_zero_signal=True)    # a TrainerCallback; train.build_trainer adds it

Two kinds of step leave the weights alone when this callback says so:

- **a non-finite gradient** (a NaN or inf loss, an overflow) is always skipped, and ``limit`` of them in a row stop
  the run (:class:`TrainingDiverged`): one NaN step ruins the weights.
- **a step with no signal** (``skip_zero_signal``): every group had the same reward for all its rollouts, so every
  advantage is 0 and, with no KL term, the gradient is exactly zero. transformers' Trainer still calls AdamW, and
  AdamW's momentum from the last step that had a signal moves the adapter again: with bias correction the updates
  after one gradient are ~0.67, 0.52, 0.43 … of a full step, in the direction of that one batch's gradient. On the
  AVX2 quickstart every group after step 1 had zero variance, and the adapter moved 0.53 (L2) between checkpoints 6
  and 12 (``benchmarks/results/grpo_zero_signal_drift.json``). Off by default: it changes the algorithm under the
  finished studies; ``benchmarks/zero_signal.py`` measures it against today's behaviour.

Why by hand: neither TRL nor transformers skips an update. Setting every gradient to ``None`` makes the step a true
no-op: AdamW skips a parameter without a gradient and leaves its state (moments, step count) as it was. The learning
rate schedule still advances, by step count, as it would on any step.
"""

from __future__ import annotations

from dataclasses import dataclass


class TrainingDiverged(RuntimeError):
    """Too many updates in a row had non-finite gradients; the run stops (its last checkpoint stays usable)."""


@dataclass
class UpdateState:
    """What the guard decided for the current step, read into that step's metrics line."""

    skipped: bool = False         # the update was skipped: a non-finite gradient
    skipped_in_row: int = 0
    zero_signal: bool = False     # the gradient was exactly zero (every group zero-variance, no KL term)
    skipped_zero_signal: bool = False  # ... and the optimiser was not called for it (skip_zero_signal)


def update_guard(state: UpdateState, limit: int, skip_zero_signal: bool = False):
    """A ``TrainerCallback`` that skips an update whose gradients are not all finite, stops training after ``limit``
    such updates in a row, and (``skip_zero_signal``) skips an update whose gradient is exactly zero."""
    import torch
    from transformers import TrainerCallback

    class UpdateGuard(TrainerCallback):
        def on_pre_optimizer_step(self, args, trainer_state, control, model=None, **kw):
            params = [p for p in model.parameters() if p.grad is not None]
            finite = all(bool(torch.isfinite(p.grad).all()) for p in params)
            state.skipped = not finite
            state.skipped_in_row = 0 if finite else state.skipped_in_row + 1
            state.zero_signal = finite and not any(bool(p.grad.any()) for p in params)
            state.skipped_zero_signal = skip_zero_signal and state.zero_signal
            if state.skipped or state.skipped_zero_signal:
                for p in params:
                    p.grad = None
            if state.skipped_in_row >= limit:
                control.should_training_stop = True

    return UpdateGuard()
