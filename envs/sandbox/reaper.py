"""Leak prevention: every sandbox is labelled with its run and owner, and removed on close,
on interpreter exit (atexit), on SIGTERM/SIGHUP, and by `reap()` for owners that crashed.

Labels on every docker container (and metadata on every e2b sandbox):
  envhub.sandbox=1, envhub.run=<run id>, envhub.owner=<hostname>:<pid>
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

LABEL_SANDBOX = "envhub.sandbox"
LABEL_RUN = "envhub.run"
LABEL_OWNER = "envhub.owner"

_cleanups: dict[str, Callable[[], None]] = {}
_lock = threading.Lock()
_installed = False
_signals_installed = False


def owner_label() -> str:
    """`<hostname>:<pid>` of this process, stamped on every sandbox it creates."""
    return f"{socket.gethostname()}:{os.getpid()}"


def sandbox_labels(run_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**(extra or {}), LABEL_SANDBOX: "1", LABEL_RUN: run_id, LABEL_OWNER: owner_label()}


def owner_alive(owner: str) -> bool:
    """Whether the process named by an `envhub.owner` label still runs (unknown host: alive)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's sandbox: never reap it as stale from here
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def track(key: str, cleanup: Callable[[], None]) -> None:
    """Register a blocking cleanup to run if the process exits with the sandbox still open."""
    install()
    with _lock:
        _cleanups[key] = cleanup


def untrack(key: str) -> None:
    with _lock:
        _cleanups.pop(key, None)


def cleanup_all() -> int:
    """Run every pending cleanup (best effort; failures are logged). Returns how many ran."""
    with _lock:
        pending = list(_cleanups.items())
        _cleanups.clear()
    for key, cleanup in pending:
        try:
            cleanup()
        except Exception as e:  # noqa: BLE001 - exiting: one failed removal must not stop the others
            log.warning("could not clean up sandbox %s at exit: %s", key, e)
    return len(pending)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    cleanup_all()
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    # Default action of SIGTERM/SIGHUP is to die with the signal: do exactly that.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}


def install() -> None:
    """Register the atexit hook (once) and, when called from the main thread, the SIGTERM /
    SIGHUP handlers (once). Sandbox constructors call it before going to worker threads."""
    global _installed, _signals_installed
    if not _installed:
        _installed = True
        atexit.register(cleanup_all)
    # Signal handlers only from the main thread, and chained to whatever was there, so that
    # servers installing their own handlers (uvicorn) keep working.
    if _signals_installed or threading.current_thread() is not threading.main_thread():
        return
    _signals_installed = True
    for signum in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:
            continue
        _previous[signum] = current if callable(current) else None
        signal.signal(signum, _on_signal)
