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
3. Reports to the grading wrapper (envhub_grade_wrapper.py, the parent process) on the pipe
   ENVHUB_WATCH_FD: each test's start and end (the wrapper enforces the per-test limit from
   outside), a "bye" when pytest unconfigures (a run that closes the pipe early, or stops this
   plugin, never says it), and what the runner guard finds.
4. The runner guard (Python >= 3.8: an audit hook, which nothing can remove once added),
   installed here, before conftest files and the code under test are imported. It snapshots
   the runner (the pytest, _pytest, pluggy and unittest modules: their functions and classes,
   the classes' methods, the functions' code) and re-checks it when each test starts and
   ends; it watches the registered plugins for one defined in a file the agent's patch
   touched (ENVHUB_AGENT_FILES); and it reports, the moment they happen, runner functions'
   code being replaced and the introspection that reaches a runner from outside (frames,
   gc referrers, tracing, ctypes, /proc/*/environ|mem|fd, this plugin's files and record)
   when called from a file the patch touched. Findings go to the wrapper at once.
   What it does not stop: tampering that changes only instance state reached without any of
   those (the canaries are for that), and code the hook cannot attribute to the patch's files.
Compatible with pytest >= 6 and Python >= 3.6 (prebuilt SWE-bench images are old).
"""

import json
import os
import signal
import sys

import pytest

LIMIT = float(os.environ.get("ENVHUB_TEST_TIMEOUT", "0") or 0)
MAX_TIMEOUTS = int(os.environ.get("ENVHUB_MAX_TIMEOUTS", "3") or 3)
MARK = "envhub per-test timeout"
_NONCE = os.environ.pop("ENVHUB_GRADE_NONCE", "")
_RESULTS = os.environ.pop("ENVHUB_GRADE_RESULTS", "")
_SEVERITY = {"PASSED": 0, "XPASS": 1, "XFAIL": 2, "SKIPPED": 3, "FAILED": 4, "ERROR": 5}
_outcomes: dict = {}
_timeouts = [0]
RUNNER = ("pytest", "_pytest", "pluggy", "unittest", "envhub_test_timeout")
INTROSPECTION = frozenset(("sys._getframe", "sys._current_frames", "gc.get_objects",
                           "gc.get_referrers", "gc.get_referents", "sys.settrace",
                           "sys.setprofile", "ctypes.dlsym", "ctypes.dlopen", "ctypes.cdata",
                           "object.__getattr__"))
FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))


def _watched(path):
    """Paths whose reading or listing reaches the runner's secrets or memory."""
    if not isinstance(path, str):
        return False
    if path.startswith("/proc/"):
        return path.endswith(("/environ", "/mem", "/fd")) or "/fd/" in path
    return "envhub_test_timeout" in path or path == _RESULTS


def _channel():
    """send(kind, text) on the wrapper's pipe (a no-op without one)."""
    fd = os.environ.pop("ENVHUB_WATCH_FD", "")
    write = os.write

    def send(kind, text=""):
        if not fd.isdigit():
            return
        line = ("%s %s" % (kind, text)).replace("\n", " ")[:4000] + "\n"
        try:
            write(int(fd), line.encode("utf-8", "replace"))
        except OSError:
            pass
    return send


def _runner_modules():
    return [(name, module) for name, module in list(sys.modules.items())
            if module is not None and name.split(".")[0] in RUNNER]


def _snapshot():
    """[(holder's name, holder's namespace, attribute, object)] of the runner's callables, and
    the ids of its functions."""
    entries = []
    for name, module in _runner_modules():
        space = getattr(module, "__dict__", {})
        for attr, value in list(space.items()):
            if callable(value):
                entries.append((name, space, attr, value))
            if isinstance(value, type) and getattr(value, "__module__", "") == name:
                for key, member in list(vars(value).items()):
                    if callable(member) or isinstance(member, (staticmethod, classmethod,
                                                               property)):
                        entries.append((name + "." + value.__name__, vars(value), key, member))
    functions = {id(value) for _, _, _, value in entries if hasattr(value, "__code__")}
    return entries, functions


def _runner_dirs():
    dirs = []
    for name, module in _runner_modules():
        path = getattr(module, "__file__", None)
        if path and "." not in name:
            dirs.append(os.path.dirname(path) + os.sep if name != "envhub_test_timeout"
                        else path)
    return tuple(dirs)


def _from_runner(obj, dirs, agent_files):
    """Was `obj` written by the runner itself (pytest changes some of its own classes at
    configure time, e.g. legacypath's Config._getini_unknown_type) or by the project's test
    code, which the patch cannot change (a conftest.py patching unittest for old Pythons)?"""
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__func__", None),
                                                     "__code__", None)
    if code is None:
        return (getattr(obj, "__module__", None) or "").split(".")[0] in RUNNER
    path = code.co_filename
    name = os.path.basename(path)
    test_code = (name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py"))
    return path.startswith(dirs) or (test_code and path not in agent_files
                                     and os.path.isfile(path))


def _guard(send):
    """Install the runner guard; returns check(), which re-checks the runner and plugins."""
    if not hasattr(sys, "addaudithook"):
        return lambda pluginmanager=None: None
    listed = os.environ.pop("ENVHUB_AGENT_FILES", "")
    agent_files = set()
    if listed:
        try:
            with open(listed) as handle:
                agent_files = {line.strip() for line in handle if line.strip()}
        except OSError:
            pass
    entries, functions = _snapshot()
    dirs, from_runner = _runner_dirs(), _from_runner
    reported = set()
    busy = [False]
    getframe, str_, watched = sys._getframe, str, _watched

    def find(what):
        if what not in reported:
            reported.add(what)
            send("finding", what)

    def agent_caller():
        """file:line of the patch's code that raised the event itself (or through inspect's
        frame helpers), else None: standard library code asking for its caller's frame on
        the patch's behalf (namedtuple, logging) is not the patch reaching for frames."""
        frame = getframe(2)
        if frame is not None and frame.f_code.co_filename.endswith(("/inspect.py",)):
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename in agent_files:
            return "%s:%d" % (frame.f_code.co_filename, frame.f_lineno)
        return None

    def hook(event, args):
        if busy[0]:
            return
        busy[0] = True
        try:
            if event in ("object.__setattr__", "object.__delattr__"):
                if id(args[0]) in functions:
                    find("the runner's %s.%s was replaced" % (
                        getattr(args[0], "__qualname__", "?"), args[1]))
            elif event in INTROSPECTION or event in ("open", "os.listdir", "os.scandir"):
                if event == "object.__getattr__" and args[1] not in FRAME_ATTRS:
                    return
                if event in ("open", "os.listdir", "os.scandir") and not watched(
                        args[0] if args else None):
                    return
                where = agent_caller()
                if where:
                    find("code the patch touched (%s) used %s%s" % (
                        where, event, " on " + str_(args[0])[:200] if event == "open" else ""))
        finally:
            busy[0] = False

    sys.addaudithook(hook)

    def check(pluginmanager=None):
        busy[0] = True
        try:
            for i, (holder, space, attr, value) in enumerate(entries):
                now = space.get(attr, value)
                if now is value:
                    continue
                if from_runner(now, dirs, agent_files):
                    entries[i] = (holder, space, attr, now)
                else:
                    find("the runner's %s.%s was replaced" % (holder, attr))
            for plugin in (pluginmanager.get_plugins() if pluginmanager else ()):
                module = sys.modules.get(getattr(plugin, "__module__", None) or "") \
                    if not hasattr(plugin, "__file__") else plugin
                path = getattr(module, "__file__", None)
                if path in agent_files:
                    find("a pytest plugin is registered from %s, a file the patch touched" % path)
        finally:
            busy[0] = False
    return check


_send = _channel()
_check = _guard(_send)
_config: list[object] = []


class TestTimedOut(BaseException):
    pass


def _on_alarm(signum, frame):
    raise TestTimedOut(f"test exceeded {LIMIT:g}s ({MARK})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _timeouts[0] >= MAX_TIMEOUTS:
        pytest.fail(f"not run: {_timeouts[0]} tests already timed out ({MARK})",
                    pytrace=False)


def pytest_configure(config):
    _config[:] = [config.pluginmanager]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config, _check=_check, _send=_send):
    _check(config.pluginmanager)
    _send("bye")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem, _check=_check, _send=_send):
    # the guard's functions bound here: replacing the module's names later changes nothing
    _send("start", item.nodeid)
    _check(_config[0] if _config else None)
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
        _check(_config[0] if _config else None)
        _send("end", item.nodeid)


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
