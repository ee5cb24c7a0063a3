"""Issue 25, class 6: an environment's composite weights come from its manifest, never from an
event, on the runner's side (score_group) and the trainer's alike."""

from __future__ import annotations

import pytest

from envhub.envs.rewards import SampleScore, composite, score_group
from envhub.sdk.types import RUNNER, SessionInfo, Trajectory
from envhub.trainer.advantages import composite_reward
from envhub.trainer.config import AdvantageConfig
from tests.envs.conftest import arith_with

GREEDY = '''
from envhub.sdk.types import RewardEvent


class Greedy:
    """A buggy (or hostile) component: it sets its own weight, and claims the outcome's kind."""

    def score(self, group, weights):
        return [[RewardEvent(kind="custom", name="bonus", value=1.0, weight=1000.0),
                 RewardEvent(kind="outcome", name="bonus", value=1.0, weight=1000.0)]
                for s in group]
'''


def scored(tmp_path, rewards: str) -> tuple[list, dict[str, float]]:
    from envhub.envs.loader import load_env

    loaded = load_env(str(arith_with(tmp_path, rewards, module=GREEDY)))
    weights = loaded.manifest.reward_weights()
    (events,) = score_group([SampleScore(1.0, True, 2.0, [], [0, 1])], weights, loaded.rewards)
    return events, weights


def trainer_view(events: list, env: str, weights: dict[str, float]) -> float:
    """The trainer's composite of these events once the runner stored them."""
    t = Trajectory(session=SessionInfo(id="s", env=env), segments=[], turns=[],
                   rewards=[e.model_copy(update={"writer": RUNNER}) for e in events])
    return composite_reward(t, AdvantageConfig(env_reward_weights={env: weights}))


@pytest.mark.parametrize("greedy_weight, expected", [(0.1, 1.0 + 0.2), (0.0, 1.0)])
def test_a_component_setting_weight_1000_gets_its_manifest_weight(tmp_path, greedy_weight: float,
                                                                   expected: float) -> None:
    events, weights = scored(tmp_path, f'outcome = 1.0\ngreedy = {{ weight = {greedy_weight}, '
                                       'component = "rewards:Greedy" }')
    mine = [e for e in events if e.name == "bonus"]
    assert [e.weight for e in mine] == [greedy_weight, greedy_weight]  # not 1000
    assert {e.info["component"] for e in mine} == {"greedy"}
    assert composite(events) == pytest.approx(expected)  # the runner's record
    # the trainer weighs by the component's manifest key (its event says kind "outcome")
    assert trainer_view(events, "arith", weights) == pytest.approx(expected)


def test_runner_and_trainer_agree_on_per_signal_weights(tmp_path) -> None:
    from envhub.envs.loader import load_env
    from envhub.sdk.types import Signal

    folder = arith_with(tmp_path, 'outcome = 1.0\nprocess = 0.1\n"process.tool_error" = 0.5\n'
                                  'greedy = { weight = 0.0, component = "rewards:Greedy" }',
                        module=GREEDY)
    loaded = load_env(str(folder))
    weights = loaded.manifest.reward_weights()
    sample = SampleScore(0.0, False, 2.0, [Signal(name="tool_error", seq=0),
                                           Signal(name="malformed_tool_call", seq=1)], [0, 1])
    (events,) = score_group([sample], weights, loaded.rewards)
    assert composite(events) == pytest.approx(-0.5 - 0.1)
    assert trainer_view(events, "arith", weights) == pytest.approx(-0.5 - 0.1)
