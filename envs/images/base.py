"""Build the envhub base image from Debian packages: debootstrap a rootfs, `docker import` it.

No registry is involved, so the image builds on machines that cannot pull. The tag is the
recipe's content hash (`envhub/base:<hash12>`): a second call finds it and returns at once.
Concurrent builders of the same recipe (test workers, several runners) serialise on a lock
file and the loser finds the image built by the winner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envhub.envs.cache import cache_dir
from envhub.envs.images.recipe import BaseRecipe, default_recipe
from envhub.envs.sandbox.engine import docker_client, import_docker
from envhub.envs.sandbox.errors import ImageBuildError

log = logging.getLogger(__name__)

# Alias so that a Dockerfile may say `FROM envhub/base` and still build without a pull.
LATEST_ALIAS = "envhub/base:latest"
IMAGE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "WORKDIR /workspace",
    'CMD ["/bin/bash"]',
]


@dataclass
class ImageBuild:
    """Outcome of an image build: the tag to run, whether it came from the cache, the cost."""

    tag: str
    cached: bool
    seconds: float
    size_bytes: int


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """An exclusive, process-crossing lock (flock) held while one image is built."""
    locks = cache_dir() / "locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _existing(tag: str) -> int | None:
    """Size in bytes of the local image `tag`, or None when it does not exist."""
    docker = import_docker()
    try:
        return int(docker_client().images.get(tag).attrs.get("Size", 0))
    except docker.errors.ImageNotFound:
        return None


def ensure_base_image(recipe: BaseRecipe | None = None, rebuild: bool = False) -> ImageBuild:
    """Return the base image for `recipe` (default: this host's release and mirror),
    building it when it is not in the local engine. Blocking; see `aensure_base_image`.

    Raises ImageBuildError (with the debootstrap log tail) when the build fails.
    """
    recipe = recipe or default_recipe()
    start = time.monotonic()
    size = None if rebuild else _existing(recipe.tag)
    if size is not None:
        return ImageBuild(recipe.tag, True, time.monotonic() - start, size)
    with build_lock(f"base-{recipe.digest()[:12]}"):
        size = None if rebuild else _existing(recipe.tag)
        if size is not None:  # another process built it while we waited for the lock
            return ImageBuild(recipe.tag, True, time.monotonic() - start, size)
        _build(recipe)
    size = _existing(recipe.tag)
    if size is None:
        raise ImageBuildError(f"docker import reported success but {recipe.tag} is missing")
    return ImageBuild(recipe.tag, False, time.monotonic() - start, size)


async def aensure_base_image(
    recipe: BaseRecipe | None = None, rebuild: bool = False
) -> ImageBuild:
    """Async twin of `ensure_base_image` (runs it in a worker thread)."""
    import asyncio

    return await asyncio.to_thread(ensure_base_image, recipe, rebuild)


def _check_host() -> str:
    tool = shutil.which("debootstrap")
    if tool is None:
        raise ImageBuildError(
            "building the base image needs debootstrap: apt-get install debootstrap "
            "(or pass an existing image as the sandbox spec's `image`)"
        )
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap must run as root to build the base image; run "
            "`sudo envhub image build-base` once, later runs find the cached image"
        )
    return tool


def _build(recipe: BaseRecipe) -> None:
    tool = _check_host()
    debs = cache_dir() / "debootstrap-debs"
    debs.mkdir(exist_ok=True)
    # /var/tmp: rootfs needs device nodes and real ownership, which a tmpfs /tmp may refuse.
    work = Path(tempfile.mkdtemp(prefix="envhub-base-", dir="/var/tmp"))
    try:
        rootfs = work / "rootfs"
        log_path = work / "debootstrap.log"
        log.info("building %s with debootstrap (%s %s)", recipe.tag, recipe.suite, recipe.mirror)
        cmd = [tool, f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
               f"--cache-dir={debs}", recipe.suite, str(rootfs), recipe.mirror]
        with open(log_path, "wb") as out:
            proc = subprocess.run(cmd, check=False, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=1800)
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ImageBuildError(
                f"debootstrap failed (exit {proc.returncode}); check the mirror {recipe.mirror} "
                f"is reachable and the packages exist in {recipe.suite}. Log tail:\n{tail}"
            )
        _check_configured(rootfs, recipe)
        _slim(rootfs)
        _import(rootfs, recipe)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_configured(rootfs: Path, recipe: BaseRecipe) -> None:
    """debootstrap exits 0 with packages left unconfigured when one needs a virtual package
    (it cannot choose a provider); such a rootfs must not become a cached image."""
    audit = subprocess.run(["dpkg", f"--root={rootfs}", "--audit"], capture_output=True,
                           text=True, check=False)
    if audit.returncode != 0 or audit.stdout.strip():
        raise ImageBuildError(
            f"debootstrap left packages of {recipe.tag} unconfigured; a dependency is probably "
            "a virtual package: add a package that provides it to the recipe. dpkg --audit:\n"
            f"{(audit.stdout + audit.stderr)[-3000:]}")


def _slim(rootfs: Path) -> None:
    """Drop package caches (they only cost image size) and create the workdir."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "var/log/*.log"):
        for path in rootfs.glob(pattern):
            if path.is_file():
                path.unlink()
    (rootfs / "workspace").mkdir(exist_ok=True)


def _import(rootfs: Path, recipe: BaseRecipe) -> None:
    repository, tag = recipe.tag.split(":")
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout is not None
    changes = IMAGE_CHANGES + [f"LABEL envhub.recipe={recipe.digest()}"]
    try:
        docker_client().api.import_image_from_stream(tar.stdout, repository=repository, tag=tag,
                                                     changes=changes)
    except Exception as e:  # noqa: BLE001 - requests/docker errors alike mean "import failed"
        tar.kill()
        raise ImageBuildError(f"docker import of the base rootfs failed: {e}") from None
    finally:
        tar.stdout.close()
        stderr = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        code = tar.wait()
    if code != 0:
        raise ImageBuildError(f"tar of the base rootfs failed (exit {code}): {stderr[-2000:]}")
    if recipe == default_recipe():  # a custom recipe (other packages) must not take the alias
        docker_client().images.get(recipe.tag).tag(LATEST_ALIAS)
