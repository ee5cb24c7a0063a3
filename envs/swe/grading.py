"""SWE-bench grading, hardened against hostile patches.

Contract of `grade`:
* the patch is applied in a FRESH sandbox holding the pristine repository (never the agent's);
* protected files (tests, conftest.py, test config, start-up hooks, runner shadows, symlinks,
  paths outside the repo) are dropped from the patch first, so they stay pristine; then the
  task's test_patch puts the hidden tests in place; a patch whose source changes name the
  test runner (pytest, _pytest, pluggy, PYTEST_*, our plugin) is not resolved: it can only be
  tampering in-process, which no log check could catch;
* resolved ⇔ every FAIL_TO_PASS and PASS_TO_PASS test is PASSED in the log's final summary
  (missing, FAILED, ERROR, SKIPPED, XFAIL all count as failure), the log's lines agree with
  its counts, and the exit code agrees with the log;
* canary tests planted next to the graded ones (`canary.py`) must come out as they must: a
  must-fail canary that passes, or one that vanished, means code from the patch tampered with
  the runner in-process; the verdict is then 0 with a `grading_tampered` signal (not an
  env_failure: the agent did it);
* each test has a time limit (it fails when exceeded); a run that cannot complete (sandbox
  error, test_patch not applying to the pristine repository) is `env_failure`, never 0; the
  whole command timing out is `env_failure` only when it times out without the patch too,
  else 0 with `ungradable_output` (the patch made it hang) — after a second run in another
  fresh sandbox hung too (a run that finishes there is graded from it).
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

from envhub.envs.environment import UNGRADABLE, EnvFailure, Verdict
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxError, SandboxFileError
from envhub.envs.swe import canary, watch
from envhub.envs.swe.diff import changed_paths, filter_patch, runner_references
from envhub.envs.swe.logparse import ERROR, FAILED, PASSED, TestLog, parse_log
from envhub.envs.swe.repo import GIT, GIT_ENV, SCRATCH, pytest_env
from envhub.envs.swe.task import SWETask
from envhub.sdk.types import Signal

LOG_TAIL = 4000
TAMPERED = "grading_tampered"  # the process signal a detected forgery carries


def judge(task: SWETask, log: TestLog, exit_code: int,
          record: dict[str, Any] | None) -> tuple[bool, dict[str, Any]]:
    """Apply the SWE-bench rules plus the consistency checks between the log, the exit code
    and the plugin's sealed record (`record`: None when it is missing or forged)."""
    sealed = (record or {}).get("outcomes", {})

    def status(test: str) -> str:
        logged = log.status(test) or "MISSING"
        if record is not None and logged == PASSED and sealed.get(test) != PASSED:
            return f"{logged} in the log but {sealed.get(test, 'MISSING')} in the record"
        return logged

    f2p = {t: status(t) for t in task.FAIL_TO_PASS}
    p2p = {t: status(t) for t in task.PASS_TO_PASS}
    f2p_ok = sum(s == PASSED for s in f2p.values())
    p2p_ok = sum(s == PASSED for s in p2p.values())
    problems: list[str] = []
    consistent, why = log.consistent()
    if not consistent:
        problems.append(why)
    failures = [t for t, s in log.statuses.items() if s in (FAILED, ERROR)]
    if exit_code == 0 and failures:
        problems.append(f"exit code 0 but {len(failures)} tests failed in the log")
    if exit_code == 1 and not failures:
        problems.append("exit code 1 (tests failed) but the log lists no failure")
    if record is None:
        problems.append("pytest left no sealed record of the run (it did not finish normally, "
                        "or the record was tampered with)")
    elif record.get("exitstatus") != exit_code:
        problems.append(f"the command exited {exit_code} but pytest ended with "
                        f"{record.get('exitstatus')}")
    if exit_code not in (0, 1):
        problems.append(f"the test command exited {exit_code} (pytest: interrupted, internal "
                        "error, usage error or no tests collected)")
    resolved = (not problems and f2p_ok == len(f2p) and p2p_ok == len(p2p))
    info = {
        "f2p_passed": f2p_ok, "f2p_total": len(f2p), "p2p_passed": p2p_ok,
        "p2p_total": len(p2p), "exit_code": exit_code, "problems": problems,
        "failed_tests": dict(sorted((t, s) for t, s in {**f2p, **p2p}.items()
                                    if s != PASSED)[:50]),
    }
    return resolved, info


async def read_record(sandbox: Sandbox, path: str, nonce: str) -> dict[str, Any] | None:
    """The plugin's sealed record, or None when missing, unreadable or without our nonce."""
    try:
        data = json.loads(await sandbox.read_file(path))
    except (SandboxFileError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("nonce") != nonce:
        return None
    if not isinstance(data.get("outcomes"), dict):
        return None
    return data


async def apply_patch(sandbox: Sandbox, repo_dir: str, patch: str, name: str) -> tuple[bool, str]:
    """`git apply` a patch in the repository; (ok, error text)."""
    if not patch.strip():
        return True, ""
    path = f"{SCRATCH}/{name}.diff"
    await sandbox.write_file(path, patch.encode("utf-8", errors="surrogateescape"))
    result = await sandbox.exec(
        f"cd {shlex.quote(repo_dir)} && {GIT} apply --binary --whitespace=nowarn {path}",
        timeout=120, env=GIT_ENV)
    return result.exit_code == 0, (result.stderr or result.stdout).strip()[-1000:]


async def grade(
    task: SWETask, patch: str, open_pristine: Callable[[], Awaitable[Sandbox]],
    *, with_canaries: bool = True,
) -> Verdict:
    """Grade `patch` (the agent's diff) in a fresh sandbox from `open_pristine`.
    `with_canaries=False` exists only to measure what they cost (bench/); never grade so.
    A run that does not finish is run once more in another fresh sandbox before anyone is
    blamed (a loaded machine slows a run past its limit now and then): a failure that does
    not repeat is the grader's, and the retry's verdict stands (info's `grader_retries`);
    one that repeats goes to the pristine control (`_timed_out`)."""
    first = await _grade(task, patch, open_pristine, with_canaries, control=False)
    if HUNG not in first.info:
        return first
    retry = await _grade(task, patch, open_pristine, with_canaries, control=True)
    retry.info["grader_retries"] = 1
    retry.info["grader_failures"] = [first.info[HUNG]]
    return retry


HUNG = "hung"  # info key of a first run that did not finish (its reason); never returned


async def _grade(task: SWETask, patch: str, open_pristine: Callable[[], Awaitable[Sandbox]],
                 with_canaries: bool, control: bool) -> Verdict:
    """One grading run; `control` False: a run that does not finish is returned as is, marked
    with HUNG, instead of going to the pristine control."""
    start = time.monotonic()
    kept, dropped = filter_patch(patch, frozenset(changed_paths(task.test_patch)))
    info: dict[str, Any] = {"dropped_files": dropped, "patch_bytes": len(patch)}
    tampering = runner_references(kept)
    if tampering:
        info["problems"] = [f"the patch references the test runner in source code ("
                            f"{'; '.join(tampering[:3])}); graded as not resolved"]
        return Verdict(0.0, False, info)
    try:
        sandbox = await open_pristine()
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, info, env_failure=f"opening the grading sandbox: {e}")
    try:
        # The hidden tests first, on the pristine repository: if they do not apply there the
        # task's data is broken (env_failure); the agent's patch, which never touches the
        # test_patch's files (filtered above), can then only fail on its own (a 0): applied
        # second, a file or folder of the agent's in a test_patch path cannot turn its
        # rollout into a dropped one.
        ok, error = await apply_patch(sandbox, task.repo_dir, task.test_patch, "tests")
        if not ok:
            return Verdict(0.0, False, info, env_failure=f"the task's test_patch does not "
                                                         f"apply (task data broken): {error}")
        ok, error = await apply_patch(sandbox, task.repo_dir, kept, "agent")
        if not ok:
            info["problems"] = [f"the patch does not apply: {error}"]
            return Verdict(0.0, False, info)
        canaries = await plant_canaries(sandbox, task) if with_canaries else None
        nonce = secrets.token_hex(16)
        record_path = f"{SCRATCH}/record-{secrets.token_hex(8)}.json"
        touched = changed_paths(kept)
        env = {**await pytest_env(sandbox, task), **GIT_ENV, **task.test_env,
               **await watch.stage(sandbox, [*touched, *(f"{task.repo_dir}/{p}"
                                                          for p in touched)]),
               "ENVHUB_TEST_TIMEOUT": f"{task.test_timeout:g}",
               "ENVHUB_GRADE_NONCE": nonce, "ENVHUB_GRADE_RESULTS": record_path,
               "PYTEST_ADDOPTS": "-p envhub_test_timeout",
               "COLUMNS": "240"}  # summary lines keep their failure messages readable
        command = (canary.command_with(task.command(), canaries) if canaries
                   else task.command())
        result = await sandbox.exec(f"cd {shlex.quote(task.repo_dir)} && "
                                    f"{task.in_shell(watch.wrapped(command, task.test_timeout))}",
                                    timeout=task.timeout, env=env)
        record = await read_record(sandbox, record_path, nonce)
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, info, env_failure=f"grading sandbox failed: {e}")
    finally:
        try:
            await sandbox.close()
        except SandboxError:
            pass
    watched = watch.read(result.stdout)
    info["test_log_tail"] = (watched.stdout + result.stderr)[-LOG_TAIL:]
    info["grading_s"] = round(time.monotonic() - start, 3)
    if result.timed_out:
        why = (f"the test command did not finish within {task.timeout:g}s although every "
               "test has its own time limit")
        if not control:
            return Verdict(0.0, False, {**info, HUNG: why})
        return await _timed_out(task, open_pristine, info, why)
    if not watched.started:
        return Verdict(0.0, False, info, env_failure=(
            f"the grading wrapper did not start (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout).strip()[-500:]}"))
    if watched.killed:
        why = (f"the test {watched.killed} ran past its {task.test_timeout:g}s limit without "
               "the in-process alarm stopping it (spinning outside Python), so the grading "
               "wrapper killed the run")
        if not control:
            return Verdict(0.0, False, {**info, HUNG: why})
        return await _timed_out(task, open_pristine, info, why)
    log = parse_log(task.log_parser, watched.stdout)
    resolved, judged = judge(task, log, result.exit_code, record)
    info.update(judged)
    tampered = watched.problems
    if canaries is not None:
        tampered = [*canary.verdict(canaries, log, record), *tampered]
        info["canaries"] = [{"name": c.name, "copies": c.source, "negated": c.negated}
                            for c in canaries.planted]
    if tampered:
        info["problems"] = [*tampered, *info["problems"]]
        info[TAMPERED] = True
        return Verdict(0.0, False, info, signals=[Signal(name=TAMPERED, info={
            "why": tampered[:3]})])
    return Verdict(1.0 if resolved else 0.0, resolved, info)


async def _timed_out(task: SWETask, open_pristine: Callable[[], Awaitable[Sandbox]],
                     info: dict[str, Any], why: str) -> Verdict:
    """The run did not finish (`why`: a test outlived its limit and was killed from outside,
    or the whole command outlived `task.timeout`). Whose doing it is, the same command on the
    pristine repository with the hidden tests says: finishing there, the patch made it hang
    (0, ungradable_output); hanging there too, the sandbox is overloaded or broken
    (env_failure)."""
    try:
        sandbox = await open_pristine()
        try:
            ok, error = await apply_patch(sandbox, task.repo_dir, task.test_patch, "tests")
            if not ok:
                raise EnvFailure(f"the task's test_patch does not apply: {error}")
            control = await sandbox.exec(
                f"cd {shlex.quote(task.repo_dir)} && {task.in_shell(task.command())}",
                timeout=task.timeout, env={**await pytest_env(sandbox, task), **GIT_ENV,
                                           **task.test_env})
        finally:
            try:
                await sandbox.close()
            except SandboxError:
                pass
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, info, env_failure=f"{why}; its control run failed: {e}")
    if control.timed_out:
        return Verdict(0.0, False, info, env_failure=(
            f"{why}, nor did it without the patch: the sandbox is overloaded or the run stuck"))
    problem = f"{why}; without the patch it finishes: the patch makes it hang"
    info["problems"] = [problem, *info.get("problems", [])]
    return Verdict(0.0, False, info, signals=[Signal(name=UNGRADABLE, info={"why": problem})])


async def plant_canaries(sandbox: Sandbox, task: SWETask) -> canary.Canaries:
    """Plant the canaries in the graded file holding the first FAIL_TO_PASS test."""
    rel = task.FAIL_TO_PASS[0].split("::")[0]
    path = f"{task.repo_dir}/{rel}"
    source = (await sandbox.read_file(path)).decode("utf-8", errors="surrogateescape")
    planted, canaries = canary.plant(source, rel, task.FAIL_TO_PASS, task.PASS_TO_PASS)
    await sandbox.write_file(path, planted.encode("utf-8", errors="surrogateescape"))
    return canaries
