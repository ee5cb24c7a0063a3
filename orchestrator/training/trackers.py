"""`envhub train --log-to tensorboard,wandb,mlflow,trackio`: the run where researchers look,
each tracker through its own library (an extra each: `pip install 'envhub[trackers]'`).

Every metrics row goes to each tracker under the names of metrics.jsonl (`reward_mean`,
`trainer/loss/pg`, `eval/resolved_rate`, `mix/arith/trained_share`, ...), numbers only, at
the tracker step "optimizer steps done": a train row of `step` s at s + 1, an evaluation after
step a at a + 1 (0: before the first step), so an evaluation and the step it followed share
their x. The resolved config (run.json's) is the run's parameters; each step's few sample
rollouts (the prompt's tail, the completion, the reward and its components) a table (W&B,
Trackio), text (TensorBoard) or a JSON table artifact (MLflow). Agent text is data to every
tracker (a table cell, a text summary), never markup we render; Trackio renders a table's
strings as Markdown, so there each is escaped to show as the same text.

Where each writes, with no account and no network:
  tensorboard  OUT/trackers/tensorboard (event files; `tensorboard --logdir OUT/trackers`)
  wandb        OUT/trackers/wandb, offline unless WANDB_MODE says otherwise (`wandb sync`
               uploads it later)
  mlflow       a local SQLite store OUT/trackers/mlflow.db (artifacts beside it in
               OUT/trackers/mlflow-artifacts) unless MLFLOW_TRACKING_URI names another
               (`mlflow ui --backend-store-uri sqlite:///OUT/trackers/mlflow.db`)
  trackio      its local SQLite store in OUT/trackers/trackio (project TRACKIO_PROJECT,
               default envhub; `TRACKIO_DIR=OUT/trackers/trackio trackio show`)
A resumed run's trackers hold what its metrics.jsonl holds, the steps the checkpoint kept and
then the redone ones, never a value of the training the resume threw away. TensorBoard: a new
event file in the same folder with `purge_step`, so what the crashed run logged past the
checkpoint is hidden and the redone steps stand. W&B, MLflow and Trackio cannot take a value
back (W&B drops a step not above its last, so the redone steps would keep the crashed run's
values; MLflow and Trackio would log them beside the crashed run's), so each resume is a run
of its own there, named `RUN (resumed at step K)` (W&B: id `RUN-resumed-K-XXXXXX`; MLflow:
tags `envhub_run` and `envhub_resumed_at`, the run it supersedes ended KILLED and tagged
`envhub_superseded_by`), into which the kept rows and sample tables are logged again first.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

# each the name of its library and of its extra
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
SAMPLE_COLUMNS = ("step", "group", "sample", "prompt_tail", "completion", "reward",
                  "components")


class TrackerUnavailable(ValueError):
    """A tracker was asked for whose library is not installed (the message has the fix)."""


def check_trackers(names: Sequence[str]) -> None:
    """Each name a tracker we have, its library importable; TrackerUnavailable otherwise."""
    import importlib.util

    for name in names:
        if name not in TRACKERS:
            raise TrackerUnavailable(f"--log-to {name}: not a tracker; choose from "
                                     f"{', '.join(TRACKERS)} (comma-separated)")
        if importlib.util.find_spec(name) is None:
            raise TrackerUnavailable(f"--log-to {name}: its library is not installed; pip "
                                     f"install 'envhub[{name}]' (or envhub[trackers])")


def tracker_step(row: dict[str, Any]) -> int:
    """Optimizer steps done when the row was written."""
    if row.get("phase") == "eval":
        return int(row.get("after_step", -1)) + 1
    return int(row.get("step", 0)) + 1


def numbers(row: dict[str, Any]) -> dict[str, float]:
    """The row's numeric series (what the trackers get), by their metrics.jsonl names."""
    skip = {"step", "after_step"}
    return {k: float(v) for k, v in row.items() if k not in skip and not isinstance(v, bool)
            and isinstance(v, int | float) and math.isfinite(v)}


class Tracker(Protocol):
    replays: bool  # a resume is a run of its own: the kept rows are logged to it again

    def row(self, row: dict[str, Any]) -> None: ...

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    replays = False  # a resume hides the crashed run's rows past the checkpoint (purge_step)

    def __init__(self, out: Path, config: dict[str, Any], run_name: str,
                 resumed_at: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run: what the crashed one logged past the checkpoint is hidden (purge_step)
        purge = resumed_at + 1 if resumed_at is not None else None
        self.writer = SummaryWriter(log_dir=str(out / "trackers" / "tensorboard"),
                                    purge_step=purge)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def row(self, row: dict[str, Any]) -> None:
        step = tracker_step(row)
        for key, value in numbers(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if samples:  # text, shown as text (TensorBoard escapes it as markdown source)
            lines = [json.dumps(s, ensure_ascii=False) for s in samples]
            self.writer.add_text("samples", "\n\n".join(f"    {x}" for x in lines), step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    replays = True  # a resume is a run of its own, the kept rows logged again first

    def __init__(self, out: Path, config: dict[str, Any], run_name: str,
                 resumed_at: int | None = None) -> None:
        import wandb

        folder = out / "trackers"
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        run_id, name = _safe(run_name), run_name
        if resumed_at is not None:
            run_id = f"{_safe(run_name)[:40]}-resumed-{resumed_at}-{secrets.token_hex(3)}"
            name, config = resumed_name(run_name, resumed_at), {**config,
                                                                 "resumed_at": resumed_at}
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "envhub"), dir=str(folder),
                              config=config, name=name, id=run_id,
                              resume="allow", mode=_wandb_mode(),
                              settings=wandb.Settings(console="off", x_disable_stats=True))

    def row(self, row: dict[str, Any]) -> None:
        self.run.log(numbers(row), step=tracker_step(row))

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if samples:
            table = self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=[
                [_cell(s[c]) for c in SAMPLE_COLUMNS] for s in samples])
            self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class MLflow:
    replays = True  # a resume is a run of its own, the kept rows logged again first

    def __init__(self, out: Path, config: dict[str, Any], run_name: str,
                 resumed_at: int | None = None) -> None:
        import mlflow

        self.mlflow = mlflow
        folder = out / "trackers"
        folder.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder / 'mlflow.db'}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "envhub")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(
            name, artifact_location=(folder / "mlflow-artifacts").as_uri())
        tags = {"envhub_run": run_name}
        if resumed_at is not None:
            tags["envhub_resumed_at"] = str(resumed_at)
        self.run_id = self.client.create_run(
            experiment, run_name=run_name if resumed_at is None else resumed_name(
                run_name, resumed_at), tags=tags).info.run_id
        if resumed_at is not None:  # the runs this one supersedes (the crashed one, or more)
            for old in self.client.search_runs([experiment], f"tags.envhub_run = '{run_name}'"):
                if old.info.run_id != self.run_id and "envhub_superseded_by" not in old.data.tags:
                    self.client.set_tag(old.info.run_id, "envhub_superseded_by", self.run_id)
                    if old.info.status == "RUNNING":
                        self.client.set_terminated(old.info.run_id, status="KILLED")
        params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # the store takes 100 a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_dict(self.run_id, config, "config.json")

    def row(self, row: dict[str, Any]) -> None:
        import time

        step, now = tracker_step(row), int(time.time() * 1000)
        metrics = [self.mlflow.entities.Metric(_metric_name(k), v, now, step)
                   for k, v in numbers(row).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if samples:
            self.client.log_dict(self.run_id, {"columns": list(SAMPLE_COLUMNS), "data": [
                [_cell(s[c]) for c in SAMPLE_COLUMNS] for s in samples]},
                f"samples/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackio:
    replays = True  # a resume is a run of its own, the kept rows logged again first

    def __init__(self, out: Path, config: dict[str, Any], run_name: str,
                 resumed_at: int | None = None) -> None:
        folder = (out / "trackers" / "trackio").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        # Trackio reads TRACKIO_DIR once, when it is imported: set before, checked after
        os.environ["TRACKIO_DIR"] = str(folder)
        import trackio
        from trackio import utils

        if Path(utils.TRACKIO_DIR).resolve() != folder:
            raise TrackerUnavailable(f"--log-to trackio: trackio was imported before this run "
                                     f"set its folder ({utils.TRACKIO_DIR}); run envhub train "
                                     "in a process of its own")
        self.trackio = trackio
        with contextlib.redirect_stdout(io.StringIO()):  # its "* Created new run" lines
            if resumed_at is not None:  # a name of its own: never the crashed run's
                run_name = f"{resumed_name(run_name, resumed_at)} {secrets.token_hex(3)}"
                config = {**config, "resumed_at": resumed_at}
            self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "envhub"),
                                    name=run_name, config=config, resume="allow", embed=False,
                                    auto_log_gpu=False, auto_log_cpu=False)

    def row(self, row: dict[str, Any]) -> None:
        self.run.log(numbers(row), step=tracker_step(row))

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if samples:  # Trackio renders a table's strings as Markdown: agent text made inert
            self.run.log({"samples": self.trackio.Table(columns=list(SAMPLE_COLUMNS), data=[
                [_inert_markdown(_cell(s[c])) for c in SAMPLE_COLUMNS] for s in samples])},
                step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # "Uploading logs" (it is local)
            self.run.finish()


OPEN: dict[str, Callable[[Path, dict[str, Any], str, int | None], Tracker]] = {
    "tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow, "trackio": Trackio}


class Trackers:
    """The trackers of a run, each row and each step's samples to all of them."""

    def __init__(self, names: Sequence[str], out: Path, config: dict[str, Any],
                 run_name: str, resumed_at: int | None = None,
                 kept: Sequence[dict[str, Any]] = (),
                 kept_samples: Sequence[dict[str, Any]] = ()) -> None:
        """`resumed_at`: a resumed run's checkpoint step (its rows from there on are redone);
        `kept` and `kept_samples`: the metrics rows and samples.jsonl's rows the checkpoint
        holds (resume.py restored both), logged again to the trackers where a resume is a run
        of its own."""
        self.open: list[Tracker] = []
        samples: dict[int, list[dict[str, Any]]] = {}
        for sample in kept_samples:
            samples.setdefault(sample["step"], []).append(sample)
        try:
            for name in dict.fromkeys(names):
                tracker = OPEN[name](out, config, run_name, resumed_at)
                self.open.append(tracker)
                if resumed_at is not None and tracker.replays:
                    replay(tracker, kept, samples)
        except BaseException:
            self.close()
            raise

    def row(self, row: dict[str, Any]) -> None:
        for t in self.open:
            t.row(row)

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        for t in self.open:
            t.samples(step, samples)

    def close(self) -> None:
        for t in reversed(self.open):
            t.close()
        self.open = []


def resumed_name(run_name: str, resumed_at: int) -> str:
    return f"{run_name} (resumed at step {resumed_at})"


def replay(tracker: Tracker, rows: Sequence[dict[str, Any]],
           samples: dict[int, list[dict[str, Any]]]) -> None:
    """The kept rows and each kept step's samples, logged again in the order they were
    (a step's samples right after its train row, as the loop logs them)."""
    for row in rows:
        tracker.row(row)
        if row.get("phase") == "train" and row.get("step") in samples:
            tracker.samples(int(row["step"]) + 1, samples[row["step"]])


def _wandb_mode() -> Any:
    """WANDB_MODE when the user set one (online, offline, disabled), else offline (also in
    the environment: W&B's own settings read it, and refuse an empty one)."""
    mode = os.environ.get("WANDB_MODE") or "offline"
    os.environ["WANDB_MODE"] = mode
    return mode


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, list | type(None)) else value
    return out


def _metric_name(key: str) -> str:
    """MLflow's metric names allow letters, digits, `_-. /` (and `:`): others become `_`."""
    return "".join(c if c.isalnum() or c in "_-. /:" else "_" for c in key)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:128]


_MARKDOWN = frozenset("\\`*_{}[]()#+-.!|~>")


def _inert_markdown(value: Any) -> Any:
    """A string a Markdown renderer shows as the same text: HTML escaped, every Markdown
    punctuation mark backslash-escaped (no link, image, emphasis or raw HTML comes of it)."""
    import html

    if not isinstance(value, str):
        return value
    return "".join("\\" + c if c in _MARKDOWN else c for c in html.escape(value, quote=False)
                   ).replace("\n", "  \n")


def _cell(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
