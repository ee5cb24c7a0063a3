"""Checkpoints of `envhub train`: faithful (training on from checkpoint k gives the run's own
step k+1, bit for bit), written by every FSDP2 rank with LoRA and resumed, written on Ctrl-C;
and a resume that would train on a changed environment is refused. The kill-at-any-moment
tests are in test_train_resume.py."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest

from envhub.orchestrator.training.ledger import GroupJournal
from envhub.sdk.failpoints import ENV as FAILPOINTS
from envhub.trainer.source import StoreSource
from tests.e2e.test_train_resume import RUN, STEPS, resume, rows, trained_groups
from tests.support import envhub, until

pytest.importorskip("torch")


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


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_stops_two_ranks_with_a_checkpoint(tmp_path):
    """`--nproc-per-node 2`: a Ctrl-C at the terminal (SIGINT to the whole foreground process
    group) reaches rank 0 alone, through the command; it stops at a step boundary, both ranks
    write their shards of the checkpoint, the command exits 130 with no traceback and
    --resume finishes the run. Before, every rank and torchrun got the signal: the followers
    died inside the checkpoint and torchrun ended rank 0."""
    import os

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "envhub", "train", *RUN[:2], "4", *RUN[3:],
                             "--out", str(out), "--nproc-per-node", "2", "--sync"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its group: the terminal's
    first = out / "checkpoints" / "step-000001"
    assert until(lambda: first.is_dir() or proc.poll() is not None, 600)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and f"--resume {out}" in output, output[-3000:]
    done = rows(out)
    assert len(done) < 4
    newest = sorted((out / "checkpoints").iterdir())[-1]
    assert newest.name == f"step-{len(done):06d}", output[-3000:]
    assert len(list(newest.glob("*.distcp"))) == 2  # both ranks wrote theirs
    resumed = envhub("train", "--resume", str(out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [r["step"] for r in rows(out)] == [0, 1, 2, 3]
    trained = trained_groups(out)
    assert len(trained) == len(set(trained))
