"""`envhub train --log-to tensorboard,wandb,mlflow,trackio`: each tracker's own reader gets back
the series of metrics.jsonl (TensorBoard's event reader, MLflow's client, W&B's offline run file
read with W&B's own protobuf schema, Trackio's SQLiteStorage), the config as the run's
parameters, and each step's sample rollouts. No account and no network: W&B offline, MLflow's
and Trackio's local SQLite stores."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import envhub

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("trackio")

# Trackio's own store read in a process of its own (trackio takes TRACKIO_DIR when imported)
TRACKIO_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
[run] = SQLiteStorage.get_runs("envhub")
print(json.dumps({"logs": SQLiteStorage.get_logs("envhub", run),
                  "config": SQLiteStorage.get_run_config("envhub", run)}, default=str))
"""

KEYS = ("reward_mean", "resolved_rate", "trainer/loss/pg", "trainer/policy/entropy",
        "mix/arith/trained_share", "eval/resolved_rate", "eval/reward_mean")


def expected(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """(tracker step, value): steps done (a train row's step + 1, an eval's after_step + 1)."""
    out = []
    for r in rows:
        if key in r:
            step = r["after_step"] + 1 if r["phase"] == "eval" else r["step"] + 1
            out.append((step, float(r[key])))
    return out


def wandb_records(path: Path):
    """The records of a .wandb file: W&B's header, then LevelDB log framing (32 KiB blocks of
    crc32c, length, type chunks) around protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            whole = chunk
        elif kind == 2:
            pending = chunk
            continue
        elif kind == 3:
            pending += chunk
            continue
        elif kind == 4:
            whole = pending + chunk
        else:
            break
        record = pb.Record()
        record.ParseFromString(whole)
        yield record


@pytest.mark.slow
def test_every_tracker_reads_back_the_metrics_the_config_and_the_samples(tmp_path):
    out = tmp_path / "run"
    done = envhub("train", "arith", "--steps", "2", "--seed", "2", "--groups", "2", "--k", "2",
                  "--tasks", "4", "--max-turns", "2", "--sync", "--eval-every", "1",
                  "--eval-tasks", "2", "--eval-samples", "1", "--lr", "0.0003",
                  "--log-to", "tensorboard,wandb", "--log-to", "mlflow,trackio", "--out", str(out),
                  cwd=tmp_path, env={"WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["phase"] == "eval" for r in rows)

    # TensorBoard: its own event reader (scalars are stored as float32)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "trackers" / "tensorboard"),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for key in KEYS:
        got = [(e.step, e.value) for e in events.Scalars(key)]
        want = expected(rows, key)
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for (_, a), (_, b) in
                   zip(got, want, strict=True)), (key, got, want)
    texts = events.Tensors("samples/text_summary")
    assert texts and "completion" in texts[-1].tensor_proto.string_val[0].decode()

    # MLflow: its client on the local store
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'trackers' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "envhub"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.params["lr"] == "0.0003" and run.data.params["steps"] == "2"
    for key in KEYS:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                              key))
        assert history == expected(rows, key), key
    samples = client.list_artifacts(run.info.run_id, "samples")
    assert [a.path for a in samples] == ["samples/step-000001.json", "samples/step-000002.json"]
    table = json.loads(Path(client.download_artifacts(run.info.run_id, samples[0].path,
                                                       str(tmp_path))).read_text())
    assert table["columns"][:3] == ["step", "group", "sample"] and table["data"]
    assert all(row[3] and row[4] for row in table["data"])  # prompt tail, completion

    # W&B: the offline run's transaction log, with W&B's protobuf schema
    [log] = list((out / "trackers" / "wandb").glob("offline-run-*/run-*.wandb"))
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict[str, object] = {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    history.setdefault(key, []).append((step, float(value)))
        elif kind in ("run", "config"):  # the config: in the run record, and any updates
            updates = record.run.config.update if kind == "run" else record.config.update
            for item in updates:
                config[item.key] = json.loads(item.value_json)
    for key in KEYS:
        assert history[key] == expected(rows, key), key
    assert config["lr"] == 0.0003 and config["steps"] == 2
    tables = list((out / "trackers" / "wandb").glob("offline-run-*/files/media/table/*.json"))
    assert len(tables) == 2
    cells = json.loads(tables[0].read_text())
    assert cells["columns"][:3] == ["step", "group", "sample"] and cells["data"]

    # Trackio: its own storage API on the run's local store
    read = subprocess.run([sys.executable, "-c", TRACKIO_READ], capture_output=True, text=True,
                          env={**os.environ, "TRACKIO_DIR": str(out / "trackers" / "trackio")},
                          timeout=120)
    assert read.returncode == 0, read.stderr[-3000:]
    stored = json.loads(read.stdout.splitlines()[-1])
    for key in KEYS:
        got = sorted((int(r["step"]), float(r[key])) for r in stored["logs"]
                     if isinstance(r.get(key), int | float))
        assert got == expected(rows, key), (key, got)
    assert stored["config"]["lr"] == 0.0003 and stored["config"]["steps"] == 2
    tables = [r["samples"] for r in stored["logs"] if "samples" in r]
    assert len(tables) == 2, stored["logs"][:3]


# One process of a run as `envhub train` drives its trackers (the trackers are read again by
# the next process: Trackio takes its folder when imported): rows and each train row's samples,
# then a clean close, or none at all (`crash`: the process dies as a kill -9 leaves it).
RUN_PROCESS = """
import json, os, sys
from pathlib import Path
from envhub.orchestrator.training.trackers import Trackers
a = json.loads(sys.argv[1])
t = Trackers(a["names"], Path(a["out"]), {"lr": 0.01}, "run-x", a["resumed_at"], a["kept"],
             a["kept_samples"])
for row in a["rows"]:
    t.row(row)
    if row["phase"] == "train":
        t.samples(row["step"] + 1, [{"step": row["step"], "group": "g", "sample": 0,
                                     "prompt_tail": "p", "completion": "c", "reward": 1.0,
                                     "components": {}}])
if a["crash"]:
    os._exit(0)
t.close()
"""

TRACKIO_RUNS = """
import json
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({run: SQLiteStorage.get_logs("envhub", run)
                  for run in SQLiteStorage.get_runs("envhub")}, default=str))
"""


def train_row(step: int, value: float) -> dict:
    return {"phase": "train", "step": step, "reward_mean": value}


@pytest.mark.slow
def test_a_resumed_run_shows_only_what_its_metrics_hold_in_every_tracker(tmp_path):
    """A run killed after step 3 with its checkpoint at 2 steps, resumed: steps 2 and 3 are
    trained again. Every tracker's reader must give metrics.jsonl's series (the kept steps,
    then the redone ones), never the crashed run's values of the steps it redid (W&B kept
    them and dropped the redone ones; MLflow and Trackio held both)."""
    out = tmp_path / "run"
    names = ["tensorboard", "wandb", "mlflow", "trackio"]

    def process(rows: list[dict], resumed_at: int | None, kept: list[dict],
                kept_samples: list[dict], crash: bool):
        arg = json.dumps({"names": names, "out": str(out), "rows": rows, "crash": crash,
                          "resumed_at": resumed_at, "kept": kept,
                          "kept_samples": kept_samples})
        done = subprocess.run([sys.executable, "-c", RUN_PROCESS, arg], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "WANDB_MODE": "offline"})
        assert done.returncode == 0, done.stderr[-3000:]

    eval_row = {"phase": "eval", "after_step": 1, "eval/resolved_rate": 0.5}
    crashed = [train_row(0, 0.0), train_row(1, 1.0), eval_row, train_row(2, 2.0),
               train_row(3, 3.0)]
    process(crashed, None, [], [], crash=True)
    # the checkpoint after 2 steps holds these rows and the samples of steps 0 and 1 (what
    # resume.py's restore_metrics and restore_samples return)
    kept = crashed[:3]
    kept_samples = [{"step": s, "group": "g", "sample": 0, "prompt_tail": "p",
                     "completion": "c", "reward": 1.0, "components": {}} for s in range(2)]
    redone = [train_row(2, 20.0), train_row(3, 30.0), train_row(4, 40.0)]
    process(redone, 2, kept, kept_samples, crash=False)
    rows = kept + redone  # metrics.jsonl after the resumed run
    keys = ("reward_mean", "eval/resolved_rate")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "trackers" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for key in keys:
        assert [(e.step, e.value) for e in events.Scalars(key)] == expected(rows, key), key

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'trackers' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "envhub"]
    runs = {r.data.tags.get("envhub_resumed_at"): r
            for r in client.search_runs([experiment.experiment_id], "tags.envhub_run = 'run-x'")}
    assert sorted(runs, key=str) == ["2", None], runs
    old, new = runs[None], runs["2"]
    assert old.info.status == "KILLED" and old.data.tags["envhub_superseded_by"] == new.info.run_id
    assert new.info.run_name == "run-x (resumed at step 2)" and new.data.params["lr"] == "0.01"
    for key in keys:
        history = sorted((m.step, m.value) for m in client.get_metric_history(new.info.run_id,
                                                                              key))
        assert history == expected(rows, key), key
    assert len(client.list_artifacts(new.info.run_id, "samples")) == 5  # 2 kept + 3 redone

    [log] = list((out / "trackers" / "wandb").glob("offline-run-*-resumed-2-*/run-*.wandb"))
    history: dict[str, list[tuple[int, float]]] = {}
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                value = json.loads(item.value_json)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    key = item.key or "/".join(item.nested_key)
                    history.setdefault(key, []).append((record.history.step.num, value))
    for key in keys:
        assert history[key] == expected(rows, key), key

    read = subprocess.run([sys.executable, "-c", TRACKIO_RUNS], capture_output=True, text=True,
                          env={**os.environ, "TRACKIO_DIR": str(out / "trackers" / "trackio")},
                          timeout=120)
    assert read.returncode == 0, read.stderr[-3000:]
    stored = json.loads(read.stdout.splitlines()[-1])
    [resumed] = [r for r in stored if r.startswith("run-x (resumed at step 2) ")]
    for key in keys:
        got = sorted((int(r["step"]), float(r[key])) for r in stored[resumed]
                     if isinstance(r.get(key), int | float))
        assert got == expected(rows, key), (key, got)
    assert sum("samples" in r for r in stored[resumed]) == 5
