"""`envhub export --format jsonl|parquet` reads the pool: trajectories as recorded."""

from __future__ import annotations

import openai
import pyarrow.parquet as pq

from envhub.sdk import Trajectory
from tests.gateway.conftest import start
from tests.support import envhub


def test_jsonl_and_parquet_export(tmp_path, tool_script):
    gw = start(tmp_path, tool_script)
    try:
        for key in ("ex-a", "ex-b"):
            c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
            c.chat.completions.create(model="default",
                                      messages=[{"role": "user", "content": key}])
    finally:
        gw.close()
    db = f"sqlite:///{tmp_path}/pool.db"
    r = envhub("export", "--db", db, "--format", "jsonl", "--out", str(tmp_path / "t.jsonl"))
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    trajs = [Trajectory.model_validate_json(line) for line in lines]
    assert sorted(t.session.id for t in trajs) == ["ex-a", "ex-b"]
    assert all(t.segments[0].token_ids == t.turns[0].prompt_ids + t.turns[0].completion_ids
               for t in trajs)
    r = envhub("export", "--db", db, "--format", "parquet", "--out", str(tmp_path / "t.pq"))
    assert r.returncode == 0, r.stderr
    rows = pq.read_table(tmp_path / "t.pq").to_pylist()
    assert {row["session_id"] for row in rows} == {"ex-a", "ex-b"}
    assert all(len(row["token_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
               for row in rows)


def test_export_bad_input_exits_2(tmp_path):
    r = envhub("export", "--format", "csv", "--out", str(tmp_path / "x"), "--db", "sqlite:///x")
    assert r.returncode == 2 and "use jsonl, parquet, verl or trl" in r.stderr
    r = envhub("export", "--format", "jsonl", "--out", str(tmp_path / "x"),
               "--db", f"sqlite:///{tmp_path}/missing.db")
    assert r.returncode == 2 and "no such pool file" in r.stderr
    assert not (tmp_path / "x").exists()


def test_export_bad_out_paths_exit_2_and_write_nothing(tmp_path, tool_script):
    gw = start(tmp_path, tool_script)
    try:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="ex-a", max_retries=0)
        c.chat.completions.create(model="default", messages=[{"role": "user", "content": "a"}])
    finally:
        gw.close()
    db = f"sqlite:///{tmp_path}/pool.db"
    for fmt in ("jsonl", "parquet"):
        r = envhub("export", "--db", db, "--format", fmt,
                   "--out", str(tmp_path / "missing-dir" / "x.out"))
        assert r.returncode == 2 and "missing-dir does not exist" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        r = envhub("export", "--db", db, "--format", fmt, "--out", str(tmp_path))
        assert r.returncode == 2 and "is a folder" in r.stderr, r.stderr
    r = envhub("export", "--jsonl", str(tmp_path / "none.jsonl"), "--format", "verl",
               "--out", str(tmp_path / "missing-dir" / "x.parquet"))
    assert r.returncode == 2 and "missing-dir does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "missing-dir").exists()
    # a good export leaves exactly its file, no temporary sibling
    r = envhub("export", "--db", db, "--format", "jsonl", "--out", str(tmp_path / "t.jsonl"))
    assert r.returncode == 0 and f"to {tmp_path / 't.jsonl'}" in r.stdout, r.stderr
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
