"""Images for docker sandboxes: the debootstrap-built base and environment images on top.

    from envhub.envs.images import ensure_base_image, build_env_image
    base = ensure_base_image()                 # envhub/base:<hash12>, cached by recipe hash
    env = build_env_image(dockerfile="environment/Dockerfile")   # envhub/env:<hash12>

Both are blocking (they run builds); `aensure_base_image` / `abuild_image_for_spec` are the
async twins. Nothing is ever pulled from a registry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from envhub.envs.images.base import ImageBuild, aensure_base_image, ensure_base_image
from envhub.envs.images.layered import build_env_image
from envhub.envs.images.recipe import BaseRecipe, default_recipe

__all__ = [
    "BaseRecipe",
    "ImageBuild",
    "aensure_base_image",
    "aimage_for_spec",
    "build_env_image",
    "default_recipe",
    "ensure_base_image",
    "image_for_spec",
]


def image_for_spec(image: str | None, dockerfile: str | None, root: str | Path = ".") -> str:
    """The image a sandbox spec runs in: `dockerfile` (relative to `root`) is built on the base,
    else `image` is used as given, else the base image itself."""
    if dockerfile:
        return build_env_image(dockerfile=Path(root) / dockerfile).tag
    if image:
        return image
    return ensure_base_image().tag


async def aimage_for_spec(image: str | None, dockerfile: str | None,
                          root: str | Path = ".") -> str:
    """Async twin of `image_for_spec`."""
    return await asyncio.to_thread(image_for_spec, image, dockerfile, root)
