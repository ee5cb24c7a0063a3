"""The task-service protocol's messages (see __init__.py for the exchange)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from envhub.sdk.types import Signal

MAX_CAPACITY = 4096  # rollouts one service may run at once
MAX_TASKS = 100_000  # tasks one service may offer
MAX_TEXT = 1 << 20  # an instruction, a reason


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Registration(_Strict):
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$",
                      description="the environment it serves (service:NAME in a run)")
    url: str = Field(..., pattern=r"^https?://", max_length=2000,
                     description="where the orchestrator reaches it")
    capacity: int = Field(..., ge=1, le=MAX_CAPACITY, description="rollouts at once")
    protocol: Literal[1] = 1


class Registered(_Strict):
    id: str
    heartbeat_s: float


class Heartbeat(_Strict):
    in_flight: int = Field(0, ge=0, le=MAX_CAPACITY)


class TaskRow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(..., min_length=1, max_length=500)
    instruction: str = Field(..., max_length=MAX_TEXT)
    data: dict[str, Any] = Field(default_factory=dict)


class EnvDescription(BaseModel):
    """GET /v1/env: what a run plans its groups from."""

    model_config = ConfigDict(extra="ignore")
    name: str
    version: str = "0"
    description: str = ""
    rewards: dict[str, float] = Field(default_factory=lambda: {"outcome": 1.0})
    tasks: list[TaskRow] = Field(..., max_length=MAX_TASKS)


class Limits(_Strict):
    max_turns: int | None = Field(None, ge=1)
    time_limit_s: float | None = Field(None, gt=0)


class RolloutRequest(_Strict):
    rollout_id: str
    group_id: str
    task_id: str
    sample: int = Field(..., ge=0)
    gateway_url: str
    session_id: str
    api_key: str
    limits: Limits = Field(default_factory=Limits)


class VerdictBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    outcome: float = Field(..., ge=0, le=1)
    resolved: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    env_failure: str | None = Field(None, max_length=MAX_TEXT)
    signals: list[Signal] = Field(default_factory=list, max_length=10_000)


Status = Literal["done", "agent_error", "env_failure"]


class RolloutReport(BaseModel):
    """POST /v1/rollouts' answer: how the rollout ended and the service's verdict."""

    model_config = ConfigDict(extra="ignore")
    status: Status
    reason: str | None = Field(None, max_length=MAX_TEXT)
    stopped: str | None = Field(None, max_length=200)
    turns: int = Field(0, ge=0)
    verdict: VerdictBody | None = None
    duration_s: float = Field(0.0, ge=0)
    setup_s: float = Field(0.0, ge=0)
    verify_s: float = Field(0.0, ge=0)
    signals: list[Signal] = Field(default_factory=list, max_length=10_000,
                                  description="process signals of the agent phase (tool "
                                  "errors), for the orchestrator to record with its key")


def answer_bad_requests(app: FastAPI) -> None:
    """A body that is not the message: 400 naming the fields (both sides of the protocol)."""

    @app.exception_handler(RequestValidationError)
    async def _bad(_: Any, e: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(err.get("loc", ())), "msg": str(err.get("msg"))}
                  for err in e.errors()[:5]]
        return JSONResponse({"error": "bad request", "detail": detail}, status_code=400)
