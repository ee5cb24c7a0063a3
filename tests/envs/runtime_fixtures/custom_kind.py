"""A sandbox kind of a user's own, reached by dotted path only (no edit of envhub's table)."""

from __future__ import annotations

from envhub.envs.sandbox.local import LocalSandbox


class FolderSandbox(LocalSandbox):
    """The local sandbox under another name: enough to show the table takes dotted paths."""

    kind = "folder"
