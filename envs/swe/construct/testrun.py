"""Running a project's tests on the build host (candidate screening; the shipped tasks are
validated again through the real grader in sandboxes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from envhub.envs.swe.diff import protected_reason
from envhub.envs.swe.logparse import TestLog, parse_pytest_log

RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8", "NO_COLOR": "1"}
# Variables that change pytest's output: on CI (`CI`, `BUILD_NUMBER`) pytest stops truncating
# assertion explanations, which would change the problem statements a rebuild writes.
OUTPUT_CHANGING = ("CI", "BUILD_NUMBER", "TERM", "FORCE_COLOR", "PY_COLORS", "COLUMNS", "LINES")
SECTION_RE = re.compile(r"^_{3,} (.+?) _{3,}$")
FRAME_RE = re.compile(r"^(\S+\.py):(\d+): in (\S+)$")
ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{6,}")


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def run_pytest(root: Path, args: list[str], pythonpath: str,
               timeout: float = 120) -> tuple[int, str]:
    """(exit code, stdout) of `python -P -m pytest ARGS` in `root`; -1 on timeout."""
    env = {**{k: v for k, v in os.environ.items()
              if not k.startswith(("PYTEST", "PYTHON")) and k not in OUTPUT_CHANGING},
           **RUN_ENV}
    if pythonpath:
        env["PYTHONPATH"] = str(root / pythonpath)
    cmd = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", *args]
    try:
        result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, ""
    return result.returncode, result.stdout


def run_tests(root: Path, tests: list[str], pythonpath: str) -> tuple[int, TestLog]:
    code, out = run_pytest(root, ["-rA", "--tb=no", *tests], pythonpath)
    return code, parse_pytest_log(out)


def failure_excerpts(root: Path, test_ids: list[str], pythonpath: str,
                     limit: int = 3) -> list[str]:
    """Short tracebacks of failing tests, keeping only test-file frames and `E` lines (what a
    user would paste into an issue, without pointing at the faulty source line)."""
    _, out = run_pytest(root, ["--tb=short", "-q", *test_ids[:limit]], pythonpath)
    excerpts: list[str] = []
    section: list[str] | None = None
    keep_code = False
    for line in out.splitlines():
        if SECTION_RE.match(line):
            if section:
                excerpts.append("\n".join(section))
            section = []
            keep_code = False
            continue
        if section is None:
            continue
        if line.startswith(("=", "FAILED ", "ERROR ", "- Captured")):
            if section:
                excerpts.append("\n".join(section))
            section = None
            continue
        frame = FRAME_RE.match(line)
        if frame:
            keep_code = protected_reason(frame.group(1)) is not None
            if keep_code:
                section.append(line)
        elif line.startswith("E ") and len([x for x in section if x.startswith("E ")]) < 8:
            line = line.replace(f"{root}/", "").replace(str(root), ".")
            section.append(ADDRESS_RE.sub("0x...", line.rstrip()))
        elif keep_code and line.startswith("    "):
            section.append(line.rstrip())
    if section:
        excerpts.append("\n".join(section))
    return [e for e in excerpts if e.strip()][:limit]
