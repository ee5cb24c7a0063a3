"""`str_replace_editor`: SWE-agent's file editor (view, create, str_replace, insert, undo_edit).

Files go through the sandbox's read_file/write_file, so an edit is byte-exact apart from the
strings the model sent. Every change pushes the previous content onto a per-file history
in `ToolState`, which `undo_edit` pops.
"""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError
from envhub.envs.tools.result import ToolResult, ToolState
from envhub.envs.tools.truncation import cut_middle

SNIPPET_LINES = 4  # context shown around an edit
MAX_VIEW_CHARS = 16000

SCHEMA = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": (
            "View, create and edit files. `view` shows a file with line numbers (or lists a "
            "directory two levels deep); `create` writes a new file; `str_replace` replaces "
            "`old_str`, which must occur exactly once, by `new_str`; `insert` adds `new_str` "
            "after line `insert_line` (0 = at the top); `undo_edit` reverts the last change "
            "to the file."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string",
                            "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                "path": {"type": "string", "description": "file or directory path"},
                "file_text": {"type": "string", "description": "content for `create`"},
                "old_str": {"type": "string", "description": "exact text to replace"},
                "new_str": {"type": "string",
                            "description": "replacement (`str_replace`) or text (`insert`)"},
                "insert_line": {"type": "integer", "description": "line to insert after"},
                "view_range": {"type": "array", "items": {"type": "integer"},
                               "description": "[start, end] lines for `view`; end -1 = EOF"},
            },
            "required": ["command", "path"],
        },
    },
}


class EditorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str = Field(min_length=1)
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: list[int] | None = None


def _numbered(text: str, first: int = 1) -> str:
    return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(text.split("\n"), first))


def _error(message: str) -> ToolResult:
    return ToolResult(message, is_error=True)


async def _read_text(sandbox: Sandbox, path: str) -> str:
    data = await sandbox.read_file(path)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SandboxFileError(f"{path} is not UTF-8 text; use bash to inspect it") from None


async def run_editor(args: EditorArgs, sandbox: Sandbox, state: ToolState) -> ToolResult:
    try:
        if args.command == "view":
            return await _view(args, sandbox)
        if args.command == "create":
            return await _create(args, sandbox, state)
        if args.command == "str_replace":
            return await _str_replace(args, sandbox, state)
        if args.command == "insert":
            return await _insert(args, sandbox, state)
        return await _undo(args, sandbox, state)
    except SandboxFileError as e:
        return _error(str(e))


async def _write_keeping_mode(sandbox: Sandbox, path: str, data: bytes) -> None:
    """Rewrite an existing file without losing its permission bits (scripts stay executable)."""
    probe = await sandbox.exec(f"stat -c %a {shlex.quote(path)}", timeout=30)
    mode = int(probe.stdout.strip(), 8) if probe.exit_code == 0 and probe.stdout.strip() else 0o644
    await sandbox.write_file(path, data, mode)


async def _is_dir(sandbox: Sandbox, path: str) -> bool:
    result = await sandbox.exec(f"test -d {shlex.quote(path)}", timeout=30)
    return result.exit_code == 0


async def _view(args: EditorArgs, sandbox: Sandbox) -> ToolResult:
    if await _is_dir(sandbox, args.path):
        if args.view_range:
            return _error("view_range applies to files, not directories")
        listing = await sandbox.exec(
            f"find {shlex.quote(args.path)} -maxdepth 2 -not -path '*/.*' | sort", timeout=30)
        return ToolResult(cut_middle(listing.stdout, MAX_VIEW_CHARS // 2, MAX_VIEW_CHARS // 2))
    text = await _read_text(sandbox, args.path)
    lines = text.split("\n")
    first = 1
    if args.view_range is not None:
        if len(args.view_range) != 2:
            return _error("view_range must be two integers [start, end]; end -1 means EOF")
        start, end = args.view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= len(lines) or end < start or end > len(lines):
            return _error(f"view_range {args.view_range} is outside the file's 1..{len(lines)} "
                          "lines (start >= 1, end >= start, end -1 for the end of the file)")
        lines, first = lines[start - 1:end], start
    body = _numbered("\n".join(lines), first)
    return ToolResult(cut_middle(body, MAX_VIEW_CHARS // 2, MAX_VIEW_CHARS // 2))


async def _exists(sandbox: Sandbox, path: str) -> bool:
    result = await sandbox.exec(f"test -e {shlex.quote(path)}", timeout=30)
    return result.exit_code == 0


async def _create(args: EditorArgs, sandbox: Sandbox, state: ToolState) -> ToolResult:
    if args.file_text is None:
        return _error("`create` needs `file_text` (the full content of the new file)")
    if await _exists(sandbox, args.path):
        return _error(f"{args.path} already exists; `create` never overwrites. Use "
                      "`str_replace` to edit it")
    await sandbox.write_file(args.path, args.file_text.encode())
    state.history.setdefault(args.path, []).append(None)  # undo of a create deletes the file
    return ToolResult(f"created {args.path} ({len(args.file_text)} characters)")


def _snippet(text: str, line: int, added_lines: int) -> str:
    lines = text.split("\n")
    start = max(0, line - SNIPPET_LINES)
    end = min(len(lines), line + added_lines + SNIPPET_LINES)
    return _numbered("\n".join(lines[start:end]), start + 1)


async def _str_replace(args: EditorArgs, sandbox: Sandbox, state: ToolState) -> ToolResult:
    if args.old_str is None:
        return _error("`str_replace` needs `old_str` (exact text, occurring once in the file)")
    if args.old_str == "":
        return _error("`old_str` is empty; give the exact text to replace")
    text = await _read_text(sandbox, args.path)
    count = text.count(args.old_str)
    if count == 0:
        return _error(f"`old_str` does not occur in {args.path}; it must match exactly, "
                      "including whitespace and indentation (view the file first)")
    if count > 1:
        lines = [i + 1 for i, line in enumerate(text.split("\n"))
                 if args.old_str.split("\n")[0] in line]
        return _error(f"`old_str` occurs {count} times in {args.path} (lines {lines[:20]}); "
                      "include more surrounding lines so that it matches exactly once")
    new_str = args.new_str or ""
    updated = text.replace(args.old_str, new_str, 1)
    state.history.setdefault(args.path, []).append(text.encode())
    await _write_keeping_mode(sandbox, args.path, updated.encode())
    line = text[: text.index(args.old_str)].count("\n") + 1
    return ToolResult(f"edited {args.path}. Snippet:\n"
                      f"{_snippet(updated, line, new_str.count(chr(10)) + 1)}\n"
                      "Check the snippet; edit again if needed.")


async def _insert(args: EditorArgs, sandbox: Sandbox, state: ToolState) -> ToolResult:
    if args.insert_line is None or args.new_str is None:
        return _error("`insert` needs `insert_line` (0 = top) and `new_str`")
    text = await _read_text(sandbox, args.path)
    lines = text.split("\n")
    if not 0 <= args.insert_line <= len(lines):
        return _error(f"insert_line {args.insert_line} is outside 0..{len(lines)}")
    new_lines = args.new_str.split("\n")
    updated = "\n".join(lines[: args.insert_line] + new_lines + lines[args.insert_line:])
    state.history.setdefault(args.path, []).append(text.encode())
    await _write_keeping_mode(sandbox, args.path, updated.encode())
    return ToolResult(f"inserted {len(new_lines)} line(s) into {args.path}. Snippet:\n"
                      f"{_snippet(updated, args.insert_line + 1, len(new_lines))}")


async def _undo(args: EditorArgs, sandbox: Sandbox, state: ToolState) -> ToolResult:
    history = state.history.get(args.path)
    if not history:
        return _error(f"no edits of {args.path} to undo")
    previous = history.pop()
    if previous is None:
        await sandbox.exec(f"rm -f {shlex.quote(args.path)}", timeout=30)
        return ToolResult(f"reverted the creation of {args.path} (file removed)")
    await _write_keeping_mode(sandbox, args.path, previous)
    return ToolResult(f"reverted the last edit of {args.path}")
