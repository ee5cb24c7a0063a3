"""Per-task docker images: the task's snapshot built into a repository on the envhub base.

The build context is derived only from the task row and its snapshot, so the image tag (a
hash of the context, see envs/images/layered.py) is stable: the first rollout builds, every
later one — and every grading sandbox — starts from the cached, pristine image.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from envhub.envs.environment import EnvFailure
from envhub.envs.images import ImageBuild
from envhub.envs.swe.repo import SCRIPTS, commit_message
from envhub.envs.swe.task import SWETask

DOCKERFILE = """ARG ENVHUB_BASE
FROM ${{ENVHUB_BASE}}
COPY src/ /tmp/envhub-src/
RUN sh /tmp/envhub-src/setup_repo.sh {repo_dir} /tmp/envhub-src && rm -rf /tmp/envhub-src
WORKDIR /workspace
"""


def context_files(task: SWETask, package_root: Path) -> dict[str, bytes]:
    assert task.source_archive, "task images are built from a source_archive"
    archive = package_root / task.source_archive
    if not archive.is_file():
        raise EnvFailure(f"{archive}: snapshot missing from the environment package")
    return {
        "Dockerfile": DOCKERFILE.format(repo_dir=task.repo_dir).encode(),
        "src/source.tar.gz": archive.read_bytes(),
        "src/source.patch": task.source_patch.encode(),
        "src/remove.txt": "\n".join(task.source_remove).encode() + b"\n",
        "src/message.txt": commit_message(task).encode(),
        "src/setup_repo.sh": (SCRIPTS / "setup_repo.sh").read_bytes(),
    }


def context_dir(task: SWETask, package_root: Path) -> Path:
    """Write the build context under the envhub cache (atomically: concurrent rollouts of the
    same task may race here) and return its folder."""
    from envhub.envs.images.base import cache_dir

    files = context_files(task, package_root)
    digest = hashlib.sha256(b"".join(k.encode() + b"\0" + v for k, v in files.items()))
    target = cache_dir() / "swe-contexts" / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ctx-", dir=target.parent))
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    try:
        os.rename(staging, target)
    except OSError:  # another process won the race: its folder has the same content
        import shutil
        shutil.rmtree(staging, ignore_errors=True)
    return target


def task_image(task: SWETask, package_root: Path) -> ImageBuild:
    """Build (or find cached) the task's pristine image. Blocking."""
    from envhub.envs.images import build_env_image

    return build_env_image(dockerfile=context_dir(task, package_root) / "Dockerfile")
