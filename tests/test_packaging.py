"""The layout (DESIGN.md): top-level component folders reached as `envhub.<component>` through
committed relative symlinks. A built wheel must hold real copies of them, data included, and
import from where it is installed — not from this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("sdk", "gateway", "envs", "registry", "trainer", "viewer")


def test_components_are_relative_symlinks_into_the_checkout() -> None:
    for name in COMPONENTS:
        link = ROOT / "envhub" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", link
        assert (link / "__init__.py").is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (path,) = out.glob("envhub-*.whl")
    return path


def test_wheel_holds_every_component_with_its_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        symlinks = [i.filename for i in zf.infolist() if (i.external_attr >> 28) == 0o12]
    assert not symlinks  # real files, not links back into a checkout
    for name in COMPONENTS:
        assert f"envhub/{name}/__init__.py" in names
        assert f"envhub/{name}/py.typed" in names
    for data in ("envhub/gateway/engine/tiny/model.safetensors",
                 "envhub/gateway/engine/tiny/tokenizer.json",
                 "envhub/gateway/render/templates/deepseek_v3.jinja",
                 "envhub/viewer/templates/session.html", "envhub/viewer/static/view.css",
                 "envhub/envs/builtin/swe_task/envhub.toml",
                 "envhub/envs/scaffold/template/envhub.toml.tmpl",
                 "envhub/envs/agents/recipes/opencode.sh",
                 "envhub/envs/agents/recipes/envhub-tool"):
        assert data in names, data
    assert not [n for n in names if n.startswith(("tests/", "bench/", "scripts/"))]


def test_installed_wheel_imports_from_its_own_folder(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import envhub, envhub.gateway.config as c, envhub.envs.builtin as b, "
             "envhub.trainer, envhub.registry, envhub.sdk; "
             "print(envhub.__file__); print(c.BUNDLED_MODEL); print(b.__file__)")
    # PYTHONPATH puts the installed copy ahead of this checkout's editable install
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert line.startswith(str(target)), line
    assert (target / "envhub/gateway/engine/tiny/config.json").is_file()
    cli = subprocess.run([sys.executable, "-m", "envhub", "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "gateway" in cli.stdout, cli.stderr
