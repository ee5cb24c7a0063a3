"""The extension points' loader: an executor or a scheduling policy named in its table, or
given as a `package.module:Class` path (sdk/plugins.py resolves both)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envhub.envs.errors import RunConfigError
from envhub.sdk.plugins import UnknownPlugin, load_class


def load_named(name: str, table: Mapping[str, str], what: str) -> Any:
    """An instance of the class `name` names (a key of `table`, or a dotted path);
    RunConfigError starting with `what` and naming the choices when there is none."""
    if name not in table and ":" not in name:
        raise RunConfigError(f"{what} {name!r}: use one of {', '.join(table)} or "
                             "package.module:Class")
    try:
        cls = load_class(name, table, what)
    except (UnknownPlugin, ImportError) as e:
        raise RunConfigError(f"cannot load {e}") from e  # sdk's says what, which and why
    return cls()
