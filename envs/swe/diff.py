"""Unified diffs (as `git diff --binary` writes them): split per file, drop protected files.

Grading applies only the agent's source changes. Anything that could change how tests are
collected or judged is dropped from the diff before it is applied (so those files stay
pristine): test files and folders, conftest.py, pytest/tox/setup configs, interpreter start-up
hooks, modules that would shadow the test runner, symlinks, and paths outside the repository.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

HEADER_RE = re.compile(r'^diff --git (?:"?a/(.*?)"?) (?:"?b/(.*?)"?)$')
TEST_DIRS = {"test", "tests", "testing"}
CONFIG_FILES = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                "pyproject.toml", "noxfile.py", "sitecustomize.py", "usercustomize.py"}
# Top-level names that would shadow the test runner or its dependencies when imported.
# pytest and every module it imports at start-up (pygments since pytest 8.4; tomli and
# exceptiongroup on older Pythons): a repository shadowing one runs code inside the grader.
SHADOW_NAMES = {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "unittest",
                "pygments", "tomli", "exceptiongroup", "colorama",
                "site", "sitecustomize", "usercustomize", "envhub_test_timeout"}


@dataclass
class FileDiff:
    old_path: str
    new_path: str
    text: str  # the block, from its "diff --git" line to the next one

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p and p != "/dev/null"}

    @property
    def is_symlink(self) -> bool:
        return bool(re.search(r"^(new|old|deleted) (file )?mode 120000$", self.text, re.MULTILINE))


def split_diff(patch: str) -> list[FileDiff]:
    """Per-file blocks of a git diff; text before the first header (commentary) is dropped."""
    blocks: list[FileDiff] = []
    current: list[str] = []
    paths: tuple[str, str] | None = None
    for line in patch.splitlines(keepends=True):
        match = HEADER_RE.match(line.rstrip("\n"))
        if match:
            if paths is not None:
                blocks.append(FileDiff(paths[0], paths[1], "".join(current)))
            paths = (match.group(1), match.group(2))
            current = [line]
        elif paths is not None:
            current.append(line)
    if paths is not None:
        blocks.append(FileDiff(paths[0], paths[1], "".join(current)))
    return blocks


def protected_reason(path: str, extra: set[str] | frozenset[str] = frozenset()) -> str | None:
    """Why an agent may not change `path` (None when it may)."""
    norm = posixpath.normpath(path)
    if path.startswith("/") or norm == ".." or norm.startswith("../") or "\\" in path:
        return "outside the repository"
    parts = norm.split("/")
    name = parts[-1]
    if norm in extra:
        return "a hidden test file"
    if parts[0] == ".git" or ".git" in parts:
        return "git metadata"
    if any(p in TEST_DIRS for p in parts[:-1]):
        return "in a test folder"
    if name in CONFIG_FILES:
        return "test configuration"
    if re.match(r"^test_.*\.py$|^.*_test\.py$|^tests?\.py$", name):
        return "a test file"
    if name.endswith(".pth"):
        return "an interpreter start-up hook"
    stem = name.removesuffix(".py")
    top = parts[0].removesuffix(".py")
    if stem in SHADOW_NAMES or top in SHADOW_NAMES or (
            len(parts) > 1 and parts[0] == "src" and parts[1].removesuffix(".py") in SHADOW_NAMES):
        return "shadows the test runner"
    return None


def filter_patch(patch: str, hidden: set[str] | frozenset[str] = frozenset()
                 ) -> tuple[str, list[str]]:
    """(the patch without protected files, 'path: reason' for each dropped file)."""
    kept: list[str] = []
    dropped: list[str] = []
    for block in split_diff(patch):
        reasons = [f"{p}: {r}" for p in sorted(block.paths)
                   if (r := protected_reason(p, hidden)) is not None]
        if block.is_symlink:
            reasons.append(f"{block.new_path}: symlinks are not applied")
        if reasons:
            dropped.extend(reasons)
        else:
            kept.append(block.text)
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    return text, dropped


# Library code has no business naming the test runner: a patch that does is tampering with
# the run in-process (e.g. rewriting pytest's reports), which no log check can detect.
RUNNER_RE = re.compile(r"\b(_pytest|pytest|pluggy)\b|PYTEST_[A-Z]|ENVHUB_[A-Z]|envhub_test_timeout")


def runner_references(patch: str) -> list[str]:
    """'path: line' for each added line of `patch` that names the test runner."""
    found = []
    for block in split_diff(patch):
        for line in block.text.splitlines():
            if line.startswith("+") and not line.startswith("+++") and RUNNER_RE.search(line):
                found.append(f"{block.new_path}: {line[1:].strip()[:120]}")
    return found


def changed_paths(patch: str) -> list[str]:
    return sorted({p for block in split_diff(patch) for p in block.paths})
