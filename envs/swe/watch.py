"""The grading wrapper's side of a graded run: the command it wraps, and what it reported.

scripts/envhub_grade_wrapper.py runs the test command as its child, outside the reach of the
code under test: it enforces the per-test limit from outside (a test spinning in C code,
where the in-process alarm never fires, has its process group killed) and collects what the
runner guard in the pytest plugin saw. Its report is the last line it prints, marked with a
nonce it printed first, before the child existed; the child cannot forge it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from envhub.envs.sandbox.base import Sandbox
from envhub.envs.swe.repo import SCRATCH, SCRIPTS

WRAPPER = f"{SCRATCH}/plugins/envhub_grade_wrapper.py"
PREFIX = "ENVHUB-WRAPPER"
_BEGIN = re.compile(rf"^{PREFIX} ([0-9a-f]{{32}}) begin$", re.M)


@dataclass
class Watched:
    stdout: str  # the run's output without the wrapper's lines
    report: dict[str, Any] | None  # None: the wrapper never reported
    problems: list[str] = field(default_factory=list)  # tampering the wrapper shows
    started: bool = True  # False: the wrapper never ran (nothing the patch can cause)

    @property
    def killed(self) -> str | None:
        return (self.report or {}).get("killed")


async def stage(sandbox: Sandbox, agent_files: list[str]) -> dict[str, str]:
    """Put the wrapper and the list of files the patch touched in the sandbox; the env vars
    the plugin reads (and removes from its environment when it loads)."""
    await sandbox.write_file(WRAPPER, (SCRIPTS / "envhub_grade_wrapper.py").read_bytes())
    listed = f"{SCRATCH}/agent-files.txt"
    await sandbox.write_file(listed, "".join(f"{p}\n" for p in agent_files).encode())
    return {"ENVHUB_AGENT_FILES": listed}


def wrapped(command: str, limit_s: float) -> str:
    """`command` run by the wrapper (isolated mode: no PYTHONPATH, no site, no cwd import)."""
    return (f"python3 -I -S {WRAPPER} {limit_s:g} -- sh -c {shlex.quote(command)}")


def read(stdout: str) -> Watched:
    """Split the wrapper's report from the run's output."""
    begin = _BEGIN.search(stdout)
    if begin is None:
        return Watched(stdout, None, started=False)
    nonce = begin.group(1)
    end = stdout.rfind(f"\n{PREFIX} {nonce} end ")
    body = stdout[begin.end() + 1:end if end >= 0 else len(stdout)]
    if end < 0:
        return Watched(body, None, ["the grading wrapper was stopped before it reported (code "
                                    "under test killed the process watching it)"])
    line = stdout[end + 1:].split("\n", 1)[0]
    try:
        report = json.loads(line.split(" ", 3)[3])
    except (IndexError, ValueError):
        return Watched(body, None, ["the grading wrapper's report is unreadable"])
    problems = [f"runner guard: {f}" for f in report.get("findings", [])]
    if not report.get("bye") and report.get("exit") in (0, 1) and not report.get("killed"):
        problems.append("pytest ended without the envhub plugin saying goodbye (the plugin was "
                        "stopped or its channel to the wrapper closed from inside)")
    return Watched(body, report, problems)
