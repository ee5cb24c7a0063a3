"""Grading a Harbor rollout where the agent never ran.

Grade only what the agent could not have touched: test.sh never runs in the agent's container
(a `python3` shim in /usr/local/bin, a `.pth` in site-packages, a replaced `bash` would grade
it). It runs in a fresh grader container started from the pristine task image, into which only
the task's declared artifact paths are carried from the agent's container (`artifacts.py`: the
WORKDIR by default, `[metadata.envhub] artifacts` otherwise, never the toolchain: see
`task.py`), on the grader's own PATH. A task whose artifacts overlap a search path of the image
or of the verifier's env (PATH, PYTHONPATH, LD_LIBRARY_PATH, ...) is refused with the reason
(env_failure); it is never graded in the agent's container instead.

Attribution: the grader failing to start, or a container error, is `env_failure`; output past
the task's size cap is 0 with the `ungradable_output` signal; test.sh running past its timeout
is graded once more in another fresh grader (a loaded machine slows a run now and then: a
failure that does not repeat is the grader's, and that second verdict stands), then, timing out
again, 0 with that signal when the same tests finish in time on the pristine image (nothing
carried), and env_failure when they time out there too (the task or the machine).

For task authors: the grader is pristine, but whatever the tests execute of the agent's output
(a server it fixed, a build script, a git repository whose config it wrote) runs in it; run
that as an unprivileged user (`subprocess.run(..., user=65534, group=65534, extra_groups=[])`
as the bundled checks do), or it can rewrite /logs/verifier after the tests wrote it. Tests
that put the agent's folder first on PYTHONPATH let it shadow the test runner itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import IO

from envhub.envs.environment import EnvFailure, Verdict
from envhub.envs.harbor.artifacts import (
    ArtifactsTooLarge,
    Carried,
    collect,
    image_search_dirs,
    place,
    put_tree,
    wipe_command,
)
from envhub.envs.harbor.task import HarborTask, overlaps
from envhub.envs.harbor.verifier import REWARD_DIR, prepare, run_tests, test_sh, ungradable
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.engine import in_thread
from envhub.envs.sandbox.errors import SandboxError

OpenGrader = Callable[[], Awaitable[Sandbox]]


async def run_verifier(task: HarborTask, sandbox: Sandbox, open_grader: OpenGrader) -> Verdict:
    """Grade the agent's container `sandbox` (its processes already ended) in a fresh grader
    from `open_grader` (a started container of the pristine task image; closed here). The
    grader starts while the artifacts are read from the agent's container."""
    start = time.monotonic()
    opening = asyncio.ensure_future(open_grader())
    carried = Carried()
    with contextlib.ExitStack() as stack:
        archives: dict[str, IO[bytes]] = {
            p: stack.enter_context(tempfile.TemporaryFile()) for p in task.artifacts}
        failed = await _collect_all(task, sandbox, archives, carried)
        try:
            grader = await opening
        except (SandboxError, EnvFailure) as e:
            return failed or Verdict(0.0, False, {}, env_failure=f"the grader container did "
                                     f"not start: {e}")
        try:
            verdict = failed or await _grade(task, grader, archives, carried)
        finally:
            await grader.close()
        if verdict.info.get("timed_out") and not verdict.env_failure and failed is None:
            verdict = await _retry(task, open_grader, archives, carried, verdict)
    if verdict.info.get("timed_out") and not verdict.env_failure:
        verdict = await _attribute_timeout(task, open_grader, verdict)
    verdict.info["verifier_s"] = round(time.monotonic() - start, 3)
    return verdict


async def _retry(task: HarborTask, open_grader: OpenGrader, archives: dict[str, IO[bytes]],
                 carried: Carried, first: Verdict) -> Verdict:
    """test.sh ran past its timeout on the agent's output: the same artifacts graded once more
    in another fresh grader before anyone is blamed (a loaded machine slows a run past its
    limit now and then). Finishing there, that verdict stands; timing out again, the pristine
    control decides (`_attribute_timeout`). Counted in info's `grader_retries`."""
    failures = [str(first.info.get("ungradable", "timed out"))]
    try:
        grader = await open_grader()
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, {**first.info, "grader_retries": 1},
                       env_failure=f"the grader container did not start for a retry: {e}")
    try:
        for archive in archives.values():
            archive.seek(0)
        verdict = await _grade(task, grader, archives, carried)
    finally:
        await grader.close()
    verdict.info["grader_retries"] = 1
    verdict.info["grader_failures"] = failures
    return verdict


async def _collect_all(task: HarborTask, sandbox: Sandbox, archives: dict[str, IO[bytes]],
                       carried: Carried) -> Verdict | None:
    """Clean archives of the artifact paths (a path the agent removed gets none); the verdict
    when they cannot be had: ungradable (too large) or env_failure (a container error)."""
    try:
        for path, archive in list(archives.items()):
            if not await collect(path, sandbox, task.artifacts_max_bytes, carried, archive):
                del archives[path]
    except ArtifactsTooLarge as e:
        return ungradable(str(e), {"artifacts": carried.summary()})
    except SandboxError as e:
        return Verdict(0.0, False, {}, env_failure=f"reading the agent's artifacts failed: {e}")
    return None


async def _grade(task: HarborTask, grader: Sandbox, archives: dict[str, IO[bytes]],
                 carried: Carried) -> Verdict:
    marker = f"/logs/.envhub-verifier-{secrets.token_hex(8)}"
    try:
        refusal = await _toolchain_refusal(task, grader)
        if refusal:
            return Verdict(0.0, False, {}, env_failure=refusal)
        await prepare(grader, marker, wipe_command(list(task.artifacts)))
        for path, archive in archives.items():
            await place(grader, path, archive)
        await put_tree(grader, task.tests_dir, "/tests")
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, {}, env_failure=f"preparing the grader failed: {e}")
    verdict = await run_tests(task, grader, marker)
    verdict.info["artifacts"] = carried.summary()
    return verdict


async def _toolchain_refusal(task: HarborTask, grader: Sandbox) -> str:
    """Why the task cannot be graded with only its artifacts carried ('' when it can): an
    artifact path overlapping a search path of the image or of the verifier's env."""
    dirs = await in_thread(image_search_dirs, grader, task.config.verifier.env)
    for var, entries in dirs.items():
        for entry in entries:
            hit = next((p for p in task.artifacts if overlaps(p, entry)), None)
            if hit:
                return (f"{task.name} cannot be graded in a fresh container: its artifact path "
                        f"{hit} overlaps {entry} in {var} of the task image or verifier env, so "
                        "the agent's files would be part of the grader's toolchain. Move the "
                        "outputs out of that folder or narrow [metadata.envhub] artifacts in "
                        "task.toml")
    return ""


async def _attribute_timeout(task: HarborTask, open_grader: OpenGrader,
                             verdict: Verdict) -> Verdict:
    """test.sh timed out on the agent's output: the same tests on the pristine image (nothing
    carried) decide whose fault it is. Timing out there too is the task's or the machine's
    (env_failure); finishing there means the agent's output made it hang (0, ungradable)."""
    try:
        pristine = await open_grader()
    except (SandboxError, EnvFailure) as e:
        return Verdict(0.0, False, verdict.info, env_failure="the grader container did not "
                       f"start (checking a verifier timeout): {e}")
    try:
        await pristine.exec(f"mkdir -p {REWARD_DIR}", timeout=60, cwd="/")
        await put_tree(pristine, task.tests_dir, "/tests")
        result = await test_sh(task, pristine)
    except SandboxError as e:
        return Verdict(0.0, False, verdict.info, env_failure=f"verifier sandbox failed: {e}")
    finally:
        await pristine.close()
    if result.timed_out:
        return Verdict(0.0, False, verdict.info, env_failure=(
            f"tests/test.sh did not finish within {task.config.verifier.timeout_sec:g}s, on the "
            "pristine task image too (nothing of the agent's): the task or the machine"))
    verdict.info["pristine_finished"] = True
    return verdict
