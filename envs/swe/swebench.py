"""Rows in SWE-bench's exact schema, run on SWE-bench's own per-instance images.

SWE-bench's harness (swebench/harness/test_spec/test_spec.py, `instance_image_key`) names
the image of an instance `sweb.eval.<arch>.<instance_id lower-cased>:latest` when it builds it
locally, and `<namespace>/` + that name with every `__` written `_1776_` when it is pulled
(namespace `swebench` on Docker Hub). The arch is `arm64` on aarch64/arm64 hosts, else
`x86_64` (a few instances force x86_64). In the image the repository is at /testbed at
`base_commit`, and the eval script runs `source /opt/miniconda3/bin/activate; conda activate
testbed; cd /testbed; <test_cmd> <test files of test_patch>`.

envhub grades such a row with its own hardened pytest grader (`grading.py`): the test
command is pytest with `-rA` on the files the test_patch touches, inside the conda env when
the image has one. Rows whose tests are not pytest ids (django's runtests.py, sympy's
bin/test) are refused at load, as are rows whose image is not on the machine (with the
command that gets it).
"""

from __future__ import annotations

import platform
import re

from envhub.envs.errors import EnvLoadError
from envhub.envs.swe.task import SWETask

LATEST = "latest"
NAMESPACE = "swebench"
# SWE-bench leaves these out of the test command (swebench/harness/constants NON_TEST_EXTS).
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml",
                 ".yaml", ".toml")
# The eval script's `source /opt/miniconda3/bin/activate; conda activate testbed`, only when
# the image has conda (an image laid out like SWE-bench's without it uses its python3).
CONDA_SETUP = ("if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate "
               "&& conda activate testbed; fi")
SHOWN_MISSING = 5


def host_arch() -> str:
    return "arm64" if platform.machine().lower() in {"aarch64", "arm64"} else "x86_64"


def image_names(instance_id: str, arch: str | None = None) -> list[str]:
    """The names SWE-bench's harness gives an instance image: the local build's, then the
    pulled one's (`swebench/...`, `__` escaped as `_1776_`), for the host's arch first."""
    arches = list(dict.fromkeys([arch or host_arch(), "x86_64"]))
    names = []
    for a in arches:
        key = f"sweb.eval.{a}.{instance_id.lower()}:{LATEST}"
        names += [key, f"{NAMESPACE}/{key}".replace("__", "_1776_")]
    return names


def harness_test_files(test_patch: str) -> list[str]:
    """The test files the harness passes to the test command: the `b/` paths of the
    test_patch, without data files."""
    paths = re.findall(r"^diff --git a/.* b/(.*)$", test_patch, flags=re.MULTILINE)
    return [p for p in dict.fromkeys(paths) if not p.endswith(NON_TEST_EXTS)]


def needs_image(task: SWETask) -> bool:
    """A row in SWE-bench's own schema: neither an `image` of its own nor a snapshot."""
    return task.image is None and task.source_archive is None


def unsupported(task: SWETask) -> str | None:
    """Why envhub cannot grade this row, or None."""
    odd = [t for t in task.target_tests if "::" not in t]
    if odd:
        return (f"test id {odd[0]!r} is not a pytest id (path::name); envhub grades "
                "pytest-based SWE-bench rows only (django's runtests.py and sympy's bin/test "
                "are not supported)")
    if not harness_test_files(task.test_patch):
        return "its test_patch changes no test file"
    return None


def local_images(names: list[str]) -> dict[str, bool]:
    """name -> present in the local docker engine."""
    from envhub.envs.sandbox.engine import docker_client, import_docker

    docker = import_docker()
    client = docker_client()
    found = {}
    for name in names:
        try:
            client.images.get(name)
            found[name] = True
        except docker.errors.ImageNotFound:
            found[name] = False
    return found


def fix_for(instance_id: str) -> str:
    local, remote = image_names(instance_id)[:2]
    return (f"`docker pull {remote}` (SWE-bench's published image), or build it with "
            f"SWE-bench's harness: `python -m swebench.harness.prepare_images "
            f"--instance_ids {instance_id}` (it tags {local})")


def resolve(tasks: list[SWETask], where: str) -> list[SWETask]:
    """SWE-bench rows made runnable: the local image found by SWE-bench's names, the test
    command and files the harness would use. Raises EnvLoadError (with the fix) when a row
    cannot run here: an image missing, docker unreachable, tests that are not pytest's."""
    rows = [t for t in tasks if needs_image(t)]
    if not rows:
        return tasks
    for task in rows:
        why = unsupported(task)
        if why:
            raise EnvLoadError(f"{where}: row {task.instance_id}: {why}")
    from envhub.envs.sandbox.errors import SandboxUnavailable

    try:
        present = local_images([n for t in rows for n in image_names(t.instance_id)])
    except SandboxUnavailable as e:
        raise EnvLoadError(f"{where}: SWE-bench rows run in their docker images: {e}") from None
    missing = [t.instance_id for t in rows
               if not any(present[n] for n in image_names(t.instance_id))]
    if missing:
        fixes = "; ".join(f"{i}: {fix_for(i)}" for i in missing[:SHOWN_MISSING])
        more = f" (and {len(missing) - SHOWN_MISSING} more)" if len(missing) > SHOWN_MISSING else ""
        raise EnvLoadError(f"{where}: {len(missing)} SWE-bench row(s) have no image on this "
                           f"machine{more}. {fixes}. Images are never pulled at run time.")
    resolved = {}
    for task in rows:
        image = next(n for n in image_names(task.instance_id) if present[n])
        update = {"image": image, "shell_setup": task.shell_setup or CONDA_SETUP,
                  "metadata": {**task.metadata, "swebench_image": image}}
        if not task.test_files:
            update["test_files"] = harness_test_files(task.test_patch)
        resolved[task.instance_id] = task.model_copy(update=update)
    return [resolved.get(t.instance_id, t) for t in tasks]
