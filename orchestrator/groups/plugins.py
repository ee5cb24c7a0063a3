"""The extension points' loader: an executor or a scheduling policy named in its table, or
given as a `package.module:Class` path."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from envhub.envs.errors import RunConfigError


def load_named(name: str, table: Mapping[str, str], what: str) -> Any:
    """An instance of the class `name` names (a key of `table`, or a dotted path);
    RunConfigError starting with `what` and naming the choices when there is none."""
    path = table.get(name, name)
    module, sep, attr = path.partition(":")
    if not sep:
        raise RunConfigError(f"{what} {name!r}: use one of {', '.join(table)} or "
                             "package.module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise RunConfigError(f"{what} {name!r}: cannot load {path}: {e}") from e
    return cls()
