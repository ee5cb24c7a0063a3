"""`bash`: run one command in a fresh shell in the sandbox's workdir."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from envhub.envs.sandbox.base import Sandbox
from envhub.envs.tools.result import ToolResult, ToolState
from envhub.envs.tools.truncation import cut_middle

MAX_TIMEOUT_S = 3600.0

SCHEMA = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a bash command in the sandbox (working directory: the task's workspace). "
            "Each call is a fresh shell: `cd` and variables do not persist. There is no "
            "network. Long output is cut in the middle; redirect to a file to keep it all."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the command to run"},
                "timeout": {"type": "number",
                            "description": "seconds before the command is killed (optional)"},
            },
            "required": ["command"],
        },
    },
}


class BashArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1)
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)


async def run_bash(args: BashArgs, sandbox: Sandbox, state: ToolState,
                   default_timeout: float | None) -> ToolResult:
    timeout = args.timeout or default_timeout
    result = await sandbox.exec(args.command, timeout=timeout)
    output = result.stdout
    if result.stderr:
        output = f"{output}{'' if not output or output.endswith(chr(10)) else chr(10)}" \
                 f"{result.stderr}"
    output = cut_middle(output)
    if result.timed_out:
        return ToolResult(f"{output}\n[command timed out after {timeout:g}s and was killed; "
                          "run long jobs in the background or with a smaller input]",
                          is_error=True, exit_code=result.exit_code)
    if result.exit_code != 0:
        output = f"{output}\n[exit code {result.exit_code}]"
    return ToolResult(output or "[no output]", exit_code=result.exit_code)
