"""Which parts of an agent's diff reach grading."""

from __future__ import annotations

import pytest

from envhub.envs.swe.construct.patches import file_diff
from envhub.envs.swe.diff import filter_patch, protected_reason, split_diff


@pytest.mark.parametrize("path", [
    "tests/test_x.py", "test_inflection.py", "pkg/tests/helpers.py", "conftest.py",
    "src/conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
    "sitecustomize.py", "src/usercustomize.py", "x.pth", "pytest.py", "_pytest/python.py",
    "src/pluggy/__init__.py", "../outside.py", "/etc/passwd", ".git/config", "a_test.py",
])
def test_protected(path: str) -> None:
    assert protected_reason(path) is not None


@pytest.mark.parametrize("path", ["inflection/__init__.py", "src/cachetools/keys.py",
                                  "toolz/itertoolz.py", "docs/notes.md", "pkg/testament.py"])
def test_allowed(path: str) -> None:
    assert protected_reason(path) is None


def test_filter_keeps_source_and_drops_the_rest() -> None:
    patch = (file_diff("pkg/mod.py", "a = 1\n", "a = 2\n")
             + file_diff("conftest.py", None, "import pytest\n")
             + file_diff("tests/test_mod.py", "def test(): assert 0\n", "def test(): pass\n")
             + "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n"
               "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
    kept, dropped = filter_patch(patch)
    assert [b.new_path for b in split_diff(kept)] == ["pkg/mod.py"]
    assert any("conftest.py" in d for d in dropped)
    assert any("tests/test_mod.py" in d for d in dropped)
    assert any("symlink" in d for d in dropped)


def test_hidden_paths_are_protected_even_outside_test_folders() -> None:
    kept, dropped = filter_patch(file_diff("checks.py", None, "x = 1\n"), {"checks.py"})
    assert kept == "" and dropped == ["checks.py: a hidden test file"]


def test_source_lines_naming_the_test_runner_are_found() -> None:
    from envhub.envs.swe.diff import runner_references

    patch = (file_diff("pkg/a.py", "x = 1\n", "x = 1\nimport _pytest.reports\n")
             + file_diff("pkg/b.py", "y = 1\n", "y = 2  # unrelated\n")
             + file_diff("pkg/c.py", None, "import os\nos.environ['PYTEST_ADDOPTS'] = ''\n"))
    found = runner_references(patch)
    assert [f.split(":")[0] for f in found] == ["pkg/a.py", "pkg/c.py"]
    assert runner_references(file_diff("pkg/d.py", "a = 1\n", "a = 2\n")) == []
