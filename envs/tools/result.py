"""What a tool call returns to the agent loop, and the per-rollout state tools share."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolResult:
    """`content` goes back to the model as the tool message. `is_error` marks a failed call
    (bad arguments, unknown tool, timeout, refused edit) for process rewards; a command that
    merely exits non-zero is not an error, its code is in `exit_code`. `submitted` is True
    when the call ended the rollout (the `submit` tool)."""

    content: str
    is_error: bool = False
    submitted: bool = False
    exit_code: int | None = None


@dataclass
class ToolState:
    """Per-rollout state: submission and the editor's undo history (path -> earlier
    contents, None where the file did not exist)."""

    submitted: bool = False
    submit_message: str | None = None
    history: dict[str, list[bytes | None]] = field(default_factory=dict)
    calls: int = 0
    errors: int = 0
