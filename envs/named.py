"""Name → implementation tables that also take a dotted path (sandbox kinds, reward components).

A table maps a short name to 'module:Attr'; anything not in the table is read as such a path
itself ('module.Attr' works too), so a user's own implementation needs no edit of ours.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def is_dotted(name: str) -> bool:
    """Whether `name` reads as 'module:Attr' or 'module.Attr' (not whether it imports)."""
    module, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
    return bool(module) and attr.isidentifier() and all(
        part.isidentifier() for part in module.split("."))


def load(table: Mapping[str, str], name: str, what: str) -> Any:
    """The object `name` stands for: a table entry, else a dotted path. Raises LookupError
    naming the table's entries and the dotted form when it cannot be found."""
    path = table.get(name, name)
    hint = (f"unknown {what} {name!r}; use one of {', '.join(table)} or a dotted path "
            "'package.module:Name'")
    if not is_dotted(path):
        raise LookupError(hint)
    module_name, _, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if name in table:  # ours, but its optional dependency is missing: say that instead
            raise LookupError(f"{what} {name!r} cannot be loaded: {e}") from None
        raise LookupError(f"{hint} ({path}: {e})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise LookupError(f"{hint} ({module_name} has no {attr!r})") from None
