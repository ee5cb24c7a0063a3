"""Connecting to the Docker engine, shared by the docker sandbox and the image builder."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from envhub.envs.sandbox.errors import SandboxUnavailable

if TYPE_CHECKING:
    import docker

T = TypeVar("T")
# Every docker exec holds a thread for as long as its command runs, so the default executor
# (cpu_count + 4 threads) would cap a machine at a handful of concurrent commands. Our own
# pool, and an HTTP connection pool of the same size, lets hundreds of rollouts run at once.
POOL_SIZE = int(os.environ.get("ENVHUB_DOCKER_THREADS", "256"))
_executor: ThreadPoolExecutor | None = None


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking Docker SDK call on the docker thread pool."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="envhub-docker")
    return await asyncio.get_running_loop().run_in_executor(_executor, fn, *args)


def import_docker():
    """Import the optional `docker` SDK, failing with the install command."""
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable(
            "the docker sandbox needs the Docker SDK: pip install 'envhub[docker]'"
        ) from None
    return docker


@functools.lru_cache(maxsize=1)
def docker_client() -> docker.DockerClient:
    """A process-wide client for the engine named by DOCKER_HOST (default: the local socket).

    Raises SandboxUnavailable when the engine does not answer, with the fix.
    """
    docker = import_docker()
    try:
        client = docker.from_env(timeout=120, max_pool_size=POOL_SIZE)
        client.ping()
    except Exception as e:  # noqa: BLE001 - the SDK raises several unrelated types for "not reachable"
        raise SandboxUnavailable(
            f"cannot reach the Docker engine ({e.__class__.__name__}: {e}); start it "
            "(`sudo dockerd &` or `systemctl start docker`), set DOCKER_HOST, or use "
            "sandbox kind 'local'"
        ) from None
    return client


def docker_reachable() -> bool:
    """True when the docker SDK is installed and the engine answers a ping."""
    try:
        docker_client()
    except SandboxUnavailable:
        docker_client.cache_clear()
        return False
    return True
