"""Name -> implementation tables that also accept a dotted path (mini-swe-agent's environments
table): backends, sandbox kinds, reward components.

    BACKENDS = {"local": "envhub.gateway.backends.local.LocalBackend", ...}
    cls = load_class("local", BACKENDS, "backend")                       # a name from the table
    cls = load_class("my_pkg.engines.MyBackend", BACKENDS, "backend")    # any importable class
    obj = load_object("my_pkg.rewards:Brevity", {}, "reward component")  # ':' works too

Table values are dotted paths too, so listing a choice imports nothing: an implementation with
a heavy dependency costs nothing until it is chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["UnknownPlugin", "is_dotted_path", "load_class", "load_object"]


class UnknownPlugin(LookupError, ValueError):
    """A name that is neither in the table nor an importable dotted path; says the choices."""


def _split(path: str) -> tuple[str, str]:
    """'pkg.mod:Attr' or 'pkg.mod.Attr' -> ('pkg.mod', 'Attr')."""
    module, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    return module, attr


def is_dotted_path(name: str) -> bool:
    """Whether `name` reads as `pkg.mod.Attr` or `pkg.mod:Attr` (not whether it imports)."""
    module, attr = _split(name)
    return bool(module) and attr.isidentifier() and all(
        part.isidentifier() for part in module.split("."))


def load_object(name: str, table: Mapping[str, str], what: str) -> Any:
    """What `name` stands for: a key of `table`, or a dotted path. UnknownPlugin (listing the
    choices) when neither; an import error inside an existing module propagates as it is (a
    missing extra says its own fix)."""
    path = table.get(name, name)
    choices = f"use one of {', '.join(sorted(table))}, or " if table else "use "
    hint = (f"{choices}the dotted path of an importable object, e.g. my_pkg.my_module.MyClass "
            "(or my_pkg.my_module:MyClass)")
    if not is_dotted_path(path):
        raise UnknownPlugin(f"unknown {what} {name!r}: {hint}")
    module_name, attr = _split(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if name not in table and f"{module_name}.".startswith(f"{missing}."):
            raise UnknownPlugin(f"{what} {name!r}: {exc}; {hint}") from exc
        raise  # the module exists but needs something missing: show that error as it is
    if not hasattr(module, attr):
        raise UnknownPlugin(f"{what} {name!r}: {module_name} has no {attr!r}")
    return getattr(module, attr)


def load_class(name: str, table: Mapping[str, str], what: str) -> type:
    """`load_object` for tables of classes: UnknownPlugin when the path names no class."""
    cls = load_object(name, table, what)
    if not isinstance(cls, type):
        raise UnknownPlugin(f"{what} {name!r}: {table.get(name, name)} is not a class")
    return cls
