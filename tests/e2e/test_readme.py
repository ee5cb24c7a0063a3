"""The documentation's commands work as pasted: every shell block marked `<!-- runnable -->` in
the README and in the tutorials (docs/tutorials/*.md) is run in a fresh folder with a fresh
HOME, as a user types it (bash -e, `.venv`'s `envhub` on PATH), and must exit 0. The README's
blocks are independent (one test each); a tutorial's blocks run in order in one folder, as a
reader goes through the page. The one edit: the ports they name (8400, 8500) become free ones,
so the test cannot collide with another on the machine. The docs site includes the README's
quickstart (docs/quickstart.md), so a renamed flag or a changed output fails here first."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- runnable -->\n```bash\n(.*?)```", re.S)
PORTS = ("8400", "8500")
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))


def runnable_blocks(page: Path = ROOT / "README.md") -> list[str]:
    return BLOCK.findall(page.read_text())


def run_block(block: str, cwd: Path, ports: dict[str, str]) -> str:
    """`block` run by bash -e in `cwd` with a HOME of its own; its output (asserted exit 0)."""
    for port, free in ports.items():
        block = block.replace(port, free)
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN"):
        env.pop(name, None)
    # -e: the first line that fails fails the block, as a user would stop there
    proc = subprocess.Popen(["bash", "-e", "-c", block], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=480)
    finally:
        try:  # whatever the block left in the background (a server it did not reach to kill)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{block}\n---\n{out[-4000:]}"
    return out


def free_ports() -> dict[str, str]:
    return {port: str(free_port()) for port in PORTS}


def test_the_readme_has_the_three_quickstart_blocks():
    blocks = runnable_blocks()
    assert len(blocks) == 3, blocks
    assert "envhub gateway" in blocks[0] and "envhub run swe-task" in blocks[1]
    assert "envhub publish" in blocks[2]


def test_the_tutorials_that_run_here_have_runnable_blocks():
    """Every tutorial but scale-out (Ray, PostgreSQL and nginx: tested by their own suites)."""
    marked = {page.stem for page in TUTORIALS if runnable_blocks(page)}
    assert marked == {page.stem for page in TUTORIALS} - {"scale-out"}, marked


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2], ids=["gateway", "swe-task", "publish"])
def test_a_quickstart_block_runs_as_pasted(tmp_path: Path, index: int):
    out = run_block(runnable_blocks()[index], tmp_path, free_ports())
    if index == 0:  # the model answered, and the session's trajectory holds the call
        assert '"choices"' in out and '{"session":{"id":"run-42"' in out, out[-2000:]
    if index == 1:
        assert '"rollouts": 2' in out, out[-2000:]
    if index == 2:  # the audit passed, the package was published and ran by reference
        assert (tmp_path / "runs" / "my-env" / "summary.json").exists(), out[-3000:]
        assert "alice/my-env@0.1.0" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in TUTORIALS if runnable_blocks(p)],
                         ids=lambda p: p.stem)
def test_a_tutorials_blocks_run_in_order_as_pasted(tmp_path: Path, page: Path):
    ports = free_ports()
    for block in runnable_blocks(page):
        run_block(block, tmp_path, ports)
    made = {"train": "arith/metrics.jsonl", "cli-agents": "opencode/summary.json",
            "environment": "my-env/summary.json"}[page.stem]
    assert (tmp_path / "runs" / made).is_file(), made
