"""`envhub export --format verl|trl`: flat Parquet from a JSONL pool or a live gateway API."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support import envhub
from tests.trainer.handmade import trajectory


def _pool() -> list:
    ts = [trajectory(f"a{i}", "ga", index=i, reward=float(i)) for i in range(2)]
    ts += [trajectory(f"b{i}", "gb", index=i, status="env_failure" if i else "done",
                      created_at=5.0) for i in range(2)]
    return ts


def test_export_verl_from_jsonl(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(t.model_dump_json() + "\n" for t in _pool()))
    out = tmp_path / "verl.parquet"
    r = envhub("export", "--format", "verl", "--jsonl", str(pool), "--out", str(out),
                "--no-std")
    assert r.returncode == 0, r.stderr
    assert "wrote 2 sequences from 1 groups" in r.stdout
    assert "drop/env_failure=1" in r.stdout and "drop_groups/group_under_half=1" in r.stdout
    rows = pq.read_table(out).to_pylist()
    assert [row["session_id"] for row in rows] == ["a0", "a1"]
    row = rows[0]
    # tokens [1,2,3 | 10,11,4,12], sampled 10, 11, 12; rewards 0 and 1 -> advantage -0.5
    assert row["prompts"] == [1, 2, 3] and row["responses"] == [10, 11, 4, 12]
    assert row["input_ids"] == [1, 2, 3, 10, 11, 4, 12] and row["uid"] == "ga"
    assert row["attention_mask"] == [1] * 7 and row["position_ids"] == list(range(7))
    assert row["response_mask"] == [1, 1, 0, 1]
    assert row["old_log_probs"] == row["rollout_log_probs"] == [-0.5, -0.25, 0.0, -1.0]
    assert row["advantages"] == [-0.5, -0.5, 0.0, -0.5]
    assert row["token_level_rewards"] == [0.0, 0.0, 0.0, 0.0]  # reward 0 on the last token
    assert rows[1]["token_level_rewards"] == [0.0, 0.0, 0.0, 1.0]


def test_export_verl_from_the_pool_database(tmp_path: Path) -> None:
    """`--db` reads the pool in-process (the command `envhub run` prints after a run)."""
    from envhub.sdk import Session
    from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, start_gateway

    gw, _ = start_gateway(tmp_path, ["The answer is 2."])
    try:
        for i in range(2):
            session = Session.open(gw.url, admin_key=ADMIN_KEY, group_id="g", task_id="t",
                                   sample_index=i)
            session.openai().chat.completions.create(
                model="default", messages=[{"role": "user", "content": "1 + 1?"}])
            session.reward("outcome", float(i))
            session.close("done")
    finally:
        gw.close()
    out = tmp_path / "verl.parquet"
    r = envhub("export", "--format", "verl", "--db", f"sqlite:///{tmp_path}/pool.db",
               "-o", str(out))
    assert r.returncode == 0 and "wrote 2 sequences from 1 groups" in r.stdout, r.stderr
    assert pq.read_table(out).column("uid").to_pylist() == ["g", "g"]


def test_export_trl_from_a_real_gateway(tmp_path: Path) -> None:
    """Sessions played through a real gateway (scripted completions, real tokenizer): the TRL
    rows hold exactly the ids, masks and rollout logprobs the pool recorded, with GRPO
    advantages; the env_failure group is left out."""
    from envhub.sdk import Session
    from envhub.trainer.source import StoreSource
    from tests.envs.runtime_fixtures.gateway import ADMIN_KEY, start_gateway

    gw, _ = start_gateway(tmp_path, ["The answer is 2.", "Let me think: 2."])
    try:
        ids = []
        for group, status in (("ga", "done"), ("gb", "env_failure")):
            for i in range(2):
                session = Session.open(gw.url, admin_key=ADMIN_KEY, group_id=group,
                                       task_id=group, sample_index=i)
                session.openai().chat.completions.create(
                    model="default", messages=[{"role": "user", "content": "1 + 1?"}])
                session.reward("outcome", float(i))
                session.close(status if i else "done")
                ids.append(session.id)
        out = tmp_path / "trl.parquet"
        r = envhub("export", "-f", "trl", "--gateway", gw.url, "--admin-key", ADMIN_KEY,
                    "-o", str(out))
        assert r.returncode == 0, r.stderr
        with StoreSource(gw.app.state.gw.store) as pool:
            recorded = {t.session.id: t for t in pool.fetch(ids)}
    finally:
        gw.close()
    rows = pq.read_table(out).to_pylist()
    assert sorted(row["session_id"] for row in rows) == sorted(ids[:2])  # gb: under half valid
    for row in rows:
        seg = recorded[row["session_id"]].segments[0]
        n_prompt = len(row["prompt_ids"])
        assert row["prompt_ids"] + row["completion_ids"] == seg.token_ids
        assert row["completion_mask"] == seg.loss_mask[n_prompt:]
        assert row["sampling_per_token_logps"] == pytest.approx(seg.logprobs[n_prompt:])
    advantages = {row["session_id"]: row["advantages"] for row in rows}
    assert advantages[ids[1]] == pytest.approx(1.0, rel=1e-5)  # rewards 0, 1: (1 - .5) / .5
    assert advantages[ids[0]] == pytest.approx(-1.0, rel=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--format", "csv", "--jsonl", "x"], "use jsonl, parquet, verl or trl"),
    (["--format", "trl"], "exactly one of --gateway URL, --jsonl FILE or --db URL"),
    (["--format", "trl", "--jsonl", "x", "--db", "sqlite:///x"], "exactly one of"),
    (["--format", "verl", "--db", "sqlite:////nonexistent.db"], "no such pool file"),
    (["--format", "verl", "--jsonl", "/nonexistent.jsonl"], "does not exist"),
])
def test_bad_arguments_exit_2_with_the_fix(tmp_path: Path, args: list[str], message: str) -> None:
    r = envhub("export", "--out", str(tmp_path / "x.parquet"), *args)
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stderr).split())  # undo rich's box wrapping
    assert r.returncode == 2 and message in flat, r.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_unreachable_gateway_exits_2(tmp_path: Path) -> None:
    from tests.support import free_port

    r = envhub("export", "--gateway", f"http://127.0.0.1:{free_port()}", "-o",
                str(tmp_path / "x.parquet"))
    assert r.returncode == 2 and "cannot reach the gateway" in r.stderr
    assert not list(tmp_path.iterdir())


def test_recipe_inputs_that_are_not_exports_fail_with_the_fix(tmp_path: Path) -> None:
    """The verl loader and the TRL replay name the file and the command that writes one; a
    replay asked for another group size says which num_generations to set."""
    from envhub.trainer.errors import TrainerError
    from envhub.trainer.export_trl import ExportReplay
    from envhub.trainer.export_verl import read_verl

    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(t.model_dump_json() + "\n" for t in _pool()))
    for fmt in ("verl", "trl"):
        r = envhub("export", "-f", fmt, "--jsonl", str(pool), "-o", str(tmp_path / f"{fmt}.pq"))
        assert r.returncode == 0, r.stderr
    with pytest.raises(TrainerError, match="envhub export --format verl"):
        read_verl(tmp_path / "trl.pq")
    with pytest.raises(TrainerError, match="envhub export --format trl"):
        ExportReplay(tmp_path / "verl.pq")
    replay = ExportReplay(tmp_path / "trl.pq")
    assert replay.prompt_dataset()["prompt"] == ["ga"]
    answer = replay(["ga", "ga"])
    assert answer["completion_ids"] == [[10, 11, 4, 12]] * 2
    assert answer["env_mask"] == [[1, 1, 0, 1]] * 2 and answer["envhub_reward"] == [0.0, 1.0]
    with pytest.raises(TrainerError, match="num_generations=2"):
        replay(["ga", "ga", "ga"])
    with pytest.raises(TrainerError, match="no group of this export"):
        replay(["gz", "gz"])
    r = subprocess.run([sys.executable, "-m", "envhub.trainer.recipe_verl",
                        str(tmp_path / "trl.pq"), "--model", "unused"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "envhub export --format verl" in r.stderr, r.stderr
