"""The process boundary to verifiers: its interpreter (.venv-verifiers) runs worker.py, one
process per call; what comes back is read with a size cap and a time limit, and the worker is
stopped after each call (SIGTERM, so verifiers cleans up what it started; SIGKILL later).

Failures are sorted here: a missing venv or a verifiers that does not import is an up-front
`VerifiersUnavailable` (EnvLoadError: exit 2 with the command that fixes it); an environment
that needs what envhub does not run is `VerifiersUnsupported`; a worker that crashes, hangs or
answers garbage mid-run is `WorkerFailed` (the runner makes it env_failure).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.envs.errors import EnvLoadError
from envhub.envs.sandbox.base import close_pipes, process_exited

WORKER = Path(__file__).resolve().parent / "worker.py"
CHECKOUT = Path(__file__).resolve().parents[2]  # the repository (envs/verifiers/process.py)
FIX = "bash scripts/verifiers_venv.sh"
MAX_REPLY_BYTES = 16 << 20  # a task list of many long prompts; a score is a few hundred bytes
MAX_STDERR_CHARS = 4000
STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL: verifiers' clean-up of the harness and toolsets
PIPE_GRACE_S = 2.0  # after the worker exits, for the rest of its output
EXIT_ENV, EXIT_INPUT, EXIT_UNSUPPORTED = 3, 4, 5


class VerifiersUnavailable(EnvLoadError):
    """verifiers' interpreter is missing or cannot import verifiers."""


class VerifiersUnsupported(EnvLoadError):
    """The environment needs what envhub does not run (worker exit 5)."""


class WorkerFailed(RuntimeError):
    """A worker call crashed, hung, or answered what is not its reply shape."""


@dataclass
class Reply:
    code: int
    body: dict[str, Any]
    stderr: str


def python() -> Path:
    """verifiers' interpreter: ENVHUB_VERIFIERS_PYTHON, else ENVHUB_VERIFIERS_VENV/bin/python,
    else the checkout's .venv-verifiers, else ./.venv-verifiers."""
    if env := os.environ.get("ENVHUB_VERIFIERS_PYTHON"):
        return Path(env)
    if venv := os.environ.get("ENVHUB_VERIFIERS_VENV"):
        return Path(venv) / "bin" / "python"
    for root in (CHECKOUT, Path.cwd()):
        candidate = root / ".venv-verifiers" / "bin" / "python"
        if candidate.exists():
            return candidate
    return CHECKOUT / ".venv-verifiers" / "bin" / "python"


def require_python() -> Path:
    path = python()
    if not path.exists():
        raise VerifiersUnavailable(f"verifiers environments run with verifiers' own interpreter, "
                                   f"and {path} does not exist: run `{FIX}` (or set "
                                   "ENVHUB_VERIFIERS_PYTHON)")
    return path


def _parse(code: int, out: bytes, err: bytes, what: str) -> Reply:
    stderr = err.decode(errors="replace")[-MAX_STDERR_CHARS:]
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        body = json.loads(lines[-1]) if lines else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if "No module named 'verifiers'" in stderr:
            raise VerifiersUnavailable(f"verifiers is not installed in {python()}: run `{FIX}`")
        raise WorkerFailed(f"verifiers worker {what} exited {code} without a reply: {stderr}")
    if code == EXIT_UNSUPPORTED:
        raise VerifiersUnsupported(f"envhub cannot run this verifiers environment: "
                                   f"{body.get('unsupported')}")
    return Reply(code, body, stderr)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    # No PYTHONPATH/virtualenv of envhub's leaks into verifiers' interpreter.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def call(args: list[str], timeout_s: float, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> Reply:
    """`acall`'s sync twin (task lists at load time): the same capped read, time limit and stop,
    on a private event loop in a thread of its own (callers may be inside a loop already)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="envhub-vf") as pool:
        return pool.submit(asyncio.run, acall(args, timeout_s, cwd, env)).result()


async def acall(args: list[str], timeout_s: float, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> Reply:
    """A worker call on the event loop: its reply read with a cap, the worker stopped
    (`_stop`) past `timeout_s`, on an over-long reply, when cancelled, and in any case after."""
    exe = require_python()
    proc = await asyncio.create_subprocess_exec(
        str(exe), str(WORKER), *args, cwd=cwd, env=_env(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(_read(proc, args[0]), timeout_s)
    except TimeoutError:
        raise WorkerFailed(f"verifiers worker {args[0]} took over {timeout_s:g}s") from None
    finally:
        await asyncio.shield(_stop(proc))
    return _parse(proc.returncode if proc.returncode is not None else -9, out, err, args[0])


async def _read(proc: asyncio.subprocess.Process, what: str) -> tuple[bytes, bytes]:
    """stdout up to the cap (one byte more is already a failure: no need to drain the rest),
    stderr drained to its end with its tail kept (a worker blocked on a full pipe never ends).
    The reply ends when both pipes do, or PIPE_GRACE_S after the worker exits: a process it
    left in a session of its own may hold them for as long as it lives."""
    assert proc.stdout is not None and proc.stderr is not None
    readers = (asyncio.ensure_future(_capped(proc.stdout, what)),
               asyncio.ensure_future(_drain(proc.stderr, 1 << 20)))
    pipes = asyncio.gather(*readers)
    ended = asyncio.ensure_future(process_exited(proc, math.inf))
    try:
        first: set[asyncio.Future[Any]] = {pipes, ended}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not pipes.done():
            await asyncio.wait({pipes}, timeout=PIPE_GRACE_S)
            if not pipes.done():
                close_pipes(proc)  # EOF to both readers: what the worker wrote is kept
        out, err = await pipes
        await ended  # the pipes' end is the worker's, or it ends on its way out
    finally:
        for task in (*readers, ended):
            task.cancel()
    return out, err


async def _capped(stream: asyncio.StreamReader, what: str) -> bytes:
    out = bytearray()
    while len(out) <= MAX_REPLY_BYTES and (chunk := await stream.read(1 << 16)):
        out += chunk
    if len(out) > MAX_REPLY_BYTES:
        raise WorkerFailed(f"verifiers worker {what}: reply over {MAX_REPLY_BYTES} bytes")
    return bytes(out)


async def _drain(stream: asyncio.StreamReader, keep: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(1 << 16):
        data += chunk
        if len(data) > 2 * keep:
            del data[:-keep]
    return bytes(data[-keep:])


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop a worker and what it started. verifiers' subprocess runtime starts the harness
    program and MCP toolsets in sessions of their own (start_new_session), which a signal to
    the worker's process group misses: so SIGTERM first, on which the worker cancels its
    episode and verifiers' own clean-up (`env.serving()`, the runtime) stops them; SIGKILL to
    the group after STOP_GRACE_S for a worker that does not end."""
    if proc.returncode is None:
        _signal(proc, signal.SIGTERM)
        await process_exited(proc, STOP_GRACE_S)
    _signal(proc, signal.SIGKILL)  # whatever is left in the worker's own group
    await process_exited(proc, STOP_GRACE_S)
    close_pipes(proc)  # the reply is read or given up on; a process out of the group may
    # hold the pipes still


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
