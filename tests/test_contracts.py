"""The import contracts (pyproject.toml [tool.importlinter], DESIGN.md's "may import" table):
kept on the real tree, and broken, by name, when a component imports what its row forbids."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("sdk", "gateway", "envs", "registry", "trainer", "viewer", "orchestrator")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on `tree`: its pyproject.toml, and its `envhub` package first on the path
    (ahead of any editable install of another checkout)."""
    script = Path(sys.executable).with_name("lint-imports")
    assert script.exists(), f"{script} missing: pip install -e '.[dev]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(script), "--no-cache"], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def copy_tree(dest: Path) -> Path:
    """The Python sources of this checkout, with envhub/'s relative component symlinks."""
    def not_code(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__"
                or (Path(folder, n).is_file() and not n.endswith(".py"))]

    for name in (*COMPONENTS, "envhub"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True, ignore=not_code)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    assert (dest / "envhub" / "gateway").is_symlink()
    return dest


def test_contracts_hold_on_this_tree() -> None:
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kept, 0 broken." in r.stdout
    # grimp follows envhub/'s symlinks into the components (else it would see 4 files)
    analyzed = int(re.search(r"Analyzed (\d+) files", r.stdout).group(1))
    assert analyzed >= sum(len(list((ROOT / c).rglob("*.py"))) for c in ("sdk", "gateway"))


@pytest.mark.parametrize(("module", "line", "contract", "edge"), [
    ("trainer/reach_in.py", "from envhub.gateway.service import GatewayService",
     "trainer may import sdk and gateway.pool only",
     "envhub.trainer.reach_in -> envhub.gateway.service"),
    ("sdk/reach_in.py", "from envhub.envs import manifest",
     "sdk imports nothing of ours", "envhub.sdk.reach_in -> envhub.envs"),
    ("registry/reach_in.py", "import envhub.orchestrator.groups.rollout",
     "registry may import sdk and envs.manifest",
     "envhub.registry.reach_in -> envhub.orchestrator.groups.rollout"),
    ("gateway/reach_in.py", "from envhub.cli import main",
     "gateway may import sdk", "envhub.gateway.reach_in -> envhub.cli"),
    ("viewer/reach_in.py", "from envhub.gateway.render import messages",
     "viewer may import sdk, gateway.pool and gateway.config only",
     "envhub.viewer.reach_in -> envhub.gateway.render.messages"),
    ("trainer/reach_in.py", "import envhub.viewer.sources",
     "trainer may import sdk and gateway.pool only",
     "envhub.trainer.reach_in -> envhub.viewer.sources"),
    # envs reaches the registry only through the resolver its caller gives the loader
    ("envs/reach_in.py", "from envhub.registry import install",
     "envs may import sdk", "envhub.envs.reach_in -> envhub.registry.install"),
    ("orchestrator/reach_in.py", "import envhub.viewer.sources",
     "orchestrator may import every component but the viewer",
     "envhub.orchestrator.reach_in -> envhub.viewer.sources"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                contract: str, edge: str) -> None:
    tree = copy_tree(tmp_path)
    (tree / module).write_text(f'"""A deliberate violation."""\n\n{line}\n')
    r = lint_imports(tree)
    assert r.returncode == 1, r.stdout + r.stderr
    broken = r.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and edge in broken, r.stdout
    assert "kept, 1 broken." in r.stdout  # only the contract of that row


def test_the_trainer_may_import_the_pool(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    (tree / "trainer" / "reach_in.py").write_text(
        "from envhub.gateway import pool\nfrom envhub.gateway.pool import store\n")
    r = lint_imports(tree)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_cycle_between_the_orchestrators_parts_breaks_its_contract(tmp_path: Path) -> None:
    """groups/ is imported by training/ (the producer runs groups): a groups module importing
    training back makes the cycle the acyclic contract names."""
    tree = copy_tree(tmp_path)
    (tree / "orchestrator" / "groups" / "reach_in.py").write_text(
        "from envhub.orchestrator.training import loop\n")
    r = lint_imports(tree)
    assert r.returncode == 1, r.stdout + r.stderr
    broken = r.stdout.split("Broken contracts", 1)[1]
    assert "the orchestrator's parts import each other without cycles" in broken, r.stdout
    assert "kept, 1 broken." in r.stdout

