"""Checkpoints of `envhub train` and `envhub train --resume OUT`.

What a run keeps on disk so that a kill -9 at any moment loses nothing finished:
  OUT/groups.jsonl              every group launched and finished, with its records, appended
                                and fsynced as it happens (ledger.py's GroupJournal)
  OUT/checkpoints/step-NNNNNN   after NNNNNN optimizer steps: the trainer's checkpoint (DCP
                                model + optimizer of every rank, LoRA adapters included, RNG,
                                weight version, the window's consumed groups) with the loop's
                                state in trainer_state.json ("loop": the step, the run id, the
                                ledger's settled counts, Python's RNG, the wall time) and a
                                copy of metrics.jsonl as it was; written under a temporary name
                                and renamed into place (trainer/checkpoint.py), so a kill
                                during a write leaves the previous checkpoint the newest one.
                                The newest `--keep-checkpoints` are kept.

`--resume OUT` (train.py) reads the newest complete checkpoint (none yet: the run starts over
from its first step, with what it launched kept), loads it on every rank, restores the
ledger from the journal (so the task stream goes on after the last group launched), closes
the sessions left open by the crash as env_failure ("the run stopped"), passes the groups
that never finished, serves the checkpoint's weights again under its version, sets
metrics.jsonl back to the checkpoint's copy (the rows of steps after it, whose training the
checkpoint does not hold, go to metrics.discarded.jsonl; samples.jsonl likewise keeps the
sample rollouts of the steps before it, the others going to samples.discarded.jsonl) and goes
on: the groups that finished
after the checkpoint are trained in the window's order, those trained before it never again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.orchestrator.training.ledger import GroupJournal, Journal
from envhub.trainer.checkpoint import STATE_FILE

CHECKPOINTS = "checkpoints"
JOURNAL = "groups.jsonl"
DISCARDED = "metrics.discarded.jsonl"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
SAMPLES_DISCARDED = "samples.discarded.jsonl"
STOPPED = "the run stopped"  # why a session open at the crash is env_failure


class ResumeError(ValueError):
    """The folder cannot be resumed as asked (the message says why and what to do)."""


class RunStopped(Exception):
    """Ctrl-C stopped the run at a step boundary, after writing a checkpoint."""


def checkpoint_folder(out: Path, steps: int) -> Path:
    return out / CHECKPOINTS / f"step-{steps:06d}"


def complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file() and (folder / ".metadata").is_file() and (
        folder / METRICS).is_file()


def checkpoints(out: Path) -> list[Path]:
    """The complete checkpoints under OUT, oldest first (a folder a kill left half-written
    keeps its temporary name and is not one of them)."""
    root = out / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-[0-9]*") if p.is_dir() and complete(p))


def prune_checkpoints(out: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; remove older ones and temporary leftovers."""
    for old in checkpoints(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in (out / CHECKPOINTS).glob(".step-*"):
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class ResumePoint:
    """Where a resumed run starts: its newest checkpoint (None: from the first step) and the
    journal of its groups."""

    folder: Path | None
    state: dict[str, Any]  # the checkpoint's trainer_state.json ({} without one)
    journal: Journal = field(default_factory=Journal)

    @property
    def loop(self) -> dict[str, Any]:
        return dict(self.state.get("loop", {}))

    @property
    def step(self) -> int:
        return int(self.loop.get("step", 0))

    @property
    def consumed(self) -> list[str]:
        return list(self.state.get("consumed_groups", []))


def resume_point(out: Path, env_names: list[str]) -> ResumePoint:
    """Read what OUT holds to resume from; ResumeError when it is not a resumable run of
    these environments."""
    journal = GroupJournal.read(out / JOURNAL)
    if journal.run_id is None:
        raise ResumeError(f"--resume {out}: no {JOURNAL} there, so nothing of a run to go on "
                          "with; point it at the --out of an envhub train run (one written "
                          "by this version), or train into a fresh folder")
    found = checkpoints(out)
    if not found:
        return ResumePoint(None, {}, journal)
    folder = found[-1]
    state = json.loads((folder / STATE_FILE).read_text())
    names = state.get("loop", {}).get("envs")
    if names is not None and list(names) != env_names:
        raise ResumeError(f"--resume {out}: the run trained on {', '.join(names)}, not "
                          f"{', '.join(env_names)}; resume with its environments, or train "
                          "into a fresh folder")
    return ResumePoint(folder, state, journal)


def changed_inputs(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between run.json's provenance and today's: an environment's package
    digest, the model folder's digest (a resumed run must train what it trained)."""
    changed = []
    before = {e.get("name"): e.get("digest") for e in recorded.get("environments", [])}
    for e in now.get("environments", []):
        name, digest = e.get("name"), e.get("digest")
        if name in before and digest is not None and before[name] not in (None, digest):
            changed.append(f"environment {name} (package digest {before[name]} -> {digest})")
    old_model = (recorded.get("model") or {}).get("digest")
    new_model = (now.get("model") or {}).get("digest")
    if old_model and new_model and old_model != new_model:
        changed.append(f"the model folder (digest {old_model} -> {new_model})")
    return changed


def restore_metrics(out: Path, point: ResumePoint) -> list[dict[str, Any]]:
    """metrics.jsonl as the checkpoint holds it (empty without one); its other rows, those of
    steps the checkpoint does not hold, appended to metrics.discarded.jsonl with the step the
    run resumed from. Returns the rows kept."""
    path = out / METRICS
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    kept = (point.folder / METRICS).read_text(encoding="utf-8") if point.folder else ""
    rows = [json.loads(line) for line in kept.splitlines() if line.strip()]
    extra = current[len(kept):] if current.startswith(kept) else current
    dropped = [line for line in extra.splitlines() if line.strip()]
    if dropped:
        with open(out / DISCARDED, "a", encoding="utf-8") as f:
            for line in dropped:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # torn by the kill
                f.write(json.dumps({**row, "discarded_by_resume_from_step": point.step}) + "\n")
    tmp = out / f".{METRICS}.tmp"
    tmp.write_text(kept, encoding="utf-8")
    tmp.replace(path)
    return rows


def restore_samples(out: Path, point: ResumePoint) -> list[dict[str, Any]]:
    """samples.jsonl with the sample rollouts of the steps the checkpoint holds; those of later
    steps (trained again now, from other groups) appended to samples.discarded.jsonl, a row
    torn by the kill dropped. Returns the rows kept."""
    path = out / SAMPLES
    if not path.is_file():
        return []
    kept: list[dict[str, Any]] = []
    dropped: list[Any] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # torn by the kill
        step = row.get("step") if isinstance(row, dict) else None
        (kept if isinstance(step, int) and step < point.step else dropped).append(row)
    if dropped:
        with open(out / SAMPLES_DISCARDED, "a", encoding="utf-8") as f:
            for row in dropped:
                f.write(json.dumps({**row, "discarded_by_resume_from_step": point.step}
                                   if isinstance(row, dict) else row) + "\n")
    tmp = out / f".{SAMPLES}.tmp"
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    tmp.replace(path)
    return kept


def drop_newer_weights(out: Path, version: int, log: Callable[[str], Any]) -> None:
    """Weight folders newer than the checkpoint's version hold training the resumed run
    redoes; they are removed (said in the log), so that OUT/weights/vN is what vN serves."""
    for folder in sorted((out / "weights").glob("v[0-9]*")):
        if folder.is_dir() and folder.name[1:].isdigit() and int(folder.name[1:]) > version:
            shutil.rmtree(folder, ignore_errors=True)
            log(f"resume: removed {folder} (weights of steps after the checkpoint, trained "
                "again now)")


def close_stopped_sessions(base_url: str, admin_key: str) -> int:
    """Close every session the crash left open as env_failure ("the run stopped"); returns
    how many. (The pool is the run's own: OUT/pool.db.)"""
    import httpx

    from envhub.trainer.source import HttpSource

    with HttpSource(base_url, admin_key) as http:
        stuck = http.sessions(status="open")
    headers = {"authorization": f"Bearer {admin_key}"}
    for s in stuck:
        r = httpx.post(f"{base_url}/sessions/{s.id}/close", headers=headers, timeout=60,
                       json={"status": "env_failure", "reason": STOPPED})
        r.raise_for_status()
    return len(stuck)


def python_rng(state: list[Any] | None) -> None:
    """Python's `random` as a checkpoint saved it (`random.getstate()` as JSON)."""
    import random

    if state:
        random.setstate((state[0], tuple(state[1]), state[2]))
