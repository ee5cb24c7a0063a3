"""Run options. CLI flags map 1:1 onto these fields (`envhub run --help`)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from envhub.envs.errors import RunConfigError

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


class ServicesOptions(BaseModel):
    """Task services (groups/services) of `envhub run` and `envhub train` alike."""

    services: str | None = Field(None, description="HOST:PORT where task services register "
                                 "(groups/services); environments given as service:NAME run "
                                 "in them")
    services_token: str | None = Field(None, min_length=16, description="what task services "
                                       "must present to register (None: a random one, printed)")
    service_wait_s: float = Field(60.0, gt=0, le=3600, description="how long a rollout (or the "
                                  "plan) waits for a live service of its name with a free slot")


class RunConfig(ServicesOptions):
    model_config = ConfigDict(extra="forbid")
    envs: list[EnvChoice] = Field(..., min_length=1, description="environments and weights")
    agent: str = Field("tool", description="tool | tool:summarize | oracle | a command line")
    agent_install: list[str] = Field(
        default_factory=list, description="how a command agent is made present in the sandbox: "
        "pip:REQUIREMENT | npm:PACKAGE[@VERSION] | script:PATH (repeatable)")
    agent_on_host: bool = Field(False, description="run a command agent as a host process "
                                "(no containment; a loud warning)")
    model: str | None = Field(None, description="model for the in-process gateway "
                              "(None: the bundled tiny model; zero; scripted:FILE; "
                              "provider/name)")
    sandbox: str | None = Field(
        None, description="sandbox kind (envs/sandbox/kinds.py, auto, or a dotted path); None: "
        "each manifest's choice")
    n: int | None = Field(None, ge=1, description="tasks in total (split by the env weights)")
    k: int = Field(1, ge=1, le=1024, description="samples per task (group size)")
    concurrency: int = Field(4, ge=1, le=4096, description="rollouts in flight")
    tasks: list[str] = Field(default_factory=list, description="only these task ids")
    out: Path | None = Field(None, description="results folder (one JSON per rollout)")
    resume: bool = Field(False, description="skip rollouts already finished in --out")
    gateway: str | None = Field(None, description="an existing gateway's URL")
    admin_key: str | None = Field(None, description="admin key of --gateway")
    max_turns: int | None = Field(None, ge=1, description="override the manifests' max_turns")
    time_limit_s: float | None = Field(None, gt=0, description="override agent time limits")
    schedule: str = Field("fifo", description="which rollout starts next: fifo | seer (one "
                          "probe per group first, then longest-first; runner/scheduling.py)")
    executor: str = Field("inprocess", description="where rollouts run: inprocess | ray (a Ray "
                          "cluster at RAY_ADDRESS) | package.module:Class (runner/executor.py)")
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
        served = [c.ref for c in self.envs if c.ref.startswith("service:")]
        if served and not self.services:
            raise ValueError(f"{served[0]} runs in a task service: give --services HOST:PORT, "
                             "where services register (e.g. 127.0.0.1:7000)")
        return self
