"""Sandboxes that can run Chromium: the spec to open for a sandbox kind, and where the browser
runtime is as seen from inside.

* local (bubblewrap): the host's Debian Chromium and the Node.js + `playwright-core` runtime
  staged in /var/tmp (runtime.py). A local sandbox sees only an allow-list of the host
  (envs/sandbox/host_view.py: /usr, the loader's cache, identity files); the spec adds,
  read-only, what the browser needs beyond it: the runtime, fonts' configuration and Debian's
  chromium wrapper settings (HOST_PATHS).
* docker: an image built here, never pulled: the envhub base recipe with Debian's `chromium`
  and the fonts the host renders with (debootstrap, cached by recipe hash), and on top of it
  the staged runtime copied to /opt/envhub-browser (cached by content hash). The first build
  takes minutes; `envhub image build-browser` makes it ahead of a run.

Other kinds (e2b, plain processes) cannot run the browser here: BrowserUnavailable says so.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.envs.browser.chromium import BrowserUnavailable, chromium_path
from envhub.envs.browser.runtime import staged_runtime
from envhub.envs.manifest import SandboxSpec

KINDS = ("docker", "local")  # sandbox kinds a browser runs in
# Host paths a local sandbox needs for Chromium beyond the default view (host_view.py): fonts'
# configuration, and the settings Debian's /usr/bin/chromium wrapper script reads.
HOST_PATHS = ["/etc/fonts", "/etc/chromium.d", "/etc/chromium"]
SYSTEM_ROOT = "/usr/"  # in every local sandbox's view already
IMAGE_RUNTIME_DIR = "/opt/envhub-browser"
IMAGE_CHROMIUM = "/usr/bin/chromium"
# Debian's Chromium and the fonts of a Debian host with it (the same faces, so a slide measures
# the same in a docker sandbox as in a local one). debootstrap cannot pick a provider for a
# virtual package: dbus-x11 is the `dbus-session-bus` that dconf (via GTK) needs. Playwright's
# Node.js links libatomic (and libstdc++, which Chromium's libraries bring).
BROWSER_PACKAGES = ("chromium", "fonts-liberation", "fonts-dejavu-core", "fonts-dejavu-extra",
                    "dbus-x11", "libatomic1")


@dataclass(frozen=True)
class BrowserPaths:
    """Where `node`, `playwright-core` and Chromium are inside a sandbox of `kind`."""

    kind: str
    node: str
    core: str
    chromium: str

    def env(self) -> dict[str, str]:
        """The variables the in-sandbox scripts (driver.js, render.js) read."""
        return {"PLAYWRIGHT_CORE": self.core, "ENVHUB_CHROMIUM": self.chromium}


def browser_image() -> Any:
    """Build (or find) the docker image with Chromium and the runtime; an `ImageBuild`.
    Blocking. Raises BrowserUnavailable (no Playwright) or ImageBuildError (build failed)."""
    from envhub.envs.images import build_env_image, default_recipe, ensure_base_image
    from envhub.envs.images.recipe import DEFAULT_PACKAGES

    runtime = staged_runtime()
    base = ensure_base_image(default_recipe(DEFAULT_PACKAGES + BROWSER_PACKAGES))
    return build_env_image(folder=runtime, base_tag=base.tag, dest=IMAGE_RUNTIME_DIR)


_built: dict[str, str] = {}  # staged runtime folder -> browser image tag, in this process


def browser_image_tag() -> str:
    """`browser_image()`'s tag, remembered once built or found: hashing the 150 MB build
    context again for every rollout would cost more than the rollout's browser."""
    from envhub.envs.sandbox.engine import docker_client, import_docker

    key = str(staged_runtime())
    tag = _built.get(key)
    if tag is not None:
        try:
            docker_client().images.get(tag)
            return tag
        except import_docker().errors.ImageNotFound:  # removed since: build it again
            pass
    tag = _built[key] = browser_image().tag
    return tag


def paths_in(kind: str) -> BrowserPaths:
    """The runtime's paths inside a sandbox of `kind` (local: staged on first use)."""
    if kind == "docker":
        return BrowserPaths(kind, f"{IMAGE_RUNTIME_DIR}/node",
                            f"{IMAGE_RUNTIME_DIR}/playwright-core", IMAGE_CHROMIUM)
    if kind == "local":
        runtime = staged_runtime()
        return BrowserPaths(kind, str(runtime / "node"), str(runtime / "playwright-core"),
                            chromium_path())
    raise BrowserUnavailable(f"a browser runs only in {' or '.join(KINDS)} sandboxes here, not "
                             f"{kind!r}: run with --sandbox local or --sandbox docker")


async def browser_spec(spec: SandboxSpec, kind: str) -> SandboxSpec:
    """`spec` for a sandbox of `kind` that can run the browser: for docker, with the browser
    image (built on first use, in a worker thread); for local, also seeing the runtime and
    HOST_PATHS (the rest of the host stays out of sight)."""
    paths = paths_in(kind)  # the checks: kind, Chromium and the runtime on this machine
    if kind == "local":
        runtime = str(Path(paths.node).parent)
        chromium = str(Path(paths.chromium).resolve().parent)  # $ENVHUB_CHROMIUM: anywhere
        wanted = [*HOST_PATHS, runtime, chromium]
        extra = [p for p in wanted if os.path.lexists(p) and not p.startswith(SYSTEM_ROOT)]
        view = list(dict.fromkeys([*spec.host_paths, *extra]))
        return spec.model_copy(update={"host_paths": view})
    tag = await asyncio.to_thread(browser_image_tag)
    return spec.model_copy(update={"image": tag, "dockerfile": None})


def resolved_kind(kind: str) -> str:
    """`auto` as the runner resolves it (docker when its engine answers, else local)."""
    if kind == "auto":
        from envhub.envs.sandbox import best_available

        return best_available()
    return kind
