"""Docker: the agent bundle baked into a cached layer on top of the environment's image
(`envhub/agent:<image+bundle>`), built with no network; and the image's Python version, which
the bundle's packages must match."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

from envhub.envs.errors import AgentSpecError
from envhub.envs.sandbox.engine import docker_client, import_docker

AGENT_HOME = "/opt/envhub-agent"
REPOSITORY = "envhub/agent"
_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


@functools.lru_cache(maxsize=64)
def image_python(image: str) -> str:
    """"3.11" for the image's `python3` (blocking; cached per image)."""
    docker = import_docker()
    try:
        out = docker_client().containers.run(
            image, ["python3", "-c", _PROBE], remove=True, network_mode="none",
            entrypoint=[], stdout=True, stderr=True)
    except docker.errors.ContainerError as e:
        raise AgentSpecError(f"image {image} has no working python3 ({e}); in-sandbox agents "
                             "need one: add it to the environment's image") from None
    return out.decode().strip()


def agent_image(image: str, bundle: Path) -> str:
    """`image` plus `bundle` at AGENT_HOME; built once per (image id, bundle) (blocking)."""
    docker = import_docker()
    client = docker_client()
    image_id = client.images.get(image).id
    tag = hashlib.sha256(f"{image_id}:{bundle.name}".encode()).hexdigest()[:16]
    name = f"{REPOSITORY}:{tag}"
    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        dockerfile = f"FROM {image_id}\nCOPY agent {AGENT_HOME}\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(str(bundle), arcname="agent")
    context.seek(0)
    try:
        client.images.build(fileobj=context, custom_context=True, tag=name, rm=True,
                            network_mode="none", labels={"envhub.agent": bundle.name})
    except (docker.errors.BuildError, docker.errors.APIError) as e:
        raise AgentSpecError(f"cannot build the agent layer on {image}: {e}") from None
    if (bundle / "bin" / "node").is_file():
        _check_node(name, image)
    return name


def _check_node(name: str, image: str) -> None:
    """The host's node (npm agents) must run on the image's libc; if not, the layer is dropped
    and the error says what the image lacks."""
    docker = import_docker()
    client = docker_client()
    try:
        client.containers.run(name, [f"{AGENT_HOME}/bin/node", "--version"], remove=True,
                              network_mode="none", entrypoint=[], stdout=True, stderr=True)
    except docker.errors.ContainerError as e:
        client.images.remove(name, force=True)
        raise AgentSpecError(
            f"this machine's node does not run in image {image} ({e.stderr!r}): npm agents need "
            "an image with glibc >= 2.28 and libstdc++ (e.g. Debian >= 10)") from None
