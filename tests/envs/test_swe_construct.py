"""The task-construction pipeline: mutation operators, determinism, statements, patches."""

from __future__ import annotations

import ast
import random
import subprocess
from pathlib import Path

import pytest

from envhub.envs.swe.construct.config import Project, load_config
from envhub.envs.swe.construct.mutate import mutations
from envhub.envs.swe.construct.patches import file_diff, new_files_patch
from envhub.envs.swe.construct.sdist import deterministic_targz
from envhub.envs.swe.construct.statement import problem_statement, subject_of
from tests.support import require_tool

SOURCE = '''
def clamp(value, low=0, high=10, strict=False):
    if value < low:
        return low
    elif value > high:
        return high
    if strict and value == high:
        raise ValueError("at the edge")
    return value


class Box:
    def fits(self, items, limit=3):
        if len(items) <= limit:
            return True
        else:
            return max(items[0], items[1]) in items
'''


def test_every_bug_family_appears_and_every_mutant_parses_and_differs() -> None:
    found = mutations("m.py", SOURCE)
    assert {m.operator for m in found} == {"off_by_one", "inverted_condition", "wrong_default",
                                          "dropped_branch", "swapped_args"}
    original = ast.dump(ast.parse(SOURCE))
    for m in found:
        assert ast.dump(ast.parse(m.source)) != original
        pairs = zip(SOURCE.splitlines(), m.source.splitlines(), strict=False)
        changed = [a for a, b in pairs if a != b]
        assert m.operator == "dropped_branch" or len(changed) == 1  # one-line bugs
    assert mutations("m.py", SOURCE) == found  # deterministic
    assert {m.function for m in found} == {"clamp", "Box.fits"}


def test_specific_mutants() -> None:
    sources = {m.detail: m.source for m in mutations("m.py", SOURCE)}
    assert "    if value <= low:\n" in sources["< -> <="]
    assert "strict=True" in sources["default False -> True"]
    assert "max(items[1], items[0])" in sources["(items[0], items[1]) swapped"]
    dropped = sources["else branch of line 14"]
    assert "else:" not in dropped.split("class Box")[1]


def test_targz_is_byte_identical_for_the_same_files() -> None:
    files = {"b.py": b"x = 1\n", "a/c.py": b"y = 2\n"}
    assert deterministic_targz(files) == deterministic_targz(dict(reversed(files.items())))


def test_generated_patches_apply_with_git(tmp_path: Path) -> None:
    require_tool("git")
    (tmp_path / "m.py").write_text(SOURCE)
    buggy = mutations("m.py", SOURCE)[0].source
    patch = file_diff("m.py", SOURCE, buggy) + new_files_patch({"tests/test_m.py": b"x = 1\n"})
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "m.py").read_text() == buggy
    assert (tmp_path / "tests/test_m.py").read_text() == "x = 1\n"


def test_statement_describes_the_symptom_not_the_fix() -> None:
    m = next(x for x in mutations("pkg/m.py", SOURCE) if x.detail == "< -> <=")
    text = problem_statement(m, "pkg", ["tests/test_m.py::test_clamp_low"],
                             ["E   assert 1 == 0"], random.Random(1))
    assert "`clamp()`" in text and "assert 1 == 0" in text and "test_clamp_low" in text
    assert "<=" not in text and "value" not in text
    private = next(x for x in mutations("src/pkg/_impl.py", "def _f(a):\n    return a < 1\n"))
    assert subject_of(private, "pkg") == "`pkg._impl`"


def test_pinned_config_is_valid_and_names_real_files() -> None:
    config = load_config()
    assert len(config.project) >= 4
    assert all(len(p.sha256) == 64 for p in config.project)
    with pytest.raises(ValueError):
        Project.model_validate({"name": "x", "version": "1", "repo": "o/x", "sha256": "bad",
                                "include": [], "mutate": [], "tests": []})


@pytest.mark.slow
def test_pipeline_rebuilds_the_shipped_task_set_byte_for_byte(tmp_path: Path) -> None:
    """Needs the pinned sdists (pip download from PyPI, or ~/.cache/envhub/sdists)."""
    import sys

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, str(root / "scripts" / "build_swe_tasks.py"),
                             "--check"], capture_output=True, text=True, timeout=1800,
                            check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "identical" in result.stdout


def test_position_generated_parameter_ids_are_not_used_as_targets() -> None:
    """pytest 7 and 9 number `expected8`-style ids differently: such ids are unstable."""
    from envhub.envs.swe.construct.build import stable_id

    args = {("tests/test_date.py", "test_format"): {"dt", "expected", "fmt"}}
    assert not stable_id("tests/test_date.py::test_format[4-1985-expected8-%Y]", args)
    assert stable_id("tests/test_date.py::test_format[4-1985-x8-%Y]", args)
    assert stable_id("test_inflection.py::test_pluralize_plural[cow-kine]", {})
    assert not stable_id("t.py::test_a[with space]", {})
