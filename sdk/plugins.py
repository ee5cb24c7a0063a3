"""Name -> class tables that also accept a dotted path (mini-swe-agent's environments table).

    BACKENDS = {"local": "envhub.gateway.backends.local.LocalBackend", ...}
    cls = load_class("local", BACKENDS, "backend")            # a name from the table
    cls = load_class("my_pkg.engines.MyBackend", BACKENDS, "backend")   # any importable class

Table values are dotted paths too, so listing a choice imports nothing: a backend with a heavy
dependency costs nothing until it is chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

__all__ = ["is_dotted_path", "load_class"]


def is_dotted_path(name: str) -> bool:
    """`pkg.mod.Class`: identifiers joined by dots (at least one dot)."""
    parts = name.split(".")
    return len(parts) > 1 and all(p.isidentifier() for p in parts)


def load_class(name: str, table: Mapping[str, str], what: str) -> type:
    """The class `name` stands for: a key of `table`, or a dotted path `pkg.mod.Class`.
    Unknown names raise ValueError listing the choices."""
    path = table.get(name, name)
    if not is_dotted_path(path):
        raise ValueError(f"unknown {what} {name!r}: use one of {', '.join(sorted(table))}, or "
                         "the dotted path of a class, e.g. my_pkg.my_module.MyClass")
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if path is name and f"{module_name}.".startswith(f"{missing}."):
            raise ValueError(f"{what} {name!r}: no module {missing!r} to import; use one of "
                             f"{', '.join(sorted(table))}, or the dotted path of an "
                             "importable class") from exc
        raise  # the module exists but needs something missing: show that error as it is
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"{what} {name!r}: {module_name} has no class {attr!r}")
    return cls
