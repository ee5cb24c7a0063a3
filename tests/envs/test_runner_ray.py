"""`envhub run --executor ray` on a real two-node Ray cluster on loopback: rollouts spread over
both nodes and talk to the driver's gateway over HTTP; one node is killed mid-run and every
rollout is still accounted for exactly once (done, or env_failure with the Ray error), in the
results folder and in the pool alike."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require, run_leftovers

pytestmark = pytest.mark.slow

# A command agent that makes one real chat call through its session, then works for a while,
# a file in the cluster's marks folder saying so meanwhile. Once the test has put `hold` there
# it then waits, its mark joined by a `-held` one, until the test puts `release` there: the
# node-loss test kills a node while one of its rollouts is surely running (a mark seen near the
# end of its work could be gone, the rollout finished, by the time the node died).
AGENT = """\
import json, os, time, urllib.request
req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "default", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "2+2?"}]}).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "content-type": "application/json"})
urllib.request.urlopen(req, timeout=60).read()
# while it works, a file says on which node (tests/ray_cluster.py sets both variables)
mark = os.path.join(os.environ["ENVHUB_TEST_MARKS"], os.environ["ENVHUB_TEST_NODE"] + "-" +
                    str(os.getpid()))
open(mark, "w").close()
time.sleep(float(os.environ.get("AGENT_WORK_S", "3")))
marks = os.environ["ENVHUB_TEST_MARKS"]
if os.path.exists(os.path.join(marks, "hold")):
    open(mark + "-held", "w").close()
    end = time.time() + 120
    while not os.path.exists(os.path.join(marks, "release")) and time.time() < end:
        time.sleep(0.05)
    os.remove(mark + "-held")
os.remove(mark)
"""
ROLLOUTS = 8


@pytest.fixture(scope="module")  # one cluster for the file: the node-loss test goes last
def cluster() -> Iterator[object]:
    require(importlib.util.find_spec("ray") is not None, "Ray (pip install 'envhub[ray]')")
    from tests.ray_cluster import TwoNodeCluster

    # A short root, not pytest's tmp_path: Ray's unix socket paths live under the temp folders
    # and must stay within the 107-byte limit (pytest-xdist's basetemp adds popen-gwN/...).
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    c = TwoNodeCluster(root)
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _records(out: Path) -> list[dict]:
    """The rollout records written so far; not the results writer's `.tmp-*.json` (pathlib's
    glob lists them; one being written may not parse yet), which it renames into place."""
    return [json.loads(f.read_text()) for f in sorted((out / "rollouts").glob("*.json"))
            if not f.name.startswith(".")]


def test_a_rollout_no_node_can_place_stops_the_run_up_front(cluster, tmp_path: Path,
                                                              ) -> None:
    """A docker environment on a cluster without a `docker` resource: exit 2 with the fix."""
    from tests.support import envhub

    r = envhub("run", "swe-task", "--sandbox", "docker", "-n", "1", "--agent", "oracle",
               "--executor", "ray", "--out", str(tmp_path / "out"), "-q", env=cluster.env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--resources '{\"docker\": 1}'" in r.stderr, r.stderr


def test_run_spreads_over_two_nodes_and_survives_losing_one(cluster, tmp_path: Path) -> None:
    from envhub.gateway.pool.store import Store

    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "run", "arith", "--model", "zero", "-n", str(ROLLOUTS),
         "-k", "1", "-c", "4", "--executor", "ray", "--agent", f"{sys.executable} {script}",
         "--agent-on-host", "--out", str(out), "-q"],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Kill node_b once a rollout has finished there and while another is held there (its
        # agent waits for `release` once its work is done and `hold` is set, see AGENT).
        deadline = time.monotonic() + 240
        while not any(r["node"].get("resources") == "node_b" for r in _records(out)):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no rollout finished on node_b"
            time.sleep(0.1)
        (cluster.marks / "hold").touch()
        while not any(cluster.marks.glob("node_b-*-held")):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no rollout ran on node_b after one finished"
            time.sleep(0.1)
        cluster.kill("node_b")
        (cluster.marks / "release").touch()
        output, _ = proc.communicate(timeout=300)
    finally:
        (cluster.marks / "release").touch()  # nothing waits for ever on a failed test
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]

    records = _records(out)
    # every rollout exactly once, each in its own session
    assert sorted((r["task_id"], r["sample"]) for r in records) == sorted(
        {(r["task_id"], r["sample"]) for r in records})
    assert len(records) == ROLLOUTS
    assert len({r["session_id"] for r in records}) == ROLLOUTS
    by_status = {s: [r for r in records if r["status"] == s] for s in ("done", "env_failure")}
    assert len(by_status["done"]) + len(by_status["env_failure"]) == ROLLOUTS, records
    # both nodes ran rollouts; the ones lost with node_b say so
    done_on = {r["node"]["resources"] for r in by_status["done"]}
    assert done_on == {"node_a", "node_b"}, done_on
    lost = by_status["env_failure"]
    assert lost, "the rollout running on node_b when it died must be reported"
    assert all(r["reason"].startswith("ray: rollout lost") for r in lost), lost
    assert all(r["rewards"] == [] and r["outcome"] is None for r in lost)  # never scored 0

    # the pool agrees with the results folder: one session per record, same final status,
    # nothing left open; every finished rollout's model call reached the driver's gateway
    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        sessions = {s["id"]: s for s in store.list_sessions()}
        assert set(sessions) == {r["session_id"] for r in records}
        for r in records:
            assert sessions[r["session_id"]]["status"] == r["status"]
            if r["status"] == "done":
                assert len(store.turn_rows(r["session_id"])) == 1
    finally:
        store.close()
    summary = json.loads((out / "summary.json").read_text())["overall"]
    assert (summary["rollouts"], summary["done"], summary["env_failure"]) == (
        ROLLOUTS, len(by_status["done"]), len(lost))
    # the killed worker's scratch folder is the only leftover, and the next run sweeps it
    from envhub.orchestrator.groups.setup import sweep_stale_scratch

    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert len(run_leftovers(run_id)) <= len(lost)
    sweep_stale_scratch()
    assert run_leftovers(run_id) == []


def test_an_address_where_no_ray_listens_stops_the_run_up_front(tmp_path: Path) -> None:
    """RAY_ADDRESS pointing at nothing: exit 2 with the fix at once (ray.init would wait for
    minutes), nothing kept."""
    require(importlib.util.find_spec("ray") is not None, "Ray (pip install 'envhub[ray]')")
    from tests.support import envhub, free_port

    r = envhub("run", "arith", "-n", "1", "--agent", "oracle", "--model", "zero", "--executor",
               "ray", "--out", str(tmp_path / "out"), "-q",
               env={"RAY_ADDRESS": f"127.0.0.1:{free_port()}"}, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot connect to RAY_ADDRESS" in r.stderr and "ray start --head" in r.stderr
    assert not (tmp_path / "out").exists()
