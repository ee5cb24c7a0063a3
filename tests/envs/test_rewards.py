"""Composite rewards: each component, weights from the manifest, reward-to-go, language mixing."""

from __future__ import annotations

import pytest

from envhub.envs.rewards import (
    SampleScore,
    components,
    composite,
    mixes_languages,
    process_events,
    reward_to_go,
    score_group,
    time_values,
)
from envhub.sdk.types import RewardEvent, Signal
from tests.envs.conftest import arith_with

WEIGHTS = {"outcome": 1.0, "process": 0.1, "time": 0.2}


def test_time_is_relative_to_the_group_median_for_resolved_samples_only():
    samples = [SampleScore(1.0, True, 10.0), SampleScore(1.0, True, 20.0),
               SampleScore(1.0, True, 30.0), SampleScore(0.0, False, 1.0)]
    values = time_values(samples)
    assert values == pytest.approx([0.5, 0.0, -0.5, 0.0])  # median 20 s; fast failure gets 0


def test_time_needs_two_resolved_samples_and_ignores_subsecond_jitter():
    assert time_values([SampleScore(1.0, True, 5.0), SampleScore(0.0, False, 1.0)]) == [0, 0]
    jitter = time_values([SampleScore(1.0, True, 0.001), SampleScore(1.0, True, 0.003)])
    assert all(abs(v) <= 0.002 for v in jitter)  # scale floored at 1 s


def test_time_is_clipped():
    values = time_values([SampleScore(1.0, True, 10.0), SampleScore(1.0, True, 10.0),
                          SampleScore(1.0, True, 500.0)])
    assert values[2] == -1.0


def test_process_penalties_use_per_signal_weights_and_land_on_turns():
    signals = [Signal(name="malformed_tool_call", seq=1), Signal(name="tool_error", seq=2),
               Signal(name="language_mixing"), Signal(name="not_a_penalty", seq=0)]
    events = process_events(signals, {"process": 0.1, "process.tool_error": 0.5}, last_seq=3)
    assert [(e.name, e.seq, e.value, e.weight) for e in events] == [
        ("malformed_tool_call", 1, -1.0, 0.1), ("tool_error", 2, -1.0, 0.5),
        ("language_mixing", 3, -1.0, 0.1)]


def test_a_call_to_an_undeclared_tool_is_penalised_under_its_old_name_too():
    """The gateway records undeclared_tool; pools recorded before it did say unknown_tool."""
    signals = [Signal(name="undeclared_tool", seq=0), Signal(name="unknown_tool", seq=1)]
    events = process_events(signals, {"process": 0.1}, last_seq=1)
    assert [(e.name, e.seq, e.value) for e in events] == [
        ("undeclared_tool", 0, -1.0), ("unknown_tool", 1, -1.0)]


def test_reward_to_go_sums_the_weighted_future():
    events = [RewardEvent(kind="outcome", value=1.0, weight=1.0),
              RewardEvent(kind="process", value=-1.0, seq=0, weight=0.1),
              RewardEvent(kind="process", value=-1.0, seq=2, weight=0.1)]
    rtg = {e.seq: e.value for e in reward_to_go(events, [0, 1, 2, 3])}
    assert rtg == pytest.approx({0: 0.8, 1: 0.9, 2: 0.9, 3: 1.0})


def test_score_group_emits_every_component_separately():
    samples = [SampleScore(1.0, True, 4.0, [Signal(name="tool_error", seq=0)], [0, 1]),
               SampleScore(1.0, True, 2.0, [], [0])]
    first, second = score_group(samples, WEIGHTS)
    kinds = [e.kind for e in first]
    assert kinds.count("outcome") == 1 and kinds.count("time") == 1
    assert kinds.count("process") == 1 and kinds.count("reward_to_go") == 2
    c = components(first)
    assert c["outcome"] == 1.0 and c["process"] == -1.0
    assert c["time"] == pytest.approx(-1 / 3)  # median 3 s, took 4 s
    assert c["total"] == pytest.approx(1.0 - 0.1 + 0.2 * (-1 / 3))
    assert composite(second) == pytest.approx(1.0 + 0.2 * (1 / 3))


def test_missing_weight_means_stored_but_not_counted():
    (events,) = score_group([SampleScore(0.5, False, 1.0, [Signal(name="tool_error", seq=0)],
                                         [0])], {"outcome": 1.0})
    process = [e for e in events if e.kind == "process"]
    assert process and process[0].weight == 0.0
    assert composite(events) == 0.5


def test_outcome_is_clamped_to_unit_interval():
    (events,) = score_group([SampleScore(7.0, True, 1.0)], WEIGHTS)
    assert events[0].kind == "outcome" and events[0].value == 1.0


@pytest.mark.parametrize("text,mixed", [
    ("The answer is 42 because six times seven is 42.", False),
    ("答案是四十二，因为六乘以七。", False),
    ("The answer is 42 因为六乘以七等于四十二", True),
    ("Ответ: the answer is forty two", True),
    ("Use `print('你好世界你好')` to greet in Chinese.", False),  # code spans are not language
    ("The word 猫 means cat.", False),  # one foreign word is not mixing
])
def test_language_mixing(text, mixed):
    assert mixes_languages(text) is mixed


# --- components from the table and from a manifest --------------------------------------------

def test_a_manifest_lists_its_own_component_beside_the_built_ins(tmp_path):
    from envhub.envs.loader import load_env

    folder = arith_with(tmp_path, 'outcome = 1.0\nbrevity = { weight = 0.5, component = '
                                  '"rewards:Brevity" }')
    loaded = load_env(str(folder))
    assert list(loaded.rewards) == ["outcome", "process", "time", "brevity"]
    weights = loaded.manifest.reward_weights()
    assert weights == {"outcome": 1.0, "brevity": 0.5}
    (events,) = score_group([SampleScore(1.0, True, 2.0, [], [0, 1, 2])], weights,
                            loaded.rewards)
    brevity = [e for e in events if e.kind == "custom"]
    assert [(e.name, e.weight) for e in brevity] == [("brevity", 0.5)]  # its manifest weight
    assert brevity[0].value == pytest.approx(-0.3)
    assert components(events)["custom"] == pytest.approx(-0.3)
    assert composite(events) == pytest.approx(1.0 - 0.15)


def test_a_dotted_path_can_replace_a_built_in(tmp_path):
    from envhub.envs.loader import load_env

    folder = arith_with(tmp_path, 'outcome = { weight = 2.0, component = '
                                  '"envhub.envs.rewards.builtin:CompletionTime" }')
    loaded = load_env(str(folder))
    assert type(loaded.rewards["outcome"]).__name__ == "CompletionTime"


@pytest.mark.parametrize("rewards,error", [
    ("brevity = 0.5", "unknown reward weight 'brevity'"),
    ('"process.a.b" = 1.0', "unknown reward weight"),
    ('brevity = { weight = 1.0, component = "not a path" }', "component = 'module:Class'"),
    ('brevity = { weight = 1.0, component = "rewards:Nope" }', "has no 'Nope'"),
    ('brevity = { weight = 1.0, component = "nowhere.mod:Brevity" }', "No module named"),
])
def test_bad_reward_entries_name_the_field_and_the_fix(tmp_path, rewards, error):
    from envhub.envs.errors import EnvLoadError
    from envhub.envs.loader import load_env
    from envhub.envs.manifest import ManifestError

    folder = arith_with(tmp_path, rewards)
    with pytest.raises((ManifestError, EnvLoadError), match="rewards") as caught:
        load_env(str(folder))
    assert error in str(caught.value)


def test_existing_weights_stay_valid_and_the_built_ins_always_score():
    from envhub.envs.loader import load_env
    from envhub.envs.rewards import REWARDS

    for name in ("arith", "swe-task", "terminal-task"):
        loaded = load_env(name)
        assert list(loaded.rewards) == list(REWARDS)
        assert loaded.manifest.reward_weights() == {"outcome": 1.0, "process": 0.1, "time": 0.05}
