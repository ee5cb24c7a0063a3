"""Git-style unified diffs written from file contents (what `git apply` reads)."""

from __future__ import annotations

import difflib


def file_diff(path: str, old: str | None, new: str | None) -> str:
    """Diff of one file; `old=None` creates it, `new=None` deletes it. Texts must end with a
    newline (the pipeline only snapshots such files)."""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    head = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        head.append("new file mode 100644\n")
    if new is None:
        head.append("deleted file mode 100644\n")
    body = list(difflib.unified_diff(
        a, b, "/dev/null" if old is None else f"a/{path}",
        "/dev/null" if new is None else f"b/{path}", n=3))
    return "".join(head + body)


def new_files_patch(files: dict[str, bytes]) -> str:
    """A patch creating each file (the hidden tests, put back at grading)."""
    return "".join(file_diff(p, None, files[p].decode()) for p in sorted(files))
