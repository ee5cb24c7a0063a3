"""Sandbox kinds: one table, name -> implementation. Add a kind with one line here (or none:
`--sandbox mypkg.box:MySandbox` and `[sandbox] kind = "mypkg.box:MySandbox"` work as they are).

An implementation is a class with the `SandboxKind` protocol (base.py): `open` and `reap`,
plus the `Sandbox` methods on its instances. `open_sandbox`, `reap`, the manifest's
`[sandbox] kind` and the CLI's `--sandbox` all read this table.
"""

from __future__ import annotations

from envhub.envs.sandbox.base import SandboxKind
from envhub.envs.sandbox.errors import SandboxUnavailable
from envhub.sdk.plugins import is_dotted_path, load_object

SANDBOXES: dict[str, str] = {
    "docker": "envhub.envs.sandbox.docker:DockerSandbox",  # a container per sandbox
    "local": "envhub.envs.sandbox.local:LocalSandbox",  # bubblewrap on this machine
    "e2b": "envhub.envs.sandbox.e2b:E2BSandbox",  # E2B's cloud (E2B_API_KEY)
}
AUTO = "auto"  # docker when its engine answers, else local (`best_available`)
NONE = "none"  # manifests only: the environment runs no commands (an in-process file store)
# What `local` becomes without bubblewrap: plain processes in a host folder (not /workspace),
# no isolation, a loud warning. Environments list it in `supported_kinds` only if they cope.
PLAIN = "plain"


def choices(manifest: bool = False) -> list[str]:
    """Kind names users can give: the table's, `auto`, and for manifests `none`."""
    return [*SANDBOXES, AUTO, *([NONE] if manifest else [])]


def check_kind(kind: str, manifest: bool = False) -> str:
    """`kind` when it names a kind (or reads as a dotted path: imported when first opened);
    ValueError with the choices otherwise."""
    if kind in choices(manifest) or is_dotted_path(kind):
        return kind
    raise ValueError(f"unknown sandbox kind {kind!r}; use one of {', '.join(choices(manifest))}"
                     " or a dotted path 'package.module:SandboxClass'")


def sandbox_class(kind: str) -> SandboxKind:
    """The implementation of `kind` (a table name or a dotted path); SandboxUnavailable with
    the choices when there is none."""
    try:
        cls: SandboxKind = load_object(kind, SANDBOXES, "sandbox kind")
    except LookupError as e:
        raise SandboxUnavailable(str(e)) from None
    except ImportError as e:  # ours, but a dependency it needs is missing
        raise SandboxUnavailable(f"sandbox kind {kind!r} cannot be loaded: {e}") from None
    return cls


def effective_kind(kind: str) -> str:
    """What `kind` runs as on this machine: `auto` resolved, `local` without bubblewrap is
    PLAIN."""
    if kind == AUTO:
        from envhub.envs.sandbox import best_available

        kind = best_available()
    if kind == "local":
        from envhub.envs.sandbox.local import bwrap_path

        return "local" if bwrap_path() else PLAIN
    return kind


def check_supported(env: str, supported: list[str] | None, kind: str) -> None:
    """Refuse, before anything runs, a sandbox kind the environment cannot work in (`kind` as
    `effective_kind` gives it); SandboxUnavailable says how to get one it can."""
    if supported is None or kind in supported:
        return
    if kind == PLAIN:
        raise SandboxUnavailable(
            f"{env} cannot run in local sandboxes here: bubblewrap (`bwrap`) is missing, so "
            "they would be plain processes in a host folder, while its tasks need a real "
            "sandbox (fixed paths such as /workspace, isolation). Install it (apt-get install "
            f"bubblewrap) or run with --sandbox {supported[0]}")
    raise SandboxUnavailable(f"{env} runs only in {' or '.join(supported)} sandboxes, not "
                             f"{kind!r}: run with --sandbox {supported[0]}")
