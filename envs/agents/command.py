"""A command-line agent run as a HOST process (`--agent-on-host` only: no containment, it has
this machine's rights; the default runs command agents inside the sandbox, boxed.py), with its
OpenAI and Anthropic endpoints pointing at its own gateway session (so every model call it
makes is recorded in that session).

Environment given to the command:
  OPENAI_BASE_URL=<gateway>/v1  OPENAI_API_KEY=<session key>
  ANTHROPIC_BASE_URL=<gateway>  ANTHROPIC_API_KEY=<session key>
  ENVHUB_SESSION_ID, ENVHUB_TASK_ID, ENVHUB_TASK_FILE (instruction as a file),
  ENVHUB_MODEL, ENVHUB_SANDBOX_KIND, ENVHUB_SANDBOX_ID (e.g. for `docker exec` into it).
Placeholders in the command line: {instruction} {task_file} {task_id} {model}.
The process runs in a fresh temporary folder in its own process group; on time limit or
cancellation the whole group is killed, and the folder is removed afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path
from typing import BinaryIO

from envhub.envs.agents.base import AgentContext, AgentResult
from envhub.envs.errors import AgentError, AgentSpecError

TAIL_CHARS = 2000
PLACEHOLDERS = ("{instruction}", "{task_file}", "{task_id}", "{model}")


def command_words(command: str) -> list[str]:
    """An --agent command line as words (AgentSpecError, with the fix, when it cannot be)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise AgentSpecError(f"--agent {command!r}: cannot split into words ({e}); "
                             "check the quotes") from None
    if not argv:
        raise AgentSpecError("--agent is empty; give oracle, tool, or a command line")
    return argv


class CommandAgent:
    def __init__(self, command: str) -> None:
        self.argv = command_words(command)
        self.name = command

    async def run(self, ctx: AgentContext) -> AgentResult:
        workdir = Path(tempfile.mkdtemp(prefix="agent-", dir=ctx.run.scratch))
        try:
            rc, stopped = await self._run_in(workdir, ctx)
            out_path, err_path = workdir / ".envhub_stdout", workdir / ".envhub_stderr"
            stdout, stderr = _tail(out_path), _tail(err_path)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if rc not in (0, None):
            raise AgentError(f"agent command exited with code {rc}: {stderr[-500:]}")
        info = {"exit_code": rc, "stdout_tail": stdout, "stderr_tail": stderr}
        return AgentResult(stopped=stopped, info=info)

    async def _run_in(self, workdir: Path, ctx: AgentContext) -> tuple[int | None, str]:
        """Run the command in `workdir`; (exit code or None when stopped, how it ended).
        Whatever happens, nothing it started survives: its process group is killed at the
        end, also after a normal exit (background children of the agent)."""
        task_file = workdir / ".envhub_task.md"
        task_file.write_text(ctx.task.instruction, encoding="utf-8")
        values = {"{instruction}": ctx.task.instruction, "{task_file}": str(task_file),
                  "{task_id}": ctx.task.id, "{model}": ctx.model}
        argv = [substitute(a, values) for a in self.argv]
        env = {**os.environ, **self._session_env(ctx, task_file)}
        out, err = _open_logs(workdir / ".envhub_stdout", workdir / ".envhub_stderr")
        with out, err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=workdir, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True,
                )
            except OSError as e:
                raise AgentError(f"cannot start agent command {argv[0]!r}: {e}; check that "
                                 "it is installed and on PATH") from None
            try:
                rc: int | None = await asyncio.wait_for(proc.wait(), ctx.limits.time_limit_s)
                return rc, "exited"
            except TimeoutError:
                return None, "time_limit"
            finally:
                await _kill_group(proc)

    def _session_env(self, ctx: AgentContext, task_file: Path) -> dict[str, str]:
        root = ctx.gateway_url.rstrip("/")
        key = str(ctx.session.api_key)
        return {
            "OPENAI_BASE_URL": f"{root}/v1", "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": key,
            "ENVHUB_SESSION_ID": str(ctx.session.id), "ENVHUB_TASK_ID": ctx.task.id,
            "ENVHUB_TASK_FILE": str(task_file), "ENVHUB_MODEL": ctx.model,
            "ENVHUB_SANDBOX_KIND": ctx.run.sandbox_kind, "ENVHUB_SANDBOX_ID": ctx.sandbox.id,
        }


def _open_logs(out_path: Path, err_path: Path) -> tuple[BinaryIO, BinaryIO]:
    # Files, not pipes: a chatty agent can never block on a full pipe buffer.
    return open(out_path, "wb"), open(err_path, "wb")


def substitute(arg: str, values: dict[str, str]) -> str:
    # Only the known placeholders: a JSON argument with other braces passes through untouched.
    for key in PLACEHOLDERS:
        arg = arg.replace(key, values[key])
    return arg


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the agent and everything it started (its own process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        pass


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-TAIL_CHARS:].decode(errors="replace")
