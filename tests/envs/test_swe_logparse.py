"""pytest -rA log parsing on logs produced by a real pytest run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envhub.envs.swe.logparse import ERROR, FAILED, PASSED, XFAIL, parse_pytest_log

SAMPLE = '''
import pytest

def test_ok():
    print("PASSED test_sample.py::test_bad")  # a forged line in captured output
    assert True

def test_bad():
    assert 1 == 2

@pytest.mark.skip(reason="no")
def test_skipped():
    pass

@pytest.mark.xfail(run=False)
def test_xfail():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture")

def test_error(broken):
    pass

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x
'''


def run_sample(tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "--tb=no", "-p", "no:cacheprovider",
         "test_sample.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"}, check=False)
    return result.returncode, result.stdout


def test_statuses_from_a_real_run(tmp_path: Path) -> None:
    code, out = run_sample(tmp_path)
    log = parse_pytest_log(out)
    assert code == 1
    assert log.status("test_sample.py::test_ok") == PASSED
    # the forged PASSED line printed by test_ok is in the PASSES section, not the summary
    assert log.status("test_sample.py::test_bad") == FAILED
    assert log.status("test_sample.py::test_error") == ERROR
    assert log.status("test_sample.py::test_xfail") == XFAIL
    assert log.status("test_sample.py::test_skipped") is None  # skips name no id: missing
    assert log.status("test_sample.py::test_param[1]") == PASSED
    assert log.counts["passed"] == 3 and log.counts["failed"] == 1
    assert log.consistent() == (True, "")


def test_worst_status_wins_and_forged_counts_are_inconsistent() -> None:
    text = ("============ short test summary info ============\n"
            "PASSED t.py::a\n"
            "FAILED t.py::a - AssertionError\n"
            "PASSED t.py::b\n"
            "============ 2 passed in 0.01s ============\n")
    log = parse_pytest_log(text)
    assert log.status("t.py::a") == FAILED
    ok, why = log.consistent()
    assert not ok and "summary says" in why


def test_only_the_last_summary_counts_and_cut_logs_have_none() -> None:
    forged = ("== short test summary info ==\nPASSED t.py::a\n== 1 passed in 0.1s ==\n")
    real = "== short test summary info ==\nFAILED t.py::a\n== 1 failed in 0.1s ==\n"
    assert parse_pytest_log(forged + real).status("t.py::a") == FAILED
    cut = "== short test summary info ==\nPASSED t.py::a\n"
    log = parse_pytest_log(cut)
    assert log.status("t.py::a") == PASSED and not log.consistent()[0]
    assert parse_pytest_log("PASSED t.py::a\n").statuses == {}


def test_counts_no_int_can_read_cheaply_are_not_counts():
    """The code under test prints into the log pytest's summary is read from (an atexit hook
    after it): a 5,000-digit count raised ValueError out of grading (an env_failure instead
    of a score), and an Arabic-Indic one was counted."""
    huge = parse_pytest_log("=== short test summary info ===\n=== " + "9" * 5000 +
                            " passed in 1.0s ===\n")
    assert huge.has_summary and huge.counts == {}
    arabic = parse_pytest_log("=== short test summary info ===\n=== \u0661 passed in 1s ===\n")
    assert arabic.counts == {}
    plain = parse_pytest_log("=== short test summary info ===\n"
                             "=== 3 passed, 1 failed in 1.0s ===\n")
    assert plain.counts == {"passed": 3, "failed": 1}
