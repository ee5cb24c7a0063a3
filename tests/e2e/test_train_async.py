"""The asynchronous `envhub train` loop with real rollouts: embedded gateway and engine (the
bundled model), a command-line agent whose model calls go through its session, the trainer's
window over the generation order, weight pushes through POST /admin/weights.

The agent (data/hold_agent.py) makes one call, and on one task (the first group's) waits for an
event before its second call: a file the test writes once the trainer is seen waiting, or the
engine's weight version reaching 1. No timing decides anything: each wait ends on an event.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from envhub.sdk.types import SessionStatus
from envhub.trainer.source import StoreSource

pytest.importorskip("torch")
AGENT = Path(__file__).parent / "data" / "hold_agent.py"


def first_task(seed: int) -> str:
    """The task of the first group a run with `--tasks 2` launches (the seeded task order)."""
    from envhub.orchestrator.train import TrainLoopConfig, load_training_envs
    from envhub.orchestrator.training.tasks import task_stream

    (env,) = load_training_envs(TrainLoopConfig(envs=["arith"], tasks=2, eval_every=0))
    return next(task_stream([env], seed))[1].id


def config(out: Path, hold_mode: str, arg: str, **over: object):
    from envhub.orchestrator.train import TrainLoopConfig

    agent = " ".join(shlex.quote(x) for x in (sys.executable, str(AGENT), "{task_id}",
                                               first_task(0), hold_mode, arg))
    return TrainLoopConfig.model_validate({
        "envs": ["arith"], "steps": 2, "seed": 0, "out": out, "groups": 1, "k": 2,
        "concurrency": 4, "buffer": 2, "tasks": 2, "eval_every": 0, "agent": agent,
        "agent_on_host": True, **over})  # it waits on the test's files and engine


def sessions_by_group(out: Path) -> dict[str, list]:
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        return {g.group_id: [(s, t) for s, t in zip(g.sessions, pool.fetch(
            [s.id for s in g.sessions]), strict=True)] for g in pool.list_groups()}


def train_rows(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "train"]


@pytest.mark.slow
def test_the_window_holds_a_finished_group_until_its_head_is_consumed(tmp_path):
    """Window 1 (strict FIFO): the second group (one call) finishes while the first (two calls
    around a wait) still runs; the trainer waits for the head rather than take it."""
    from envhub.orchestrator.train import train

    out, barrier = tmp_path / "run", tmp_path / "release"
    seen = []

    def on_wait(state) -> None:
        seen.append(state)
        if state.beyond:  # a finished group the window does not admit yet: let the head end
            barrier.touch()

    train(config(out, "file", str(barrier), window=1), log=lambda _: None, on_wait=on_wait)
    blocked = [s for s in seen if s.beyond]
    assert blocked, seen
    head, beyond = blocked[0].head, blocked[0].beyond
    assert head.endswith(":g000000") and len(beyond) == 1 and beyond[0].endswith(":g000001")
    assert not blocked[0].ready
    rows = train_rows(out)
    # the head first, although the other group finished before it
    assert [r["groups"] for r in rows] == [[head], beyond]
    pool = sessions_by_group(out)
    first_done = max(s.closed_at for s, _ in pool[beyond[0]])
    assert all(s.closed_at > first_done and s.status == SessionStatus.done
               for s, _ in pool[head])
    assert [len(t.turns) for _, t in pool[head]] == [2, 2]
    assert [len(t.turns) for _, t in pool[beyond[0]]] == [2, 2]


@pytest.mark.slow
def test_a_push_lands_mid_rollout_and_the_stale_samples_are_dropped(tmp_path):
    """Window 2, tau 0: step 0 trains the second group while the first waits for weight
    version 1; the push lands between the first group's two calls, so each of its sessions
    carries versions 0 and 1, and at step 1 (trainer version 1) they are 1 version old: stale,
    dropped and counted."""
    from envhub.orchestrator.train import train

    out = tmp_path / "run"
    train(config(out, "version", "1", window=2, tau=0), log=lambda _: None)
    rows = train_rows(out)
    assert [r["groups"][0][-7:] for r in rows] == ["g000001", "g000000"]
    assert rows[0]["filter/stale"] == 0 and rows[0]["weight_version"] == 1
    assert rows[1]["filter/stale"] == 2 and rows[1]["versions/mixed_samples"] == 2
    assert rows[1]["staleness/max"] == 1
    held = sessions_by_group(out)[rows[1]["groups"][0]]
    # one trajectory, two weight versions: the turns before and after the update
    assert [[turn.weight_version for turn in t.turns] for _, t in held] == [[0, 1], [0, 1]]
    assert all(s.status == SessionStatus.done for s, _ in held)
