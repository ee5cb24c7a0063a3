"""The README's quickstart works as pasted: every shell block marked `<!-- runnable -->` is run
in a fresh folder with a fresh HOME, each line as a user types it (bash, `.venv`'s `envhub` on
PATH), and must exit 0. The one edit: the ports it names (8400, 8500) become free ones, so the
test cannot collide with another on the machine. The docs site includes the same text
(docs/quickstart.md), so a renamed flag or a changed output fails here first."""

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


def runnable_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_the_three_quickstart_blocks():
    blocks = runnable_blocks()
    assert len(blocks) == 3, blocks
    assert "envhub gateway" in blocks[0] and "envhub run swe-task" in blocks[1]
    assert "envhub publish" in blocks[2]


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2], ids=["gateway", "swe-task", "publish"])
def test_a_quickstart_block_runs_as_pasted(tmp_path: Path, index: int):
    block = runnable_blocks()[index]
    for port in PORTS:
        block = block.replace(port, str(free_port()))
    (tmp_path / "home").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name in ("ENVHUB_REGISTRY", "ENVHUB_TOKEN"):
        env.pop(name, None)
    # -e: the first line that fails fails the block, as a user would stop there
    proc = subprocess.Popen(["bash", "-e", "-c", block], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=480)
    finally:
        try:  # whatever the block left in the background (a server it did not reach to kill)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-4000:]
    if index == 0:  # the model answered, and the session's trajectory holds the call
        assert '"choices"' in out and '{"session":{"id":"run-42"' in out, out[-2000:]
    if index == 1:
        assert '"rollouts": 2' in out, out[-2000:]
    if index == 2:  # the audit passed, the package was published and ran by reference
        assert (tmp_path / "runs" / "my-env" / "summary.json").exists(), out[-3000:]
        assert "alice/my-env@0.1.0" in out, out[-3000:]
