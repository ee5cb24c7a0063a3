"""envhub.registry: environment packages — pack, publish, install by `owner/name@version`.

Public API (imported lazily, so `envhub --help` does not pay for sqlalchemy/httpx):
`resolve(ref) -> Path` (install on demand; what `envhub run owner/name@version` calls),
`installed() -> list[InstalledEnv]` (for `envhub list`), `registry_info(ref) -> dict | None`
(for `envhub info owner/name`), `pack`, `open_registry`, `RegistryError`. The async
`install(ref, registry)` lives in `envhub.registry.install` (a package attribute of that
name would be shadowed by the submodule).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "resolve": "envhub.registry.install",
    "installed": "envhub.registry.install",
    "registry_info": "envhub.registry.install",
    "InstalledEnv": "envhub.registry.install",
    "pack": "envhub.registry.archive",
    "open_registry": "envhub.registry.sources",
    "RegistryError": "envhub.registry.errors",
}
__all__ = ["InstalledEnv", "RegistryError", "installed", "open_registry", "pack", "registry_info",
           "resolve"]


def __dir__() -> list[str]:
    return __all__


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envhub.registry' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
