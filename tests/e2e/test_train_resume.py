"""`envhub train` killed with SIGKILL at any moment, then `envhub train --resume OUT`: the run
finishes its steps, trains every group that finished before the kill, none twice, and the
checkpoint it resumed from is faithful (training on the groups the uninterrupted run trained
next gives that run's parameters and optimizer state). Real processes throughout: the command
line, its embedded gateway, engine and trainer; the kill is a real SIGKILL (from outside, or
from the process itself at a named place: sdk/failpoints.py)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.orchestrator.training.ledger import GroupJournal
from envhub.sdk.failpoints import ENV as FAILPOINTS
from envhub.trainer.source import StoreSource
from tests.support import envhub, until

pytest.importorskip("torch")

STEPS = 7
# asynchronous (the default): rollouts in flight while the trainer trains; a buffer of 4 groups
RUN = ["arith", "--steps", str(STEPS), "--seed", "3", "--groups", "2", "--k", "2", "--tasks",
       "6", "--max-turns", "2", "--eval-every", "0", "--concurrency", "4"]


def rows(out: Path, phase: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["phase"] == phase]


def trained_groups(out: Path) -> list[str]:
    return [g for r in rows(out) for g in r["groups"]]


def start(out: Path, cwd: Path, *extra: str, env: dict[str, str] | None = None
          ) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "envhub", "train", *RUN, "--out", str(out),
                             *extra], cwd=cwd, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def killed(proc: subprocess.Popen, timeout: float = 400) -> str:
    """The output of a run that must die by SIGKILL (its own failpoint's, or ours)."""
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    return output


def sessions(out: Path) -> list:
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        return [s for g in pool.list_groups() for s in g.sessions]


def check_resumed(out: Path, finished_before: set[str], launched_before: list[str],
                  open_before: set[str]) -> None:
    """The resumed run's record: every step once, each group trained at most once, every
    group that had finished before the kill trained, no session left open, those the kill
    left running closed as env_failure "the run stopped"."""
    steps = rows(out)
    assert [r["step"] for r in steps] == list(range(STEPS)), [r["step"] for r in steps]
    trained = trained_groups(out)
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert finished_before <= set(trained), sorted(finished_before - set(trained))
    assert [r["weight_version"] for r in steps] == list(range(1, STEPS + 1))
    journal = GroupJournal.read(out / "groups.jsonl")
    order = [g for g, _ in journal.launches]
    assert order[:len(launched_before)] == launched_before  # the stream went on after them
    assert len(order) == len(set(order)), "a group id launched twice"
    now = sessions(out)
    assert now and all(s.status != "open" for s in now)
    assert {s.group_id for s in now} <= set(order)
    for s in now:
        if s.id in open_before:  # running at the kill: closed on resume
            assert s.status == "env_failure" and s.reason == "the run stopped", s
            assert s.group_id not in journal.finished
    leftovers = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert leftovers == [f"step-{STEPS - 1:06d}", f"step-{STEPS:06d}"]  # the newest two, no
    # half-written one (--keep-checkpoints' default)


def resume(out: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    done = envhub("train", "--resume", str(out), *extra, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resume: from step" in done.stdout
    return done


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["checkpoint.write=3", "weights.push=4", "random"])
def test_a_run_killed_at_any_moment_goes_on_with_resume_and_trains_each_group_once(
        tmp_path, moment):
    """SIGKILL inside the third checkpoint write (everything written, nothing renamed), inside
    the fourth weight push (exported, not yet served), and at a random moment after the
    second checkpoint; then --resume with no other flag."""
    out = tmp_path / "run"
    if moment == "random":
        seed = random.randrange(1 << 30)
        proc = start(out, tmp_path)
        second = out / "checkpoints" / "step-000002"
        assert until(lambda: second.is_dir() or proc.poll() is not None, 400)
        delay = random.Random(seed).uniform(0.0, 3.0)
        # the moment is what the test varies: a seeded draw after the state it needs
        assert not until(lambda: proc.poll() is not None, delay), proc.communicate()[0][-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        killed(proc)
    else:
        killed(start(out, tmp_path, env={FAILPOINTS: moment}))
        if moment.startswith("checkpoint"):
            assert (out / "checkpoints" / ".step-000003.tmp").is_dir()  # killed mid-write
    journal = GroupJournal.read(out / "groups.jsonl")
    finished_before = set(journal.finished)
    launched_before = [g for g, _ in journal.launches]
    open_before = {s.id for s in sessions(out) if s.status == "open"}
    assert len(rows(out)) >= 2
    resume(out, tmp_path)
    check_resumed(out, finished_before, launched_before, open_before)
    run = json.loads((out / "run.json").read_text())
    [again] = run["resumes"]
    assert again["from_step"] >= 2 and again["checkpoint"].startswith("step-")
    if (out / "metrics.discarded.jsonl").is_file():  # steps after the checkpoint, redone
        gone = [json.loads(x) for x in
                (out / "metrics.discarded.jsonl").read_text().splitlines()]
        assert all(r["discarded_by_resume_from_step"] == again["from_step"] for r in gone)


@pytest.mark.slow
def test_a_checkpoint_is_faithful_training_on_from_it_gives_the_uninterrupted_run(tmp_path):
    """Load checkpoint k of a finished run into a fresh trainer, train on the groups the run
    trained at step k+1 (read back from its pool): parameters and AdamW's moments equal
    checkpoint k+1's, bit for bit."""
    import torch

    from envhub.gateway.config import GatewayConfig
    from envhub.orchestrator.train import load_training_envs
    from envhub.orchestrator.training.config import TrainLoopConfig
    from envhub.orchestrator.training.model import build_trainer
    from envhub.trainer.window import GroupWindow

    out = tmp_path / "run"
    done = envhub("train", *RUN[:2], "3", *RUN[3:], "--out", str(out), "--sync",
                  "--keep-checkpoints", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = TrainLoopConfig(**{k: v for k, v in json.loads(
        (out / "run.json").read_text())["config"].items()})
    envs = load_training_envs(cfg)
    gw = GatewayConfig(port=0, model=cfg.model)

    def loaded(step: int):
        trainer = build_trainer(cfg, gw, envs, None)
        trainer.load_checkpoint(out / "checkpoints" / f"step-{step:06d}")
        return trainer

    step1 = rows(out)[1]
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        window = GroupWindow(pool, None)
        wanted = set(step1["groups"])
        window.restore({g.group_id for g in pool.list_groups()} - wanted)
        groups = window.take(len(wanted))
    assert {g.group_id for g in groups} == wanted
    replayed, recorded = loaded(1), loaded(2)
    stats = replayed.step(groups)
    assert stats["step/skipped"] == step1["trainer/step/skipped"]
    for (name, a), (_, b) in zip(replayed.model.named_parameters(),
                                 recorded.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    state_a, state_b = replayed.optimizer.state_dict(), recorded.optimizer.state_dict()
    assert state_a["state"].keys() == state_b["state"].keys()
    for key, moments in state_a["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, state_b["state"][key][name]), (key, name)
    assert recorded.version == replayed.version + 1  # the push after step 1 bumped it


@pytest.mark.slow
def test_two_fsdp2_ranks_with_lora_resume_after_a_kill(tmp_path):
    """`--nproc-per-node 2 --lora-rank 4`: each rank writes its own DCP shards; a kill of both
    ranks inside the second checkpoint write, then --resume (which restarts torchrun from
    run.json's options) finishes the run."""
    out = tmp_path / "run"
    extra = ["--nproc-per-node", "2", "--lora-rank", "4", "--sync"]
    first = envhub("train", *RUN[:2], "4", *RUN[3:], "--out", str(out), *extra, cwd=tmp_path,
                   env={FAILPOINTS: "checkpoint.write=3"})
    assert first.returncode != 0, first.stdout[-3000:]
    state = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["config"]["lora"]["rank"] == 4
    shards = sorted(p.name for p in (out / "checkpoints" / "step-000002").glob("*.distcp"))
    assert len(shards) == 2, shards  # one per rank
    finished_before = set(GroupJournal.read(out / "groups.jsonl").finished)
    done = envhub("train", "--resume", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = rows(out)
    assert [r["step"] for r in steps] == [0, 1, 2, 3] and all(r["ranks"] == 2 for r in steps)
    trained = trained_groups(out)
    assert len(trained) == len(set(trained)) and finished_before <= set(trained)


@pytest.mark.slow
def test_ctrl_c_writes_a_checkpoint_and_resume_refuses_a_changed_environment(tmp_path):
    """SIGINT stops at a step boundary with a checkpoint and exit 130; --resume goes on. An
    environment whose package changed since the run started is refused (exit 2, the folder
    as it was)."""
    env = tmp_path / "arith2"
    from envhub.orchestrator.catalog import load_env

    shutil.copytree(load_env("arith").folder, env, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "envhub", "train", str(env), *RUN[1:],
                             "--out", str(out)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    second = out / "checkpoints" / "step-000002"
    assert until(lambda: second.is_dir() or proc.poll() is not None, 400)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and f"--resume {out}" in output
    done = rows(out)
    assert len(done) < STEPS  # stopped early ...
    newest = sorted((out / "checkpoints").iterdir())[-1]
    assert newest.name == f"step-{len(done):06d}"  # ... with a checkpoint of where

    (env / "NOTES.md").write_text("changed\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    refused = envhub("train", "--resume", str(out), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "changed" in refused.stderr and "arith" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    (env / "NOTES.md").unlink()  # the package as the run trained on it again
    resume(out, tmp_path)
    assert [r["step"] for r in rows(out)] == list(range(STEPS))
    trained = trained_groups(out)
    assert len(trained) == len(set(trained))
