"""Fault injection: same tools as TRL sees them, deterministic faults at the requested rate, recoverable by retry."""

import inspect

import pytest

from agentlab import faults
from agentlab.envs import load
from agentlab.envs.lookup import LookupEnv
from agentlab.faults import DroppedConnection, ToolCrash, ToolTimeout, fault_for, faulty_spec, inject_faults
from agentlab.types import InfraError, ToolCall, ToolEnv, call_tool, run_policy, tool_names


@pytest.fixture(scope="module")
def lookup():
    return load("lookup")


def run_with_retries(spec, task, policy, retries: int = 5, max_calls: int = 30):
    """A tiny version of what the rollout loop does: retry a call that raised InfraError (no backoff needed)."""
    env = spec.make_env()
    env.reset(task=task.to_json())
    gen, history, result, caught = policy(task), [], None, []
    try:
        for _ in range(max_calls):
            call = gen.send(result) if history else next(gen)
            for _attempt in range(retries + 1):
                calls_before = env.outcome.tool_calls
                try:
                    result = call_tool(env, call)
                    break
                except InfraError as exc:
                    assert env.outcome.tool_calls == calls_before + 1  # counted, as a real env fault is
                    env.outcome.tool_calls = calls_before  # a failed attempt is not the policy's call
                    caught.append(exc)
            else:
                raise RuntimeError(f"{call.name} kept failing after {retries} retries")
            history.append((call, result))
            if env.done:
                break
    except StopIteration:
        pass
    return env, history, caught




def test_faulty_env_exposes_the_same_tools_to_trl():
    from transformers.utils import get_json_schema  # what TRL renders into the prompt

    faulty = inject_faults(LookupEnv, rate=0.3, seed=1)
    assert issubclass(faulty, LookupEnv) and issubclass(faulty, ToolEnv)
    assert tool_names(faulty) == tool_names(LookupEnv)
    env, plain = faulty(), LookupEnv()
    for name in tool_names(LookupEnv):
        wrapped, original = getattr(faulty, name), getattr(LookupEnv, name)
        assert wrapped is not original and wrapped.__name__ == name and wrapped.__doc__ == original.__doc__
        assert inspect.signature(wrapped) == inspect.signature(original)
        assert get_json_schema(getattr(env, name)) == get_json_schema(getattr(plain, name))
    # TRL lists tools with inspect.getmembers(type(env), inspect.isfunction); no new public members.
    public = {n for n, _ in inspect.getmembers(faulty, inspect.isfunction) if not n.startswith("_")}
    assert public == set(tool_names(LookupEnv)) | {"reset", "get_reward"}


def test_fault_kinds_are_infra_errors_with_familiar_bases():
    assert issubclass(ToolTimeout, TimeoutError) and issubclass(DroppedConnection, ConnectionError)
    assert all(issubclass(k, InfraError) for k in (ToolCrash, ToolTimeout, DroppedConnection))
    with pytest.raises(ValueError, match="rate"):
        inject_faults(LookupEnv, rate=1.5)
    with pytest.raises(ValueError, match="kinds"):
        inject_faults(LookupEnv, rate=0.1, kinds=("meteor",))


def test_rate_extremes_and_determinism(lookup):
    task = lookup.make_tasks("train", 1, seed=0)[0]
    outcome, _ = run_policy(faulty_spec(lookup, rate=0.0), task, lookup.expert)
    assert lookup.evaluate(task, outcome)["success"] == 1.0
    with pytest.raises(InfraError):
        run_policy(faulty_spec(lookup, rate=1.0), task, lookup.expert)
    draws = [fault_for(3, task.id, a, 0.5, tuple(faults.FAULTS)) for a in range(300)]
    assert draws == [fault_for(3, task.id, a, 0.5, tuple(faults.FAULTS)) for a in range(300)]
    assert set(draws) == {None, "exception", "timeout", "dropped"}
    assert draws != [fault_for(4, task.id, a, 0.5, tuple(faults.FAULTS)) for a in range(300)]


def test_faults_are_counted_and_retries_recover_the_fault_free_result(lookup):
    tasks = lookup.make_tasks("train", 200, seed=0)
    spec = faulty_spec(lookup, rate=0.1, seed=11)
    caught = reported = attempts = predicted = 0
    kinds = set()
    for task in tasks:
        clean_outcome, clean_history = run_policy(lookup, task, lookup.expert)
        env, history, errors = run_with_retries(spec, task, lookup.expert)
        assert env.outcome == clean_outcome and history == clean_history
        assert lookup.evaluate(task, env.outcome) == lookup.evaluate(task, clean_outcome)
        assert [f["attempt"] for f in env._faults] == sorted(f["attempt"] for f in env._faults)
        caught += len(errors)
        reported += len(env._faults)
        attempts += env._fault_attempt
        predicted += sum(fault_for(11, task.id, a, 0.1, tuple(faults.FAULTS)) is not None
                         for a in range(env._fault_attempt))
        kinds |= {type(e) for e in errors}
    assert caught == reported == predicted
    assert attempts == 400 + caught  # two calls per expert episode, plus one retry per fault
    assert 0.05 < caught / attempts < 0.15
    assert kinds == {ToolCrash, ToolTimeout, DroppedConnection}


def test_instances_reset_their_per_episode_log(lookup):
    spec = faulty_spec(lookup, rate=0.5, seed=2)
    env = spec.make_env()
    total = 0
    for task in lookup.make_tasks("train", 5, seed=0):
        env.reset(task=task.to_json())  # TRL reuses one instance across episodes
        for _ in range(6):
            try:
                call_tool(env, ToolCall("search_people", {"query": "Ada Vell"}))
            except InfraError:
                pass
        assert all(f["task"] == task.id for f in env._faults)
        total += len(env._faults)
    assert env._fault_total == total > 0


def test_reset_faults_fire_per_reset_attempt_and_tool_faults_can_be_off(lookup):
    spec = faulty_spec(lookup, rate=1.0, sites=("reset",))
    task = lookup.make_tasks("test", 1, seed=0)[0]
    with pytest.raises(InfraError, match="reset: injected"):
        spec.make_env().reset(task=task.to_json())
    calm = faulty_spec(lookup, rate=1.0, sites=("reset",), name="lookup-reset-only")
    assert calm.name == "lookup-reset-only"
    env = inject_faults(LookupEnv, rate=1.0, sites=("tool",))()
    env.reset(task=task.to_json())  # resets never fail when only tools are faulty
    with pytest.raises(ValueError, match="sites"):
        inject_faults(LookupEnv, rate=0.5, sites=("disk",))


def test_flaky_generation_and_judge_raise_infra_kinds_deterministically():
    gen = faults.flaky_generate(lambda seqs: [[1] for _ in seqs], rate=1.0)
    with pytest.raises(ConnectionError):
        gen([[0]])
    assert faults.flaky_generate(lambda seqs: [[7]], rate=0.0)([[0]]) == [[7]]
    term = faults.FlakyTerm(rate=1.0)
    with pytest.raises(TimeoutError):
        term(None)
    fates = [faults.fault_for(3, "generate", n, 0.5, ("dropped",)) for n in range(20)]
    assert fates == [faults.fault_for(3, "generate", n, 0.5, ("dropped",)) for n in range(20)] and None in fates


@pytest.mark.parametrize("kind", ["tool", pytest.param("reset", marks=pytest.mark.slow), "generation",
                                  pytest.param("judge", marks=pytest.mark.slow)])
def test_a_grpo_run_under_faults_never_crashes_loses_nothing_and_blames_infra(kind, tmp_path):
    """The reliability table's measurement, small: every fault that outlives its retries is infra, nothing else is,
    and the run folder holds every rollout and metric line exactly once."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))  # the study lives with the benchmarks
    from reliability import reliability_case

    row = reliability_case(kind, 0.5, tmp_path / "r", steps=2)
    assert not row["crashed"], row["crash"]
    assert row["faults_injected"] > 0 and row["broken_by_faults"] > 0  # the faults really struck
    assert row["attributed_to_infra"] == 1.0 and row["mislabelled_infra"] == 0
    assert row["lost_records"] == 0 and row["duplicate_records"] == 0 and row["metrics_lines"] == 2
