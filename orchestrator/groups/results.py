"""The results folder of a run: `runs/<run_id>/` under the current directory, or `--out DIR`:

    DIR/run.json                 run id and options (lets --resume keep the same run and groups)
    DIR/rollouts/<env>__<task>__<sample>.json   one record per rollout (RolloutRecord)
    DIR/summary.json             counts and mean reward components per environment and task
    DIR/pool.db                  the in-process gateway's data pool (when it started one)

Files are written atomically (temp file + rename): a crash never leaves half a record, so
`--resume` can trust every record it finds. Resuming skips `done` and `agent_error` rollouts
and runs `env_failure` ones again (infrastructure failures are transient by nature).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from envhub.envs.errors import RunConfigError
from envhub.orchestrator.groups.plan import RolloutKey

FINISHED = ("done", "agent_error")


class RolloutRecord(BaseModel):
    env: str
    task_id: str
    sample: int
    group_id: str
    session_id: str | None = None
    agent: str
    status: str  # done | env_failure | agent_error
    reason: str | None = None
    stopped: str | None = None
    turns: int = 0
    outcome: float | None = None
    resolved: bool | None = None
    components: dict[str, float] = Field(default_factory=dict)  # per event kind, and total
    rewards: list[dict[str, Any]] = Field(default_factory=list)  # every reward event
    duration_s: float = 0.0  # the agent's working time
    setup_s: float = 0.0
    verify_s: float = 0.0
    verdict: dict[str, Any] = Field(default_factory=dict)
    agent_info: dict[str, Any] = Field(default_factory=dict)
    node: dict[str, str] = Field(default_factory=dict)  # the Ray node it ran on (--executor ray)


class ResultsFolder:
    def __init__(self, out: Path) -> None:
        self.out = out

    def start(self, run_id: str, options: dict[str, Any], resume: bool) -> str:
        """Create (or, resuming, reopen) the folder; returns the run id to use."""
        meta = self.out / "run.json"
        if resume:
            if not meta.is_file():
                raise RunConfigError(f"--resume: {meta} not found; point --out at the folder "
                                     "of an earlier run, or drop --resume to start a new one")
            return str(json.loads(meta.read_text())["run_id"])
        if (self.out / "rollouts").is_dir() and any((self.out / "rollouts").iterdir()):
            raise RunConfigError(f"--out {self.out} already holds a run; add --resume to "
                                 "continue it or choose another folder")
        (self.out / "rollouts").mkdir(parents=True, exist_ok=True)
        write_json(meta, {"run_id": run_id, "options": options})
        return run_id

    def finished(self, key: RolloutKey) -> RolloutRecord | None:
        """A finished record of this rollout from an earlier attempt, or None."""
        path = self.out / "rollouts" / key.filename
        if not path.is_file():
            return None
        try:
            record = RolloutRecord.model_validate_json(path.read_text())
        except (ValidationError, ValueError):
            return None  # unreadable: run it again
        return record if record.status in FINISHED else None

    def write(self, key: RolloutKey, record: RolloutRecord) -> None:
        write_json(self.out / "rollouts" / key.filename, record.model_dump(mode="json"))

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.out / "summary.json", summary)


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, written whole or not at all (a temporary file renamed into
    place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def summarize(records: list[RolloutRecord]) -> dict[str, Any]:
    """Counts and mean components overall, per environment and per task. Means over `done`
    rollouts only: failures are counted, never averaged in as zeros."""
    def block(rs: list[RolloutRecord]) -> dict[str, Any]:
        done = [r for r in rs if r.status == "done"]
        # the built-ins always, then any other kind the environment's components produced
        kinds = dict.fromkeys(["outcome", "process", "time", *(k for r in done
                                                                for k in r.components)])
        kinds.pop("total", None)
        means = {c: (sum(r.components.get(c, 0.0) for r in done) / len(done) if done else None)
                 for c in [*kinds, "total"]}
        return {"rollouts": len(rs), "done": len(done),
                "resolved": sum(1 for r in done if r.resolved),
                "env_failure": sum(1 for r in rs if r.status == "env_failure"),
                "agent_error": sum(1 for r in rs if r.status == "agent_error"),
                # done rollouts whose verifier caught the agent's code forging test results
                "tampered": sum(1 for r in done if r.verdict.get("grading_tampered")),
                "mean": means}

    envs: dict[str, list[RolloutRecord]] = {}
    tasks: dict[str, list[RolloutRecord]] = {}
    for r in records:
        envs.setdefault(r.env, []).append(r)
        tasks.setdefault(f"{r.env}/{r.task_id}", []).append(r)
    return {"overall": block(records), "envs": {k: block(v) for k, v in sorted(envs.items())},
            "tasks": {k: block(v) for k, v in sorted(tasks.items())}}
