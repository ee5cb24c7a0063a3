"""`submit`: the agent declares it is done; the rollout ends after this call."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from envhub.envs.tools.result import ToolResult, ToolState

SCHEMA = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit your work and end the task. Call it once, when you are done.",
        "parameters": {
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "optional note about the work"},
            },
            "required": [],
        },
    },
}


class SubmitArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str | None = None


async def run_submit(args: SubmitArgs, state: ToolState) -> ToolResult:
    if state.submitted:
        return ToolResult("already submitted", is_error=True, submitted=True)
    state.submitted = True
    state.submit_message = args.message
    return ToolResult("submitted", submitted=True)
