"""Canaries made of the graded file's own tests, planted in every shipped swe-task and run with
the real pytest on the task's real files: never a false alarm (gold fix, unfixed code), always
caught by code that flips failures, and not told apart by the marks the old synthetic canaries
had (a fixed word plus six hex digits; an addition compared with a constant)."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from envhub.envs.loader import load_env
from envhub.envs.swe import canary
from envhub.envs.swe.logparse import PASSED, parse_log
from envhub.envs.swe.task import SWETask, load_swe_tasks

ROOT = Path(load_env("swe-task").folder)
TASKS = {t.instance_id: t for t in load_swe_tasks(ROOT / "data" / "tasks.jsonl")}
FLIP_CONFTEST = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
'''


def _patch(repo: Path, diff: str) -> None:
    done = subprocess.run(["patch", "-p1", "-s", "-f"], input=diff.encode(), cwd=repo,
                          capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def graded_repo(task: SWETask, tmp: Path, fixed: bool) -> Path:
    """The task's repository as the grader sees it: snapshot, bug, hidden tests (+ gold fix)."""
    with tarfile.open(ROOT / "data" / str(task.source_archive)) as archive:
        archive.extractall(tmp, filter="data")  # noqa: S202
    entries = list(tmp.iterdir())
    repo = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    _patch(repo, task.source_patch)
    for rel in task.source_remove:
        (repo / rel).unlink()
    _patch(repo, task.test_patch)
    if fixed:
        _patch(repo, task.patch)
    return repo


def run_with_canaries(task: SWETask, repo: Path) -> tuple[canary.Canaries, list[str], bool]:
    """(canaries, tampering found, resolved) for one pytest run of the task's command."""
    rel = task.FAIL_TO_PASS[0].split("::")[0]
    planted, canaries = canary.plant((repo / rel).read_text(), rel, task.FAIL_TO_PASS,
                                     task.PASS_TO_PASS)
    ast.parse(planted)
    (repo / rel).write_text(planted)
    command = canary.command_with(task.command(), canaries).replace(
        "python3", shlex.quote(sys.executable), 1)
    done = subprocess.run(command, shell=True, cwd=repo, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **task.test_env}, timeout=300)
    log = parse_log(task.log_parser, done.stdout)
    resolved = all(log.status(t) == PASSED for t in task.target_tests)
    return canaries, canary.verdict(canaries, log, None), resolved


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_no_false_alarm_and_flipping_is_caught(tmp_path: Path, task_id: str) -> None:
    task = TASKS[task_id]
    for fixed, want in ((True, True), (False, False)):
        canaries, found, resolved = run_with_canaries(
            task, graded_repo(task, tmp_path / f"fixed-{fixed}", fixed))
        assert (found, resolved) == ([], want), (fixed, canaries)
    flipped = graded_repo(task, tmp_path / "flipped", fixed=False)
    (flipped / "conftest.py").write_text(FLIP_CONFTEST)
    canaries, found, resolved = run_with_canaries(task, flipped)
    assert resolved and any("must-fail canary test is PASSED" in f for f in found), canaries


@pytest.mark.parametrize("task_id", sorted(TASKS)[::6])
def test_canaries_look_like_their_neighbours(tmp_path: Path, task_id: str) -> None:
    """Named with the file's own words, no hex tail; bodies copied from graded tests (a negated
    copy differs from its source in one assertion only); one or two of each kind."""
    task = TASKS[task_id]
    repo = graded_repo(task, tmp_path, fixed=False)
    rel = task.FAIL_TO_PASS[0].split("::")[0]
    source = (repo / rel).read_text()
    words = set(re.findall(r"[a-z]+", " ".join(re.findall(r"def (test_\w+)", source))))
    for _ in range(5):
        planted, canaries = canary.plant(source, rel, task.FAIL_TO_PASS, task.PASS_TO_PASS)
        assert 1 <= sum(c.negated for c in canaries.planted) <= 2
        assert len(canaries.planted) <= 4
        for c in canaries.planted:
            assert not re.search(r"_[0-9a-f]{6}$", c.name)
            assert set(c.name.split("_")) <= words | {"test"}, c.name
            assert c.source, "every shipped task has a negatable graded neighbour"
        removed = [line for line in source.splitlines() if line not in planted]
        assert removed == []  # nothing of the file changed, only tests added


def test_a_file_with_a_tiny_vocabulary_still_gets_canaries() -> None:
    """Two tests whose names share one word: every one-word-longer name soon exists; naming
    must still end (it hung a SWE-bench-style row's grading)."""
    source = "def test_one():\n    assert 1 == 1\n\n\ndef test_one_one():\n    assert 2 == 2\n"
    for _ in range(20):
        planted, canaries = canary.plant(source, "t.py", ["t.py::test_one"],
                                         ["t.py::test_one_one"])
        ast.parse(planted)
        assert len({c.name for c in canaries.planted}) == len(canaries.planted)
