"""Run options. CLI flags map 1:1 onto these fields (`envhub run --help`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from envhub.envs.errors import RunConfigError

SERVED = "service:"  # an environment reference served by a task service: service:NAME
WEIGHTED_RE = re.compile(r"^(?P<ref>.+?)=(?P<weight>\d+(?:\.\d+)?)$")


def check_schedule(name: str) -> str:
    """A scheduling policy's name (orchestrator/groups/scheduling.py) or dotted path;
    ValueError naming the choices otherwise (`envhub run` and `envhub train --schedule`)."""
    from envhub.orchestrator.groups.scheduling import POLICIES

    if name not in POLICIES and ":" not in name:
        raise ValueError(f"use one of {', '.join(POLICIES)} or package.module:Class")
    return name


class EnvChoice(BaseModel):
    """One environment of a run and its sampling weight (`arith=3 swe-task=1`)."""

    ref: str
    weight: float = Field(1.0, gt=0)

    @classmethod
    def parse(cls, text: str) -> EnvChoice:
        m = WEIGHTED_RE.match(text)
        if m is None:
            return cls(ref=text, weight=1.0)
        weight = float(m.group("weight"))
        if weight <= 0:
            raise RunConfigError(f"{text}: a sampling weight must be > 0, e.g. arith=2")
        return cls(ref=m.group("ref"), weight=weight)


def listen_address(listen: str, flag: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT option; RunConfigError naming `flag` otherwise."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise RunConfigError(f"{flag} {listen}: use HOST:PORT, e.g. 127.0.0.1:7000")
    return host.strip("[]"), int(port)


class ServicesOptions(BaseModel):
    """The environments of `envhub run` and `envhub train`, and the task services
    (groups/services) that may run them."""

    services: str | None = Field(None, description="HOST:PORT to listen on for task services "
                                 "(envhub serve); give their environments as service:NAME")
    services_token: str | None = Field(None, min_length=16, description="what task services "
                                       "present to register (at least 16 characters; default: "
                                       "a random one, printed)")
    service_wait_s: float = Field(60.0, gt=0, le=3600, description="seconds a rollout (or the "
                                  "plan) waits for a live task service of its name with a free "
                                  "slot")
    sandbox_disk_mb: int | None = Field(None, ge=16, le=1 << 22, description="every rollout "
                                        "sandbox's disk bound in MB, overriding the manifests' "
                                        "[sandbox] disk_mb (a write past it is ENOSPC inside "
                                        "the sandbox; envhub doctor says how this machine "
                                        "enforces it)")
    metrics: str | None = Field(None, description="HOST:PORT to serve per-task Prometheus "
                                "metrics at (GET /metrics: rollouts in flight and ended, rewards, "
                                "durations, samples trained and stale; the --services address "
                                "serves them too)")

    def apply_sandbox_disk(self) -> None:
        """--sandbox-disk-mb for every sandbox this process opens (rollout.py reads it)."""
        import os

        from envhub.envs.sandbox import DISK_ENV

        if self.sandbox_disk_mb is not None:
            os.environ[DISK_ENV] = str(self.sandbox_disk_mb)

    @field_validator("services", "metrics")
    @classmethod
    def _listen(cls, v: str | None, info: Any) -> str | None:
        if v is not None:
            try:
                listen_address(v, "")
            except RunConfigError:
                raise ValueError("use HOST:PORT, e.g. 127.0.0.1:7000") from None
        return v

    @field_validator("envs", mode="before", check_fields=False)
    @classmethod
    def _envs(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        return [EnvChoice.parse(x) if isinstance(x, str) else x for x in items]

    @model_validator(mode="after")
    def _one_server_per_address(self) -> ServicesOptions:
        if self.metrics and self.metrics == self.services and not self.metrics.endswith(":0"):
            raise ValueError(f"--metrics {self.metrics} is the --services address, which serves "
                             "/metrics already: drop --metrics, or give it another port")
        return self

    def check_served(self, refs: list[str]) -> None:
        """ValueError when an environment runs in a task service but no --services is given."""
        served = [r for r in refs if r.startswith(SERVED)]
        if served and not self.services:
            raise ValueError(f"{served[0]} runs in a task service: give --services HOST:PORT, "
                             "where services register (e.g. 127.0.0.1:7000)")


class RunConfig(ServicesOptions):
    model_config = ConfigDict(extra="forbid")
    envs: list[EnvChoice] = Field(..., min_length=1, description="environments: name, ./folder "
                                  "or owner/name@version; NAME=WEIGHT sets sampling ratios")
    agent: str | None = Field(
        None, description="default: each environment's own agent (vf for verifiers "
        "environments, else tool); tool | tool:summarize | tool:required (every reply a tool "
        "call) | oracle | vf | a command line, run inside the rollout's sandbox ('agent.py "
        "{task_file}' with --agent-install script:agent.py; placeholders {instruction} "
        "{task_file} {task_id} {model}; OPENAI_BASE_URL/OPENAI_API_KEY and ANTHROPIC_* point at "
        "its session)")
    agent_install: list[str] = Field(
        default_factory=list, description="how a command agent is made present inside the "
        "sandbox: pip:REQUIREMENT | npm:PACKAGE[@VERSION] | script:PATH | recipe:NAME (a "
        "shipped CLI recipe: claude-code, codex, opencode, mini-swe-agent, aider; run it with "
        "--agent NAME.sh) (repeatable); its programs are on PATH there")
    agent_on_host: bool = Field(False, description="run a command agent as a process on this "
                                "machine instead of inside the sandbox: NO containment (prints "
                                "a warning)")
    model: str | None = Field(None, description="model for the in-process gateway: HF folder, "
                              "provider/name, zero, or scripted:FILE (a JSON list of completion "
                              "texts answered in order); default: the bundled tiny model")
    sandbox: str | None = Field(
        None, description="sandbox kind (envs/sandbox/kinds.py: local, docker, e2b, ..., auto) "
        "or package.module:Class; default: each manifest's choice")
    n: int | None = Field(None, ge=1, description="tasks in total, split by the env weights "
                          "(default: all)")
    k: int = Field(1, ge=1, le=1024, description="samples per task (group size)")
    concurrency: int = Field(4, ge=1, le=4096, description="rollouts in flight")
    tasks: list[str] = Field(default_factory=list, description="only this task id (repeatable)")
    out: Path | None = Field(None, description="results folder, one JSON per rollout (default: "
                             "runs/<run_id>/)")
    resume: bool = Field(False, description="skip rollouts already finished in --out")
    gateway: str | None = Field(None, description="use this gateway's URL instead of starting "
                                "one")
    admin_key: str | None = Field(None, description="admin key of --gateway")
    max_turns: int | None = Field(None, ge=1, description="override the manifests' max_turns")
    time_limit_s: float | None = Field(None, gt=0, description="override the agent time limit "
                                       "(seconds)")
    schedule: str = Field("fifo", description="which rollout starts next: fifo | seer (one "
                          "probe sample per group first, then the rest longest-first by what "
                          "the probes took; groups/scheduling.py) | package.module:Class")
    executor: str = Field("inprocess", description="where rollouts run: inprocess | ray (each "
                          "rollout a Ray task on the cluster at RAY_ADDRESS; needs envhub[ray]) "
                          "| package.module:Class (groups/executor.py)")

    @field_validator("sandbox")
    @classmethod
    def _sandbox(cls, v: str | None) -> str | None:
        from envhub.envs.sandbox.kinds import check_kind

        return v if v is None else check_kind(v)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        return check_schedule(v)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("use a URL such as http://127.0.0.1:8000")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.resume and self.out is None:
            raise ValueError("--resume needs --out DIR (the folder of the run to resume)")
        if self.gateway and not self.admin_key:
            raise ValueError("--gateway needs --admin-key (or ENVHUB_ADMIN_KEY)")
        self.check_served([c.ref for c in self.envs])
        return self
