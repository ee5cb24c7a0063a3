"""`envhub gc`: what envhub's runs leave behind on this machine, listed and (without
`--dry-run`) removed. Only envhub's own things, found by envhub's names and labels:

- agent layers (`envhub/agent:*`) and agent bundles (ENVHUB_AGENT_CACHE): caches, rebuilt on use
- base images (`envhub/base:*`) of a recipe the current version does not use, and environment
  images (`envhub/env:*`) built on such a base (their `envhub.base` label; none: built before
  envhub labelled them)
- build caches (ENVHUB_CACHE: the debootstrap .deb cache, swe-task build contexts)
- runs older than `--older-than` days in the runs folder (a folder with summary.json or pool.db)
- orphaned sandboxes: containers labelled `envhub.sandbox=1` and local sandbox workdirs whose
  owner process is gone

An image tag is removed, not the image: an image that also carries another tag keeps it.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DAY = 86400.0


@dataclass(frozen=True)
class Leftover:
    """One thing `envhub gc` would remove."""

    kind: str
    name: str
    size: int  # bytes on disk (an image's with its parent layers, which images may share)
    why: str
    remove: Callable[[], None]


def folder_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            continue
    return total


def _folder(kind: str, path: Path, why: str) -> Leftover:
    return Leftover(kind, str(path), folder_size(path), why,
                    functools.partial(shutil.rmtree, path, ignore_errors=True))


def current_base_tags() -> set[str]:
    """The base images this version builds: the default recipe's and the browser image's."""
    from envhub.envs.browser.sandbox import BROWSER_PACKAGES
    from envhub.envs.images.recipe import DEFAULT_PACKAGES, default_recipe

    return {default_recipe().tag, default_recipe(DEFAULT_PACKAGES + BROWSER_PACKAGES).tag}


def docker_leftovers() -> Iterator[Leftover]:
    from envhub.envs.agents.layer import REPOSITORY as AGENT_REPOSITORY
    from envhub.envs.images.base import LATEST_ALIAS
    from envhub.envs.images.layered import BASE_LABEL, ENV_REPOSITORY
    from envhub.envs.images.recipe import BASE_REPOSITORY
    from envhub.envs.sandbox.docker import docker_sandboxes
    from envhub.envs.sandbox.engine import docker_client, docker_reachable

    if not docker_reachable():
        return
    client = docker_client()
    # containers first: an image a container (even a stopped one) uses cannot lose its last tag
    for container in docker_sandboxes(stale_only=True):
        yield Leftover("sandbox", f"container {container.short_id} ({container.name})", 0,
                       "docker sandbox whose owner process is gone",
                       functools.partial(container.remove, force=True))
    current = current_base_tags()
    for image in client.images.list():
        size = int(image.attrs.get("Size", 0))
        for tag in image.tags:
            repository = tag.rpartition(":")[0]
            why = ""
            if repository == AGENT_REPOSITORY:
                why = "cached agent layer (rebuilt when an agent needs it)"
            elif repository == BASE_REPOSITORY and tag not in current | {LATEST_ALIAS}:
                why = "base image of a recipe this version does not build"
            elif repository == ENV_REPOSITORY:
                base = (image.labels or {}).get(BASE_LABEL)
                if base not in current:
                    why = (f"environment image on an old base ({base})" if base else
                           "environment image built before envhub labelled its base")
            if why:
                yield Leftover("image", tag, size, why,
                               functools.partial(client.images.remove, tag, noprune=False))


def file_leftovers(runs: Path, older_than_days: float) -> Iterator[Leftover]:
    from envhub.envs.agents.install import cache_root
    from envhub.envs.images.base import cache_dir
    from envhub.envs.sandbox.local import local_workdirs

    bundles = cache_root()
    if bundles.is_dir():
        for path in sorted(bundles.iterdir()):
            yield _folder("agent bundle", path, "cached agent install (rebuilt on use)")
    cache = cache_dir()
    for path in [cache / "debootstrap-debs", *sorted((cache / "swe-contexts").glob("*"))]:
        if path.is_dir():
            yield _folder("build cache", path, "image build cache (refilled by the next build)")
    cutoff = time.time() - older_than_days * DAY
    if runs.is_dir():
        for path in sorted(runs.iterdir()):
            is_run = (path / "summary.json").is_file() or (path / "pool.db").is_file()
            written = path.stat().st_mtime
            if path.is_dir() and is_run and written < cutoff:
                age = (time.time() - written) / DAY
                yield _folder("run", path, f"run last written {age:.0f} days ago")
    for path in local_workdirs(stale_only=True):
        yield _folder("sandbox", path, "local sandbox workdir whose owner process is gone")


def leftovers(runs: Path, older_than_days: float) -> list[Leftover]:
    return [*docker_leftovers(), *file_leftovers(runs, older_than_days)]
