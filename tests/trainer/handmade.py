"""Hand-written trajectories for tests whose expectations are computed by hand."""

from __future__ import annotations

from envhub.sdk.types import (
    RUNNER,
    RewardEvent,
    Segment,
    SessionInfo,
    SessionStatus,
    Trajectory,
    Turn,
)


def trajectory(sid: str, group: str = "g", *, reward: float = 0.0,
               versions: tuple[int, ...] = (0, 0), status: str = "done",
               created_at: float = 0.0, index: int = 0,
               turn_rewards: dict[int, float] | None = None) -> Trajectory:
    """One segment, two turns: prompt [1,2,3] + sampled [10,11], tool [4] + sampled [12].

    `versions` are the weight versions of the two turns' sampled tokens.
    """
    turns = [
        Turn(seq=0, segment=0, prompt_delta_ids=[1, 2, 3], completion_ids=[10, 11],
             completion_logprobs=[-0.5, -0.25], weight_version=versions[0], finish_reason="stop"),
        Turn(seq=1, segment=0, prompt_delta_ids=[4], completion_ids=[12],
             completion_logprobs=[-1.0], weight_version=versions[1], finish_reason="stop"),
    ]
    seg = Segment(index=0, token_ids=[1, 2, 3, 10, 11, 4, 12], loss_mask=[0, 0, 0, 1, 1, 0, 1],
                  logprobs=[0, 0, 0, -0.5, -0.25, 0, -1.0],
                  weight_versions=[-1, -1, -1, versions[0], versions[0], -1, versions[1]],
                  turn_seqs=[0, 1])
    rewards = [RewardEvent(kind="outcome", value=reward, writer=RUNNER)]
    rewards += [RewardEvent(kind="process", value=v, seq=s, writer=RUNNER)
                for s, v in (turn_rewards or {}).items()]
    st = SessionStatus(status)
    info = SessionInfo(id=sid, group_id=group, sample_index=index, status=st,
                       created_at=created_at)
    return Trajectory(session=info, segments=[seg], turns=turns, rewards=rewards, status=st)
