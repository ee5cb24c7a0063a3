"""`envhub train --executor ray` against a real Ray (the head node alone, on loopback:
tests/ray_cluster.py): every training rollout runs as a Ray task on the node, its agent talking
to the driver's gateway over HTTP, and the loop trains on what the pool recorded. A Ray that
cannot be reached stops the command with exit 2 and the fix, before anything is written."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import envhub, free_port, require

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def head() -> Iterator[object]:
    require(importlib.util.find_spec("ray") is not None, "Ray (pip install 'envhub[ray]')")
    from tests.ray_cluster import TwoNodeCluster

    # a short root: Ray's unix socket paths live under it (107-byte limit)
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cluster = TwoNodeCluster(root)
    try:
        yield cluster.start(nodes=1)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_train_runs_its_rollouts_as_ray_tasks(head, tmp_path: Path) -> None:
    from envhub.gateway.pool.store import Store

    out = tmp_path / "run"
    done = envhub("train", "arith", "--executor", "ray", "--steps", "2", "--groups", "2",
                  "--k", "2", "--tasks", "2", "--max-turns", "2", "--eval-every", "0",
                  "--concurrency", "2", "--buffer", "2",
                  "--seed", "3", "--out", str(out), cwd=tmp_path, env=head.env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1]
    trained = {g for r in rows for g in r["groups"]}
    assert len(trained) == 4 and all(r["env_failures"] == 0 for r in rows), rows

    records = [json.loads(f.read_text()) for f in (out / "rollouts").glob("*.json")]
    assert trained <= {r["group_id"] for r in records}
    # each rollout ran on the Ray node (its runtime context, read there, names it) ...
    for r in records:
        assert r["status"] == "done", (r.get("reason"), r.get("agent_info"))
        assert r["node"]["resources"] == "node_a" and len(r["node"]["node_id"]) > 20, r["node"]
    # ... and its model calls reached the driver's gateway: the pool holds them
    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        sessions = {s["id"]: s for s in store.list_sessions()}
        for r in records:
            assert sessions[r["session_id"]]["status"] == "done"
            assert len(store.turn_rows(r["session_id"])) >= 1
            # the process signals its runner raised on the node (tool errors) were posted by
            # the driver (the admin key's to post): once they crashed the rollout there
            posted = store.events("signals", r["session_id"])
            assert len(posted) == r["agent_info"]["signals"], (posted, r["agent_info"])
        print("signals posted:", sum(r["agent_info"]["signals"] for r in records))
    finally:
        store.close()


def test_train_with_no_ray_to_reach_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    require(importlib.util.find_spec("ray") is not None, "Ray (pip install 'envhub[ray]')")
    out = tmp_path / "run"
    r = envhub("train", "arith", "--executor", "ray", "--steps", "1", "--eval-every", "0",
               "--out", str(out), cwd=tmp_path,
               env={"RAY_ADDRESS": f"127.0.0.1:{free_port()}"}, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "cannot connect" in r.stderr and "ray start --head" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert not out.exists()
