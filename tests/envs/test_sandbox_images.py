"""Base image recipe and environment images layered on it (real docker build, no pulls)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from envhub.envs.images.recipe import BaseRecipe, host_mirror, host_suite
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import ImageBuildError, open_sandbox, reap
from tests.support import require_docker


def test_recipe_tag_is_a_content_hash() -> None:
    a = BaseRecipe(suite="bookworm", mirror="http://deb.debian.org/debian")
    same = BaseRecipe(suite="bookworm", mirror="http://deb.debian.org/debian",
                      packages=tuple(reversed(a.packages)))
    other = BaseRecipe(suite="bookworm", mirror="http://deb.debian.org/debian",
                       packages=(*a.packages, "jq"))
    assert a.tag == same.tag  # package order does not matter
    assert a.tag != other.tag
    assert a.tag.startswith("envhub/base:") and len(a.tag.split(":")[1]) == 12


def test_a_rootfs_with_unconfigured_packages_is_refused(tmp_path: Path) -> None:
    """debootstrap exits 0 when a package needs a virtual package it cannot provide, leaving it
    unpacked but unconfigured: the build stops there (real dpkg on a rootfs's database)."""
    from envhub.envs.images.base import _check_configured
    from tests.support import require_tool

    require_tool("dpkg")
    dpkg = tmp_path / "var" / "lib" / "dpkg"
    (dpkg / "updates").mkdir(parents=True)
    (dpkg / "info").mkdir()
    for name in ("chromium.list", "chromium.md5sums"):
        (dpkg / "info" / name).write_text("")
    recipe = BaseRecipe(suite="bookworm", mirror="http://deb.debian.org/debian")
    entry = ("Package: chromium\nStatus: install ok {}\nMaintainer: x\nArchitecture: amd64\n"
             "Version: 1\nDescription: x\n\n")
    (dpkg / "status").write_text(entry.format("installed"))
    _check_configured(tmp_path, recipe)  # all configured: passes
    (dpkg / "status").write_text(entry.format("unpacked"))
    with pytest.raises(ImageBuildError, match="unconfigured.*virtual package(.|\n)*chromium"):
        _check_configured(tmp_path, recipe)


def test_host_mirror_and_suite_from_apt_sources(tmp_path: Path) -> None:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: x-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: trixie\n")
    assert host_mirror(apt) == "http://mirror.example/debian"
    (apt / "sources.list").write_text("deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert host_mirror(apt) == "http://old.example/debian"
    assert host_mirror(tmp_path / "none") == "http://deb.debian.org/debian"
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian"\nVERSION_CODENAME=trixie\n')
    assert host_suite(release) == "trixie"


@pytest.mark.docker
def test_dockerfile_on_the_base_builds_and_caches(tmp_path: Path) -> None:
    require_docker()
    from envhub.envs.images import build_env_image, ensure_base_image

    base = ensure_base_image().tag
    marker = uuid.uuid4().hex
    env = tmp_path / "environment"
    env.mkdir()
    (env / "data.txt").write_text(marker)
    (env / "Dockerfile").write_text(
        "ARG ENVHUB_BASE\nFROM ${ENVHUB_BASE}\nCOPY data.txt /opt/data.txt\n"
        "RUN python3 -c 'print(1)' > /opt/ran.txt\n")
    first = build_env_image(dockerfile=env / "Dockerfile", base_tag=base)
    assert not first.cached and first.tag.startswith("envhub/env:")
    second = build_env_image(dockerfile=env / "Dockerfile", base_tag=base)
    assert second.cached and second.tag == first.tag

    async def scenario() -> str:
        box = await open_sandbox("docker", SandboxSpec(dockerfile="environment/Dockerfile"),
                                 run_id=f"t-img-{marker[:8]}", package_root=tmp_path)
        try:
            return (await box.exec("cat /opt/data.txt /opt/ran.txt")).stdout
        finally:
            await box.close()

    assert asyncio.run(scenario()) == f"{marker}1\n"


@pytest.mark.docker
def test_placeholder_and_folder_images(tmp_path: Path) -> None:
    require_docker()
    from envhub.envs.images import build_env_image, ensure_base_image

    base = ensure_base_image().tag
    (tmp_path / "Dockerfile").write_text("FROM envhub/base\nRUN echo placeholder > /opt/p\n")
    placeholder = build_env_image(dockerfile=tmp_path / "Dockerfile", base_tag=base)
    folder = tmp_path / "files"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "mod.py").write_text("X = 42\n")
    image = build_env_image(folder=folder, base_tag=base)
    run_id = f"t-img-{uuid.uuid4().hex[:8]}"

    async def scenario() -> str:
        box = await open_sandbox("docker", SandboxSpec(image=image.tag), run_id=run_id)
        try:
            return (await box.exec("python3 -c 'import pkg.mod; print(pkg.mod.X)'")).stdout
        finally:
            await box.close()

    async def placeholder_scenario() -> str:
        box = await open_sandbox("docker", SandboxSpec(image=placeholder.tag), run_id=run_id)
        try:
            return (await box.exec("cat /opt/p")).stdout
        finally:
            await box.close()

    try:
        assert asyncio.run(scenario()) == "42\n"
        assert asyncio.run(placeholder_scenario()) == "placeholder\n"
    finally:
        reap(run_id)


@pytest.mark.docker
def test_build_errors_are_clear(tmp_path: Path) -> None:
    require_docker()
    from envhub.envs.images import build_env_image, ensure_base_image

    base = ensure_base_image().tag
    (tmp_path / "Dockerfile").write_text("FROM envhub/never-pulled:1\n")
    with pytest.raises(ImageBuildError, match="never pulled"):
        build_env_image(dockerfile=tmp_path / "Dockerfile", base_tag=base)
    (tmp_path / "Dockerfile").write_text("ARG ENVHUB_BASE\nFROM ${ENVHUB_BASE}\nRUN exit 3\n")
    with pytest.raises(ImageBuildError, match="failed"):
        build_env_image(dockerfile=tmp_path / "Dockerfile", base_tag=base)
    (tmp_path / "Dockerfile").write_text("ARG ENVHUB_BASE\nFROM ${ENVHUB_BASE}\n"
                                         "RUN python3 -c \"import urllib.request as u; "
                                         "u.urlopen('http://deb.debian.org', timeout=5)\"\n")
    with pytest.raises(ImageBuildError, match="failed"):  # builds have no network
        build_env_image(dockerfile=tmp_path / "Dockerfile", base_tag=base)
    with pytest.raises(ImageBuildError, match="does not exist"):
        build_env_image(dockerfile=tmp_path / "nope" / "Dockerfile", base_tag=base)
    with pytest.raises(ImageBuildError, match="exactly one"):
        build_env_image(base_tag=base)
    with pytest.raises(ImageBuildError, match="absolute path"):
        build_env_image(folder=tmp_path, base_tag=base, dest="opt/x")
