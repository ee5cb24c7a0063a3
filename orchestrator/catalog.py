"""Environments by reference, with the registry behind the loader: a folder, a built-in name,
`owner/name@version` (installed first if it must be) or the bare name of an installed one."""

from __future__ import annotations

from pathlib import Path

from envhub.envs import loader
from envhub.envs.loader import Catalog, LoadedEnv


def _resolve(ref: str) -> Path:
    from envhub.registry import install

    return install.resolve(ref)


def _installed() -> list[tuple[str, Path]]:
    from envhub.registry import install

    try:
        listing = install.installed()
    except Exception:  # noqa: BLE001 - an unreadable store: list only the built-ins
        return []
    return [(e.ref, e.path) for e in listing]


REGISTRY = Catalog(resolve=_resolve, installed=_installed)


def load_env(ref: str) -> LoadedEnv:
    return loader.load_env(ref, REGISTRY)


def resolve_folder(ref: str) -> Path:
    return loader.resolve_folder(ref, REGISTRY)


def available_envs() -> dict[str, str]:
    return loader.available_envs(REGISTRY)
