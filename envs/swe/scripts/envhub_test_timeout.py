"""pytest plugin loaded at grading time (`-p envhub_test_timeout`).

1. A per-test time limit: a test running longer than ENVHUB_TEST_TIMEOUT seconds is
   interrupted by SIGALRM and reported as failed, so one hanging test cannot stop the run.
   The exception derives from BaseException so `except Exception:` cannot swallow it. After
   ENVHUB_MAX_TIMEOUTS timeouts every remaining test fails at once without running: a patch
   that hangs everything ends in a bounded time, with a failing verdict.
2. A sealed record of the run: every test's outcome and pytest's exit status, written at
   session end to ENVHUB_GRADE_RESULTS with the nonce ENVHUB_GRADE_NONCE. Both variables are
   removed from the environment when this plugin loads, before any code under test is
   imported, so a patch that prints a forged summary and exits 0 from an atexit hook is
   caught: the record's exit status and outcomes disagree with the forged ones.
Compatible with pytest >= 6 and Python >= 3.6 (prebuilt SWE-bench images are old).
"""

import json
import os
import signal

import pytest

LIMIT = float(os.environ.get("ENVHUB_TEST_TIMEOUT", "0") or 0)
MAX_TIMEOUTS = int(os.environ.get("ENVHUB_MAX_TIMEOUTS", "3") or 3)
MARK = "envhub per-test timeout"
_NONCE = os.environ.pop("ENVHUB_GRADE_NONCE", "")
_RESULTS = os.environ.pop("ENVHUB_GRADE_RESULTS", "")
_SEVERITY = {"PASSED": 0, "XPASS": 1, "XFAIL": 2, "SKIPPED": 3, "FAILED": 4, "ERROR": 5}
_outcomes: dict = {}
_timeouts = [0]


class TestTimedOut(BaseException):
    pass


def _on_alarm(signum, frame):
    raise TestTimedOut(f"test exceeded {LIMIT:g}s ({MARK})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _timeouts[0] >= MAX_TIMEOUTS:
        pytest.fail(f"not run: {_timeouts[0]} tests already timed out ({MARK})",
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    armed = LIMIT > 0 and hasattr(signal, "setitimer")
    previous = None
    if armed:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, LIMIT)
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _status(report):
    if hasattr(report, "wasxfail"):
        return "XPASS" if report.passed else "XFAIL"
    if report.skipped:
        return "SKIPPED"
    if report.failed:
        return "FAILED" if report.when == "call" else "ERROR"
    return "PASSED" if report.when == "call" else None


def pytest_runtest_logreport(report):
    if report.failed and report.when == "call" and MARK in str(report.longrepr):
        _timeouts[0] += 1
    status = _status(report)
    if status is None:
        return
    old = _outcomes.get(report.nodeid)
    if old is None or _SEVERITY[status] > _SEVERITY[old]:
        _outcomes[report.nodeid] = status


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if not _RESULTS:
        return
    with open(_RESULTS, "w") as handle:
        json.dump({"nonce": _NONCE, "exitstatus": int(exitstatus), "outcomes": _outcomes},
                  handle)
