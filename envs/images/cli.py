"""`envhub image build-base | build`: the debootstrap base image and environment images.

Wire it with `register(app)` (from orchestrator/cli.py). Expected failures exit with code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from envhub.envs.images.base import ImageBuild

BAD_INPUT = 2
image_app = typer.Typer(help="Docker images for sandboxes (built locally, never pulled).",
                        no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(BAD_INPUT)


def _report(build: ImageBuild) -> None:
    typer.echo(f"{build.tag}  ({'cached' if build.cached else 'built'} in {build.seconds:.1f}s, "
               f"{build.size_bytes / 1e6:.0f} MB)")


@image_app.command("build-base")
def build_base_cmd(
    rebuild: Annotated[bool, typer.Option("--rebuild", help="build even if cached")] = False,
    package: Annotated[list[str] | None, typer.Option(
        "--package", "-p", help="extra Debian package (repeatable)")] = None,
) -> None:
    """Build the envhub base image (debootstrap of this host's Debian release + docker import);
    prints its tag. Cached by a hash of the recipe."""
    from envhub.envs.images import default_recipe, ensure_base_image
    from envhub.envs.images.recipe import DEFAULT_PACKAGES
    from envhub.envs.sandbox import SandboxError

    recipe = default_recipe(tuple(DEFAULT_PACKAGES) + tuple(package or ()))
    try:
        _report(ensure_base_image(recipe, rebuild=rebuild))
    except SandboxError as e:
        _fail(str(e))


@image_app.command("build")
def build_cmd(
    dockerfile: Annotated[Path | None, typer.Option(
        "--dockerfile", "-f", help="Dockerfile; FROM ${ENVHUB_BASE} or envhub/base")] = None,
    folder: Annotated[Path | None, typer.Option(
        "--folder", help="a folder copied to /workspace of the base image")] = None,
) -> None:
    """Build an environment image on the base (no network, no pulls); prints its tag."""
    from envhub.envs.images import build_env_image
    from envhub.envs.sandbox import SandboxError

    if (dockerfile is None) == (folder is None):
        _fail("pass exactly one of --dockerfile PATH or --folder PATH")
    try:
        _report(build_env_image(dockerfile=dockerfile, folder=folder))
    except SandboxError as e:
        _fail(str(e))


@image_app.command("build-browser")
def build_browser_cmd() -> None:
    """Build the image that browser environments (slides, webtask) run in with docker: the
    base recipe plus Debian's chromium and fonts, and Playwright's Node.js on top; prints its
    tag. Cached; runs otherwise build it on first use."""
    from envhub.envs.browser.chromium import BrowserUnavailable
    from envhub.envs.browser.sandbox import browser_image
    from envhub.envs.sandbox import SandboxError

    try:
        _report(browser_image())
    except (SandboxError, BrowserUnavailable) as e:
        _fail(str(e))


def register(app: typer.Typer) -> None:
    """Add `envhub image ...` to the top-level app."""
    app.add_typer(image_app, name="image")
