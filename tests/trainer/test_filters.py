"""Staleness cut, env-failure exclusion and group padding against hand-computed cases."""

from __future__ import annotations

from envhub.trainer.batch import build_batch
from envhub.trainer.config import FilterConfig, TrainerConfig
from envhub.trainer.filters import DropCounts, drop_reason, filter_group, oldest_version
from envhub.trainer.source import Group
from tests.trainer.handmade import trajectory


def test_staleness_uses_the_oldest_sampled_version() -> None:
    t = trajectory("a", versions=(3, 5))
    assert oldest_version(t) == 3
    cfg = FilterConfig(tau=2)
    # w' - w0 > tau drops: 5 - 3 = 2 keeps, 6 - 3 = 3 drops.
    assert drop_reason(t, cfg, trainer_version=5) is None
    assert drop_reason(t, cfg, trainer_version=6) == "stale"
    assert drop_reason(t, FilterConfig(tau=None), trainer_version=100) is None
    assert drop_reason(t, FilterConfig(tau=0), trainer_version=3) is None
    assert drop_reason(t, FilterConfig(tau=0), trainer_version=4) == "stale"


def test_env_failure_excluded_and_agent_error_kept() -> None:
    cfg = FilterConfig()
    assert drop_reason(trajectory("a", status="env_failure"), cfg, 0) == "env_failure"
    assert drop_reason(trajectory("b", status="agent_error"), cfg, 0) is None
    assert drop_reason(trajectory("c", status="open"), cfg, 0) == "open"
    keep = FilterConfig(exclude_env_failures=False)
    assert drop_reason(trajectory("a", status="env_failure"), keep, 0) is None


def test_group_padding_repeats_valid_samples_in_order() -> None:
    # 8 samples: 2 env failures, 1 stale -> 5 valid > 8/2 -> padded with valid[0..2].
    ts = [trajectory(f"s{i}", index=i, reward=float(i), versions=(3, 4)) for i in range(8)]
    ts[1] = trajectory("s1", index=1, status="env_failure")
    ts[4] = trajectory("s4", index=4, status="env_failure")
    ts[6] = trajectory("s6", index=6, versions=(0, 9))  # 5 - 0 > 4: stale (others 5 - 3)
    drops = DropCounts()
    out = filter_group(Group("g", ts), FilterConfig(tau=4), trainer_version=5, drops=drops)
    assert out is not None and out.n_valid == 5
    assert [t.session.id for t in out.samples] == ["s0", "s2", "s3", "s5", "s7", "s0", "s2", "s3"]
    assert drops.samples == {"env_failure": 2, "stale": 1}
    assert drops.padded == 3


def test_group_with_half_valid_is_dropped() -> None:
    # 4 of 8 valid is not "more than half": the whole group goes, and is counted.
    ts = [trajectory(f"s{i}", index=i, status="env_failure" if i % 2 else "done")
          for i in range(8)]
    drops = DropCounts()
    assert filter_group(Group("g", ts), FilterConfig(), 0, drops) is None
    assert drops.samples == {"env_failure": 4, "group_dropped_samples": 4}
    assert drops.groups == {"group_under_half": 1}
    m = drops.metrics()
    assert m["drop/env_failure"] == 4 and m["drop_groups/group_under_half"] == 1


def test_expected_group_size_pads_a_short_group() -> None:
    # Only 3 sessions listed but 4 expected: 3 > 2 -> pad one copy of valid[0].
    ts = [trajectory(f"s{i}", index=i) for i in range(3)]
    drops = DropCounts()
    out = filter_group(Group("g", ts), FilterConfig(group_size=4), 0, drops)
    assert out is not None and [t.session.id for t in out.samples] == ["s0", "s1", "s2", "s0"]


def test_batch_metrics_count_every_drop() -> None:
    g1 = Group("g1", [trajectory(f"a{i}", "g1", index=i, reward=i) for i in range(4)])
    g2 = Group("g2", [trajectory(f"b{i}", "g2", index=i, status="env_failure") for i in range(4)])
    batch = build_batch([g1, g2], TrainerConfig(), trainer_version=0)
    m = batch.metrics()
    assert m["batch/groups"] == 1 and m["batch/sequences"] == 4
    assert m["drop/env_failure"] == 4 and m["drop_groups/group_under_half"] == 1
    assert m["drop/group_dropped_samples"] == 0
    assert m["reward/mean"] == 1.5


def test_groups_without_signal_are_dropped_only_when_asked() -> None:
    """All samples scored alike (rewards 1, 1): every advantage is 0, so with drop_no_signal the
    group leaves the batch (its 3 sampled tokens x 2 no longer dilute the normaliser); a group
    whose equal totals (1 - 1 and 0) come with a turn-level reward still has signal and stays."""
    flat = Group("flat", [trajectory(f"f{i}", "flat", index=i, reward=1.0) for i in range(2)])
    turn = Group("turn", [trajectory(f"t{i}", "turn", index=i, reward=1.0 - i,
                                     turn_rewards={0: -1.0} if i == 0 else None)
                          for i in range(2)])
    varied = Group("varied", [trajectory(f"v{i}", "varied", index=i, reward=float(i))
                              for i in range(2)])
    kept = build_batch([flat, turn, varied], TrainerConfig(), 0)
    assert kept.metrics()["batch/groups"] == 3 and len(kept.sequences) == 6
    cfg = TrainerConfig(filters=FilterConfig(drop_no_signal=True))
    batch = build_batch([flat, turn, varied], cfg, 0)
    m = batch.metrics()
    assert m["drop_groups/no_signal"] == 1 and m["batch/groups"] == 2
    assert {s.group_id for s in batch.sequences} == {"turn", "varied"}
    assert sum(s.n_loss_tokens for s in batch.sequences) == 4 * 3
    assert m["reward/mean"] == (1 + 1 + 0 + 0 + 0 + 1) / 6  # rewards still reported


def test_the_batch_says_what_it_made_of_each_group() -> None:
    """`fates`: samples trained per group (what the launch mix and /metrics count) and those
    dropped as stale; a group dropped (under half valid, or no signal) trained none."""
    padded = Group("padded", [trajectory(f"p{i}", "padded", index=i, reward=float(i),
                                         versions=(0, 0) if i == 3 else (3, 3))
                              for i in range(4)])  # one stale of 4: 3 trained, 1 copy padded
    stale = Group("stale", [trajectory(f"s{i}", "stale", index=i, reward=float(i),
                                       versions=(0, 0) if i else (3, 3)) for i in range(4)])
    flat = Group("flat", [trajectory(f"f{i}", "flat", index=i, reward=1.0, versions=(3, 3))
                          for i in range(4)])
    cfg = TrainerConfig(filters=FilterConfig(tau=2, drop_no_signal=True))
    fates = build_batch([padded, stale, flat], cfg, trainer_version=3).fates
    assert {g: (f.trained, f.stale) for g, f in fates.items()} == {
        "padded": (3, 1), "stale": (0, 3), "flat": (0, 0)}


def with_side_chain(t):
    """Add a one-turn side conversation (a CLI's title call) as chain 2, segment 1."""
    side = t.turns[0].model_copy(update={"seq": 2, "segment": 1, "chain": 2})
    seg = t.segments[0].model_copy(update={
        "index": 1, "token_ids": [7, 8, 20], "loss_mask": [0, 0, 1], "logprobs": [0, 0, -2.0],
        "weight_versions": [-1, -1, 0], "turn_seqs": [2], "chain": 2})
    return t.model_copy(update={"turns": [*t.turns, side], "segments": [*t.segments, seg]})


def test_chains_main_trains_only_the_main_conversation() -> None:
    """The main chain has 2 turns, the side chain 1: with chains='main' only segment 0 of each
    sample is trained and the side segments are counted; 'all' (the default) keeps both."""
    group = Group("g", [with_side_chain(trajectory(f"s{i}", "g", index=i, reward=float(i)))
                        for i in range(2)])
    assert group.trajectories[0].main_chain() == 0
    everything = build_batch([group], TrainerConfig(), 0)
    assert [s.segment for s in everything.sequences] == [0, 1, 0, 1]
    main = build_batch([group], TrainerConfig(filters=FilterConfig(chains="main")), 0)
    assert [s.segment for s in main.sequences] == [0, 0]
    assert main.metrics()["drop_sequences/side_chain"] == 2
    # the advantages of what is kept do not change
    assert [s.advantages for s in main.sequences] == [
        s.advantages for s in everything.sequences if s.segment == 0]
