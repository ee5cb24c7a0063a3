"""Environment images layered on the base image, built with `docker build` and no pulls.

Two inputs are accepted:

* a Dockerfile (its folder is the build context). Its FROM may name the base through the
  build arg `ENVHUB_BASE` (`ARG ENVHUB_BASE` then `FROM ${ENVHUB_BASE}`), the placeholder
  `{{envhub_base}}`, or `envhub/base` (an alias of the current base tag); any other image
  must already be in the local engine, since nothing is pulled.
* a folder of files, copied to /workspace of the base image (or to another folder, `dest`).

The tag is `envhub/env:<hash12>` of the base image id and the exact build context, so an
unchanged environment is a cache hit without running `docker build` at all.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import time
from pathlib import Path

from envhub.envs.images.base import ImageBuild, build_lock, ensure_base_image
from envhub.envs.sandbox.engine import docker_client, import_docker
from envhub.envs.sandbox.errors import ImageBuildError

ENV_REPOSITORY = "envhub/env"
BASE_LABEL = "envhub.base"  # the base image tag an environment image was built on (envhub gc)
PLACEHOLDER = "{{envhub_base}}"
GENERATED_DOCKERFILE = ".envhub.Dockerfile"
MAX_CONTEXT_BYTES = 512 << 20  # contexts are held in memory; beyond this, use a base `image`


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _context_tar(folder: Path | None, dockerfile: str, prefix: str) -> bytes:
    """A deterministic tar (sorted names, zero mtimes and owners) of `folder` + the Dockerfile,
    so that its hash identifies the build exactly."""
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, GENERATED_DOCKERFILE, dockerfile.encode())
        if folder is not None:
            for path in sorted(folder.rglob("*")):
                rel = prefix + path.relative_to(folder).as_posix()
                if path.is_symlink():
                    info = tarfile.TarInfo(rel)
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                    tar.addfile(info)
                elif path.is_dir():
                    info = tarfile.TarInfo(rel)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif path.is_file():
                    data = path.read_bytes()
                    total += len(data)
                    if total > MAX_CONTEXT_BYTES:
                        raise ImageBuildError(
                            f"build context {folder} exceeds {MAX_CONTEXT_BYTES >> 20} MiB; "
                            "prebuild the image and set the sandbox spec's `image`")
                    _add(tar, rel, data, path.stat().st_mode & 0o777)
    return buffer.getvalue()


def _resolve_from(text: str, base_tag: str) -> str:
    """Point FROM lines at the base image; leave `${ENVHUB_BASE}` to the build arg."""
    text = text.replace(PLACEHOLDER, base_tag)
    return re.sub(r"(?im)^(\s*FROM\s+)envhub/base(?::latest)?(\s|$)", rf"\g<1>{base_tag}\g<2>",
                  text)


def _missing_from_images(dockerfile: str, base_tag: str) -> list[str]:
    """FROM images that are neither local nor earlier build stages (docker would try to pull
    them, which never works here)."""
    docker = import_docker()
    stages: set[str] = set()
    missing = []
    for match in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", dockerfile):
        image, stage = match.group(1), match.group(2)
        image = image.replace("${ENVHUB_BASE}", base_tag).replace("$ENVHUB_BASE", base_tag)
        if image.lower() != "scratch" and image.lower() not in stages and "$" not in image:
            try:
                docker_client().images.get(image)
            except docker.errors.ImageNotFound:
                missing.append(image)
        if stage:
            stages.add(stage.lower())
    return missing


def build_env_image(
    dockerfile: str | Path | None = None,
    folder: str | Path | None = None,
    base_tag: str | None = None,
    dest: str = "/workspace",
) -> ImageBuild:
    """Build (or find cached) an environment image from a Dockerfile or a folder to copy in.

    Exactly one of `dockerfile` / `folder` is required; a folder is copied to `dest` (an
    absolute path in the image). `base_tag` defaults to the base image of this host's recipe
    (built on first use). Blocking; wrap in asyncio.to_thread.
    """
    if (dockerfile is None) == (folder is None):
        raise ImageBuildError("pass exactly one of `dockerfile` (a path) or `folder`")
    start = time.monotonic()
    base_tag = base_tag or ensure_base_image().tag
    docker = import_docker()
    client = docker_client()
    try:
        base_id = client.images.get(base_tag).id
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"base image {base_tag} not found; run `envhub image build-base`") from None
    if dockerfile is not None:
        path = Path(dockerfile)
        if not path.is_file():
            raise ImageBuildError(f"Dockerfile {path} does not exist; fix the sandbox spec's "
                                  "`dockerfile` (relative to the environment package)")
        text = _resolve_from(path.read_text(encoding="utf-8"), base_tag)
        context = _context_tar(path.parent, text, prefix="")
    else:
        src = Path(folder)  # type: ignore[arg-type]
        if not src.is_dir():
            raise ImageBuildError(f"folder {src} does not exist")
        if not dest.startswith("/") or any(c.isspace() for c in dest):
            raise ImageBuildError(f"dest {dest!r} must be an absolute path without spaces")
        text = f"FROM {base_tag}\nCOPY files/ {dest.rstrip('/')}/\nWORKDIR /workspace\n"
        context = _context_tar(src, text, prefix="files/")
    missing = _missing_from_images(text, base_tag)
    if missing:
        raise ImageBuildError(
            f"FROM image(s) {', '.join(missing)} are not in the local engine and images are "
            "never pulled: start the Dockerfile with `ARG ENVHUB_BASE` + `FROM ${ENVHUB_BASE}` "
            "(or `FROM envhub/base`), or `docker load` the image first")
    digest = hashlib.sha256(base_id.encode() + context).hexdigest()[:12]
    tag = f"{ENV_REPOSITORY}:{digest}"
    with build_lock(f"env-{digest}"):
        try:
            size = int(client.images.get(tag).attrs.get("Size", 0))
            return ImageBuild(tag, True, time.monotonic() - start, size)
        except docker.errors.ImageNotFound:
            pass
        _docker_build(context, tag, base_tag)
    size = int(client.images.get(tag).attrs.get("Size", 0))
    return ImageBuild(tag, False, time.monotonic() - start, size)


def _docker_build(context: bytes, tag: str, base_tag: str) -> None:
    docker = import_docker()
    try:
        docker_client().images.build(
            fileobj=io.BytesIO(context), custom_context=True, dockerfile=GENERATED_DOCKERFILE,
            tag=tag, pull=False, network_mode="none", rm=True, forcerm=True,
            buildargs={"ENVHUB_BASE": base_tag},
            labels={"envhub.image": "1", BASE_LABEL: base_tag},
        )
    except docker.errors.BuildError as e:
        lines = [str(chunk.get("stream") or chunk.get("error") or "") for chunk in e.build_log]
        tail = "".join(lines)[-3000:]
        hint = ""
        if "registry" in tail or "pull access denied" in tail:
            hint = " (a step needed the network: builds run with network_mode=none)"
        raise ImageBuildError(f"docker build of {tag} failed: {e.msg}{hint}\n{tail}") from None
    except docker.errors.APIError as e:
        raise ImageBuildError(f"docker build of {tag} failed: {e.explanation or e}") from None
