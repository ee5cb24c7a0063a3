"""Running a Harbor task's oracle solution, and its tests/test.sh in a grader container.

Verifier contract (Harbor's): `bash /tests/test.sh` runs from the task's WORKDIR with tests/
at /tests and writes /logs/verifier/reward.txt (a number) or reward.json (`{"reward": x}`, or
named rewards that are averaged). Where it runs and what the grader holds: `grader.py`.
Hardening kept here: the reward folder is emptied and a start marker made before test.sh
runs; only reward files newer than the marker (regular files, not links) are read; every
process test.sh started is killed before they are read.
"""

from __future__ import annotations

import json
import math
import re

from envhub.envs.environment import UNGRADABLE, EnvFailure, Verdict
from envhub.envs.harbor.task import HarborTask
from envhub.envs.sandbox.base import ExecResult, Sandbox
from envhub.envs.sandbox.errors import SandboxError, SandboxFileError
from envhub.sdk.types import Signal

REWARD_DIR = "/logs/verifier"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


async def run_solution(task: HarborTask, sandbox: Sandbox) -> None:
    """Upload solution/ to /solution and run solve.sh (the oracle). EnvFailure if it fails."""
    if not task.has_solution:
        raise EnvFailure(f"{task.name}: no solution/solve.sh, so the oracle cannot run")
    await sandbox.exec("rm -rf /solution", timeout=60, cwd="/")
    await sandbox.upload(str(task.solution_dir), "/solution")
    result = await sandbox.exec("bash /solution/solve.sh", timeout=task.config.agent.timeout_sec,
                                cwd=task.workdir)
    if result.exit_code != 0:
        raise EnvFailure(f"{task.name}: solution/solve.sh exited {result.exit_code}: "
                         f"{(result.stderr or result.stdout).strip()[-800:]}")


# a plain decimal number as test.sh writes one (ASCII digits, no underscores, no inf/nan)
NUMBER_RE = re.compile(r"[+-]?(\d{1,30}(\.\d{0,30})?|\.\d{1,30})([eE][+-]?\d{1,3})?", re.ASCII)


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_reward(text: str, json_text: str | None) -> tuple[float | None, dict]:
    """The reward from reward.txt (preferred) or reward.json, and the named parts. Only a
    finite number is a reward: test.sh may write a value computed from the agent's output, and
    `inf` (which float() takes) would be clamped to a solved 1.0, a 400-digit JSON number is
    an OverflowError and a 5,000-digit one a ValueError (both escaped as env_failure)."""
    if text.strip():
        word = text.strip().split()[0]
        value = _finite(word) if NUMBER_RE.fullmatch(word) else None
        if value is None:
            return None, {"reward_error": f"reward.txt is not a number: {text.strip()[:80]!r}"}
        return value, {}
    if json_text is None:
        return None, {}
    try:
        data = json.loads(json_text)
    except ValueError:  # JSONDecodeError, and int() of a number past 4,300 digits
        return None, {"reward_error": "reward.json is not JSON (or holds a number too long)"}
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        value = _finite(data)
        return (value, {}) if value is not None else (
            None, {"reward_error": "reward.json's number is not finite"})
    if isinstance(data, dict):
        numbers = {k: _finite(v) for k, v in data.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if any(v is None for v in numbers.values()):
            return None, {"reward_error": "reward.json holds a number that is not finite"}
        finite = {k: v for k, v in numbers.items() if v is not None}
        if "reward" in finite:
            return finite["reward"], {"rewards": finite}
        if finite:
            return sum(finite.values()) / len(finite), {"rewards": finite}
    return None, {"reward_error": "reward.json holds no number"}


async def _read(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.read_file(path)).decode(errors="replace")
    except SandboxFileError:
        return None


def prepare_command(marker: str, wipe: str) -> str:
    """Shell run in the grader before anything is placed: `wipe` (the artifact paths), empty
    /tests and /logs/verifier, the start marker; prints what is in the reward folder (must be
    nothing)."""
    return (f"{wipe} && rm -rf /tests {REWARD_DIR} && mkdir -p {REWARD_DIR} /logs/agent && "
            f"touch {marker} && ls -A {REWARD_DIR}")


async def prepare(grader: Sandbox, marker: str, wipe: str) -> None:
    """`prepare_command` in the grader; EnvFailure when it fails or the reward folder is not
    empty (nothing may run at this point)."""
    result = await grader.exec(prepare_command(marker, wipe), timeout=120, cwd="/")
    if result.exit_code != 0 or result.stdout.strip():
        raise EnvFailure(f"cannot start the verifier with an empty {REWARD_DIR} (exit "
                         f"{result.exit_code}: {(result.stderr + result.stdout).strip()[-300:]})")


async def _fresh_rewards(sandbox: Sandbox, marker: str) -> tuple[str | None, str | None, list]:
    """reward.txt and reward.json as written by this verifier run: files not newer than the
    start marker (or not regular files) are ignored and reported."""
    names = ("reward.txt", "reward.json")
    listing = await sandbox.exec(
        "for f in " + " ".join(names) + f"; do p={REWARD_DIR}/$f; "
        f'if [ -f "$p" ] && [ ! -L "$p" ]; then '
        f'if [ "$p" -nt {marker} ]; then echo "new $f"; else echo "old $f"; fi; '
        f'elif [ -e "$p" ] || [ -L "$p" ]; then echo "odd $f"; fi; done; rm -f {marker}',
        timeout=60, cwd="/")
    state: dict[str, str] = {}
    for line in listing.stdout.splitlines():
        how, _, name = line.partition(" ")
        state[name] = how
    ignored = [f"{name} ({state[name]})" for name in names if state.get(name, "new") != "new"]
    fresh = {name: await _read(sandbox, f"{REWARD_DIR}/{name}") if state.get(name) == "new"
             else None for name in names}
    return fresh["reward.txt"], fresh["reward.json"], ignored


async def run_tests(task: HarborTask, grader: Sandbox, marker: str) -> Verdict:
    """test.sh in `grader` (artifacts, tests/ and the start `marker` already in place, see
    `prepare_command`); the verdict from the reward files it wrote. A timeout is 0 with the
    `ungradable_output` signal and info["timed_out"] (the caller decides whose fault it is)."""
    try:
        result = await test_sh(task, grader)
        await grader.end_processes()  # nothing test.sh started writes after we read
        txt, js, ignored = await _fresh_rewards(grader, marker)
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, {}, env_failure=f"verifier sandbox failed: {e}")
    info: dict = {"exit_code": result.exit_code,
                  "test_log_tail": (result.stdout + result.stderr)[-3000:]}
    if ignored:
        info["ignored_reward_files"] = ignored
    if result.timed_out:
        info["timed_out"] = True
        return ungradable(f"tests/test.sh did not finish within "
                          f"{task.config.verifier.timeout_sec:g}s on the agent's output", info)
    reward, extra = parse_reward(txt or "", js)
    info.update(extra)
    if reward is None:
        info.setdefault("reward_error", f"test.sh wrote no reward (exit {result.exit_code})")
        return Verdict(0.0, False, info)
    outcome = min(1.0, max(0.0, reward))
    return Verdict(outcome, outcome >= 1.0, info)


async def test_sh(task: HarborTask, grader: Sandbox) -> ExecResult:
    """`bash /tests/test.sh` from the task's WORKDIR on the grader's own PATH."""
    env = {"PATH": SAFE_PATH, **task.config.verifier.env}
    return await grader.exec("bash /tests/test.sh", timeout=task.config.verifier.timeout_sec,
                             cwd=task.workdir, env=env)


def ungradable(reason: str, info: dict) -> Verdict:
    """0 with the `ungradable_output` signal: the agent's output is what could not be graded."""
    return Verdict(0.0, False, {**info, "ungradable": reason},
                   signals=[Signal(name=UNGRADABLE, info={"error": reason})])
