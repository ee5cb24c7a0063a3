"""`envhub train` driven like a user: the real command line runs the whole loop — embedded
gateway and engine, built-in agent rollouts, trainer step, weights pushed back to the engine —
and what it leaves in OUT (metrics, pool, weights) shows each piece did its part."""

from __future__ import annotations

import json

import pytest

from envhub.orchestrator.train import task_schedule
from envhub.trainer.source import StoreSource
from tests.support import envhub

pytest.importorskip("torch")


@pytest.mark.slow
def test_train_arith_runs_the_loop_and_the_engine_samples_the_new_weights(tmp_path):
    out = tmp_path / "run"
    done = envhub("train", "arith", "--steps", "3", "--seed", "3", "--out", str(out),
                  "--groups", "2", "--k", "2", "--tasks", "2", "--max-turns", "3",
                  "--keep-weights", "1", "--sync-every", "2", "--reset-optimizer",
                  "--no-std-norm", "--gradient-checkpointing", "--sync", "--eval-every", "0",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in rows} == {"train"}
    assert [r["step"] for r in rows] == [0, 1, 2]
    # --sync-every 2: a push after step 1, and one after the last step
    assert [r["weight_version"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["rollouts"] == 4 and r["env_failures"] == 0 and r["groups_trained"] >= 1
        assert 0.0 <= r["resolved_rate"] <= 1.0 and isinstance(r["reward_mean"], float)
        # The step trained on recorded tokens, or every group scored alike (no signal) and
        # the optimizer step was skipped, counted as such.
        assert r["trainer/tokens/packed"] > 0 or (
            r["trainer/step/skipped"] == 1 and r["trainer/drop_groups/no_signal"] == 2), r
        # the group ledger's counts, also for one environment (envhub view's per-task table)
        assert r["mix/arith/launched_groups"] == 2 * (r["step"] + 1) == r["groups_launched"]
        assert 0 <= r["mix/arith/trained_samples"] <= 4 * (r["step"] + 1)
        assert r["mix/arith/stale_samples"] == 0
    assert [r["mix/arith/trained_samples"] for r in rows] == sorted(
        r["mix/arith/trained_samples"] for r in rows)
    kept = sorted(p.name for p in (out / "weights").iterdir())
    assert kept == ["v000002"]  # the pushed weights: the newest kept, older ones pruned
    # a model folder the gateway serves as it is: the tokenizer and chat template came along
    from envhub.gateway.render.chat_template import ChatRenderer

    renderer = ChatRenderer.from_pretrained(out / "weights" / "v000002")
    assert renderer.chat_template
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        groups = pool.list_groups()
        assert len(groups) == 6 and all(g.finished() for g in groups)
        versions = [{t.weight_version for tr in pool.fetch([s.id for s in g.sessions])
                     for t in tr.turns} for g in groups]
    # Steps 0 and 1 were sampled by version 0 (no push in between), step 2 by version 1: the
    # trainer's update reached the engine through POST /admin/weights.
    assert versions[:4] == [{0}] * 4 and versions[4:] == [{1}, {1}], versions


def test_train_rejects_bad_input_with_exit_2(tmp_path):
    unknown = envhub("train", "no-such-env", "--steps", "1", "--out", str(tmp_path / "a"),
                     cwd=tmp_path, timeout=120)
    assert unknown.returncode == 2 and "no-such-env" in unknown.stderr
    missing = envhub("train", "arith", "--model", str(tmp_path / "nowhere"), cwd=tmp_path,
                     timeout=120)
    assert missing.returncode == 2 and "--model" in missing.stderr
    zero = envhub("train", "arith", "--steps", "0", cwd=tmp_path, timeout=120)
    assert zero.returncode == 2
    fp16 = envhub("train", "arith", "--precision", "fp16", cwd=tmp_path, timeout=120)
    assert fp16.returncode == 2 and "--precision" in fp16.stderr
    alpha = envhub("train", "arith", "--lora-alpha", "8", cwd=tmp_path, timeout=120)
    assert alpha.returncode == 2 and "--lora-rank" in alpha.stderr
    for args, says in [(["arith=0"], "weight"), (["arith", "arith=2"], "once"),
                       (["arith", "--eval-tasks", "512"], "--eval-tasks"),
                       (["arith", "--groups", "4", "--buffer", "2"], "buffer"),
                       (["arith", "--agent", "no-such-agent-program"], "no-such-agent"),
                       (["arith", "--schedule", "lifo"], "fifo, seer"),
                       (["arith", "--schedule", "no_such_module:Policy"], "cannot load"),
                       (["arith", "--executor", "nosuch"], "inprocess, ray")]:
        bad = envhub("train", *args, "--out", str(tmp_path / "a"), cwd=tmp_path, timeout=120)
        assert bad.returncode == 2 and says in bad.stderr, (args, bad.stderr[-2000:])
        assert "Traceback" not in bad.stderr
    import shutil

    from envhub.envs.loader import load_env

    shutil.copytree(load_env("arith").folder, tmp_path / "same-name")  # also named arith
    twin = envhub("train", "arith", str(tmp_path / "same-name"), "--out", str(tmp_path / "a"),
                  cwd=tmp_path, timeout=120)
    assert twin.returncode == 2 and "named 'arith' too" in twin.stderr, twin.stderr[-2000:]
    assert not (tmp_path / "a").exists() and not (tmp_path / "runs").exists()  # nothing written


def tree(folder):
    """Every file under `folder` (path -> bytes) and every folder: what "left as it was" means."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


CONFIG = """# a small synchronous run, every option by its flag's name
steps = 1
seed = 5
groups = 1
k = 2
tasks = 1
max-turns = 2
sync = true
eval_every = 0
tau = "none"
"""
FLAGS = ["--steps", "1", "--seed", "5", "--groups", "1", "--k", "2", "--tasks", "1",
         "--max-turns", "2", "--sync", "--eval-every", "0", "--tau", "none"]


def test_a_run_writes_run_json_reads_a_config_file_and_never_overwrites_a_run(tmp_path):
    """`--config FILE.toml` gives the run the flags would (the resolved config in run.json is
    the same but for --out), with the provenance beside it; a second `envhub train` into a
    folder that holds a run exits 2 and leaves it byte for byte as it was; `--overwrite`
    replaces it, and a flag overrides the file."""
    (tmp_path / "run.toml").write_text(CONFIG)
    from_file = envhub("train", "arith", "--config", str(tmp_path / "run.toml"), "--out",
                       str(tmp_path / "a"), cwd=tmp_path)
    assert from_file.returncode == 0, from_file.stderr[-3000:]
    from_flags = envhub("train", "arith", *FLAGS, "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert from_flags.returncode == 0, from_flags.stderr[-3000:]
    a, b = (json.loads((tmp_path / x / "run.json").read_text()) for x in "ab")
    assert {**a["config"], "out": None} == {**b["config"], "out": None}
    assert a["config"]["tau"] is None and a["config"]["steps"] == 1 and a["config"]["sync"]
    for run in (a, b):
        assert run["git"] is None or len(run["git"]["commit"]) == 40
        assert run["lock"].startswith("sha256:") and run["model"]["digest"].startswith("sha256:")
        [arith] = run["environments"]
        assert arith["name"] == "arith" and arith["digest"].startswith("sha256:")
        assert run["torch"] and run["transformers"] and run["device"]["train_device"] == "cpu"
    assert a["environments"] == b["environments"] and a["model"] == b["model"]
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 1

    before = tree(tmp_path / "a")
    again = envhub("train", "arith", *FLAGS, "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert again.returncode == 2, again.stderr[-2000:]
    assert "holds a run" in again.stderr and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert tree(tmp_path / "a") == before

    bad = tmp_path / "bad.toml"
    bad.write_text("steps = 1\nno_such_option = 3\n")
    unknown = envhub("train", "arith", "--config", str(bad), "--out", str(tmp_path / "c"),
                     cwd=tmp_path)
    assert unknown.returncode == 2 and "no_such_option" in unknown.stderr, unknown.stderr
    assert not (tmp_path / "c").exists()

    over = envhub("train", "arith", "--config", str(tmp_path / "run.toml"), "--seed", "6",
                  "--overwrite", "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert over.returncode == 0, over.stderr[-3000:]
    c = json.loads((tmp_path / "a" / "run.json").read_text())
    assert c["config"]["seed"] == 6 and c["config"]["groups"] == 1  # the flag, then the file
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_train_on_two_ranks_with_lora_in_bf16_pushes_merged_weights(tmp_path):
    """`--nproc-per-node 2` re-runs the command under torchrun: rank 0 runs the gateway and
    the rollouts, both ranks train the FSDP2-sharded LoRA model, rank 0 pushes merged
    weights (a full HF folder, no adapter files) that the engine serves from then on."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    done = envhub("train", "arith", "--steps", "2", "--seed", "3", "--out", str(out),
                  "--groups", "4", "--k", "4", "--tasks", "4", "--max-turns", "3",
                  "--nproc-per-node", "2", "--lora-rank", "4", "--precision", "bf16",
                  "--sync", "--eval-every", "0", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["phase"] == "train"]
    assert [(r["step"], r["ranks"], r["weight_version"]) for r in rows] == [(0, 2, 1),
                                                                            (1, 2, 2)]
    assert any(r["trainer/step/skipped"] == 0 and r["trainer/tokens/packed"] > 0
               for r in rows), rows
    folder = out / "weights" / "v000002"
    assert not list(folder.glob("adapter_*"))
    _, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        groups = pool.list_groups()
        versions = [{t.weight_version for tr in pool.fetch([s.id for s in g.sessions])
                     for t in tr.turns} for g in groups]
    assert versions[4:] == [{1}] * 4, versions  # step 1 sampled the pushed version 1


def test_task_schedule_passes_over_every_task_once_per_epoch():
    ids = [f"t{i}" for i in range(8)]
    steps = task_schedule(ids, steps=6, groups=4, seed=1)
    assert all(len(s) == 4 for s in steps)
    for epoch in range(3):  # 8 tasks / 4 per step: each two steps hold every task once
        assert sorted(steps[2 * epoch] + steps[2 * epoch + 1]) == sorted(ids)
    assert steps[:2] != steps[2:4]  # a fresh order each pass
    assert steps == task_schedule(ids, steps=6, groups=4, seed=1)  # and seeded


def test_optimizer_reset_defaults_to_pushes_after_several_steps():
    """A reset before every step (--sync-every 1) would make each AdamW step lr * sign(g): by
    default the moments are cleared only after a push that follows two or more steps."""
    from envhub.orchestrator.train import TrainLoopConfig

    def resets(**kw):
        return TrainLoopConfig(envs=["arith"], **kw).resets_optimizer

    assert not resets() and resets(sync_every=2) and resets(sync_every=4)
    assert not resets(sync=True, sync_every=2)
    assert resets(reset_optimizer=True) and not resets(sync_every=4, reset_optimizer=False)


def test_task_stream_interleaves_environments_by_weight_and_holds_out_tasks():
    from envhub.envs.environment import Task
    from envhub.orchestrator.training.tasks import EnvTasks, split_tasks, task_stream

    def tasks(prefix: str, n: int) -> list[Task]:
        return [Task(f"{prefix}{i}", "") for i in range(n)]

    train_a, held_a = split_tasks(tasks("a", 10), None, 2)
    assert [t.id for t in held_a] == ["a8", "a9"] and len(train_a) == 8
    assert [t.id for t in split_tasks(tasks("a", 10), 3, 2)[0]] == ["a0", "a1", "a2"]
    with pytest.raises(ValueError, match="--eval-tasks"):
        split_tasks(tasks("a", 4), None, 4)
    envs = [EnvTasks("a", "a", 3.0, train_a, held_a), EnvTasks("b", "b", 1.0, tasks("b", 5), [])]
    drawn = [next(s) for s in [task_stream(envs, seed=0)] for _ in range(40)]
    names = [e.name for e, _ in drawn]
    assert names.count("a") == 30 and names.count("b") == 10  # 3:1
    assert all(names[i:i + 4].count("b") == 1 for i in range(0, 40, 4))  # at its pace
    assert not {t.id for _, t in drawn} & {"a8", "a9"}  # held-out tasks are never trained on
    # one environment: the same order as the synchronous schedule
    ids = [t.id for t in train_a]
    one = task_stream([EnvTasks("a", "a", 1.0, train_a, [])], seed=5)
    assert [next(one)[1].id for _ in range(16)] == sum(task_schedule(ids, 4, 4, 5), [])


def test_task_stream_interleaves_a_stratified_environments_kinds_by_share(tmp_path):
    """arith's manifest stratifies by `family`: every stretch of the stream holds each family
    within two tasks of its share (across a pass boundary too), each pass still covers every
    training task once, in a seeded order; the held-out tasks are each family's last, by its
    share; a field no task has is refused with the fix."""
    import dataclasses
    import shutil

    from envhub.envs.loader import load_env
    from envhub.orchestrator.train import TrainLoopConfig, load_training_envs
    from envhub.orchestrator.training.tasks import split_tasks, task_stream

    (env,) = load_training_envs(TrainLoopConfig(envs=["arith"]))
    assert env.stratify == "family"
    n = len(env.train)
    family = {t.id: t.data["family"] for t in env.train}
    share = {f: list(family.values()).count(f) / n for f in set(family.values())}
    assert len(share) == 3 and max(share.values()) - min(share.values()) > 0.01  # unequal
    stream = task_stream([env], seed=3)
    drawn = [next(stream)[1].id for _ in range(2 * n)]
    for p in (drawn[:n], drawn[n:]):
        assert sorted(p) == sorted(family)  # a pass is every task once
    assert drawn[:n] != drawn[n:]  # in a fresh order
    for start, length in ((0, 80), (80, 80), (n - 40, 80), (3, 7)):  # stretches, across passes
        seen = [family[i] for i in drawn[start:start + length]]
        for f, s in share.items():
            assert abs(seen.count(f) - length * s) <= 2, (start, f, seen.count(f), length * s)
    assert drawn == [next(s)[1].id for s in [task_stream([env], seed=3)] for _ in range(2 * n)]
    # without stratification a stretch of 80 strays far further from the shares
    plain = task_stream([dataclasses.replace(env, stratify=None)], seed=3)
    window = [family[next(plain)[1].id] for _ in range(80)]
    assert any(abs(window.count(f) - 80 * s) > 2 for f, s in share.items())

    # the held-out tasks have the training mix too: each family's last tasks, by its share
    everything = load_env("arith").env.load_tasks()
    held = {t.id: t.data["family"] for t in env.heldout}
    assert len(held) == 64 and not held.keys() & family.keys()
    assert len(held) + n == len(everything)
    for f, s in share.items():
        assert abs(list(held.values()).count(f) - 64 * s) <= 1, f
        last = [t.id for t in everything if t.data["family"] == f][-list(held.values()).count(f):]
        assert {i for i, g in held.items() if g == f} == set(last)
    # an environment without the field holds out its last tasks, as before
    plain_split = split_tasks(everything, None, 64)
    assert [t.id for t in plain_split[1]] == [t.id for t in everything[-64:]]
    assert [t.id for t in split_tasks(everything, 5, 64, "family")[0]] == [
        t.id for t in everything if t.id not in held][:5]

    copy = tmp_path / "arith-colour"
    shutil.copytree(load_env("arith").folder, copy)
    manifest = copy / "envhub.toml"
    manifest.write_text(manifest.read_text().replace('stratify = "family"', 'stratify = "colour"'))
    with pytest.raises(ValueError, match="stratify = 'colour' names no field"):
        load_training_envs(TrainLoopConfig(envs=[str(copy)]))


@pytest.mark.slow
def test_async_train_on_two_environments_by_weight_with_held_out_eval(tmp_path):
    """Asynchronous (the default) on arith and a copy of it (weights 2:1): per-environment
    metrics, every filter's count in each row, held-out evaluation rows (2 samples of each
    held-out task) before the first step and after each, on tasks never trained on."""
    import shutil

    from envhub.envs.loader import load_env
    from envhub.orchestrator.train import TrainLoopConfig, load_training_envs

    copy = tmp_path / "arith2"
    shutil.copytree(load_env("arith").folder, copy)
    manifest = copy / "envhub.toml"
    manifest.write_text(manifest.read_text().replace('name = "arith"', 'name = "arith2"', 1))
    out = tmp_path / "run"
    done = envhub("train", "arith=2", f"{copy}=1", "--steps", "2", "--seed", "1", "--out",
                  str(out), "--groups", "3", "--k", "2", "--tasks", "3", "--max-turns", "2",
                  "--eval-every", "1", "--eval-tasks", "1", "--eval-samples", "2",
                  "--concurrency", "6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["phase"] == "eval"]
    steps = [r for r in rows if r["phase"] == "train"]
    assert [r["after_step"] for r in evals] == [-1, 0, 1]
    assert [r["weight_version"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["eval/rollouts"] == 4 and "eval/arith/resolved_rate" in r
        assert "eval/arith2/reward_mean" in r
    for r in steps:
        assert len(r["groups"]) == 3
        names = sorted(g.split(":")[1] for g in r["groups"])
        assert r["env/arith/rollouts"] + r["env/arith2/rollouts"] == 6 == r["rollouts"]
        assert names.count("arith") + names.count("arith2") == 3
        for key in ("filter/stale", "filter/env_failure", "filter/padded",
                    "filter/no_signal_groups", "staleness/max"):
            assert key in r
        assert r["mix/arith/launched_groups"] + r["mix/arith2/launched_groups"] == (
            r["groups_launched"])
    launched = [g for r in steps for g in r["groups"]]
    assert sum(g.split(":")[1] == "arith" for g in launched) == 4  # 2:1 over 6 groups
    with StoreSource(f"sqlite:///{out / 'pool.db'}") as pool:
        infos = pool.list_groups()
    held = {t.id for e in load_training_envs(TrainLoopConfig(envs=["arith", str(copy)],
                                                            eval_tasks=1)) for t in e.heldout}
    eval_tasks = {s.task_id for g in infos if ":eval:" in g.group_id for s in g.sessions}
    trained = {s.task_id for g in infos if ":eval:" not in g.group_id for s in g.sessions}
    assert eval_tasks == held and not trained & held


def test_the_console_shows_a_progress_line_on_a_terminal_and_nothing_with_q(tmp_path):
    """On a terminal (a pty): the log lines and a live progress line (step N/M, reward, eval,
    time left); with -q: nothing on stdout, the run done all the same."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "envhub", "train", "arith", *FLAGS[:1], "2",
                             *FLAGS[2:], "--out", str(tmp_path / "tty")], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**os.environ, "COLUMNS": "200", "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the pty closed: the process ended
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0, b"".join(chunks)[-3000:]
    shown = b"".join(chunks).decode(errors="replace")
    assert "step   0  reward" in shown and "step   1  reward" in shown  # the log lines ...
    assert "2/2" in shown and "left" in shown and "tok/s" in shown  # ... and the progress line

    quiet = envhub("train", "arith", *FLAGS, "--out", str(tmp_path / "q"), "-q", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout == "" and len((tmp_path / "q" / "metrics.jsonl").read_text()
                                      .splitlines()) == 1
