"""Config fields from command-line text (agentlab.fields): one rule for every subcommand's flags."""

import pytest

from agentlab.compare import CompareConfig
from agentlab.experiment import Experiment
from agentlab.fields import field_type, parse_value, typed_values


def test_a_budget_field_whose_default_is_none_takes_ints():
    # The sweep command used to take a field's type from its default: None for max_turns, so --max-turns 2,3 failed.
    assert field_type(Experiment.__dataclass_fields__["max_turns"]) is int
    assert parse_value("max_turns", "2,3", int, many=True) == (2, 3)


def test_the_sweep_command_sweeps_a_budget_field(monkeypatch):
    from agentlab import cli, sweeps

    seen = {}
    monkeypatch.setattr(cli, "load_split", lambda *a, **k: [])
    monkeypatch.setattr(sweeps, "run_sweep", lambda sweep, *a, **k: seen.setdefault("sweep", sweep))
    args = cli.build_parser().parse_args(["sweep", "--name", "budget-sweep", "--max-turns", "2,3"])
    assert args.func(args) == 0
    assert sorted(run.max_turns for run in seen["sweep"].runs.values()) == [2, 3]


def test_tuple_fields_are_comma_separated_and_scalars_are_not():
    values = typed_values(CompareConfig.flat_defaults(), {"sft_steps": "4, 8,16", "grpo_lr": "1e-4", "seed": None})
    assert values == {"sft_steps": (4, 8, 16), "grpo_lr": 1e-4}


def test_a_value_that_does_not_parse_names_its_flag():
    with pytest.raises(ValueError, match=r"^--grpo-lr 'fast': expected float values$"):
        typed_values(CompareConfig.flat_defaults(), {"grpo_lr": "fast"})
