"""`bash scripts/main.sh` on a clean machine: a container with nothing but Debian's python3.

The machine is a Docker container from a debootstrap image (python3, python3-venv,
ca-certificates; built like envhub's base image, nothing pulled) holding a copy of this
checkout. main.sh must notice that neither bubblewrap nor git is there, install them with
apt-get and say so, create its venv from PyPI, run swe-task in the local sandbox and keep
`runs/<run_id>/` with a pool whose turns hold token ids. The host's pip configuration (its
index mirrors, local wheels such as the CPU torch wheel, its CA bundle) is handed over as is,
so the container installs what this host would. Takes ~2-4 minutes on a warm machine.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support import copy_checkout, require_docker, require_tool

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# bubblewrap needs to create namespaces and mounts inside the container (--privileged is
# refused where dockerd itself runs in a container; these are enough).
NAMESPACES = ["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
              "--security-opt", "systempaths=unconfined", "--cap-add", "SYS_ADMIN",
              "--cap-add", "NET_ADMIN"]


def clean_image() -> str:
    from envhub.envs.images.base import ensure_base_image
    from envhub.envs.images.recipe import BaseRecipe, host_mirror, host_suite

    recipe = BaseRecipe(suite=host_suite(), mirror=host_mirror(), packages=PACKAGES)
    return ensure_base_image(recipe).tag


def pip_setup() -> list[str]:
    """`docker run` arguments handing over this host's pip configuration: its config files,
    PIP_* variables, and the local folders and CA bundle they name, all read-only."""
    config = [Path("/etc/pip.conf"), Path.home() / ".config/pip/pip.conf",
              Path.home() / ".pip/pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        config.append(Path(os.environ["PIP_CONFIG_FILE"]))
    texts = [p.read_text() for p in config if p.is_file()]
    texts += [v for k, v in os.environ.items() if k.startswith("PIP_")]
    paths = {Path(p) for p in config if p.is_file()}
    for word in " ".join(texts).replace("=", " ").split():
        path = Path(word.removeprefix("file://"))
        if word.startswith(("/", "file:///")) and path.exists():
            # a local index's pages link to files beside them: ROOT/simple -> ROOT/files
            paths.add(path.parent if path.name == "simple" else path)
    args = []
    for path in sorted(paths):
        target = str(path).replace(str(Path.home()), "/root", 1)
        args += ["-v", f"{path}:{target}:ro"]
    for key, value in os.environ.items():
        if key.startswith("PIP_"):
            args += ["-e", f"{key}={value}"]
    return args


def clean_machine(tmp_path: Path) -> tuple[str, Path]:
    """The clean image (python3 only) and a copy of this checkout to mount into it."""
    require_docker()
    require_tool("debootstrap")
    if os.geteuid() != 0:
        pytest.skip("building the clean image with debootstrap needs root")
    image = clean_image()
    src = tmp_path / "src"
    copy_checkout(src)
    return image, src


@pytest.mark.slow
def test_main_script_provisions_and_keeps_a_run_on_a_clean_machine(tmp_path: Path) -> None:
    image, src = clean_machine(tmp_path)
    name = f"envhub-main-{uuid.uuid4().hex[:8]}"
    cmd = ["docker", "run", "--rm", "--name", name, *NAMESPACES, *pip_setup(),
           "-v", f"{src}:/src", "-w", "/src", image,
           "bash", "scripts/main.sh", "-n", "1", "--max-turns", "2", "-c", "1"]
    start = time.monotonic()
    try:
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, check=False)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    took = time.monotonic() - start
    print(f"main.sh in a clean container: exit {ran.returncode} after {took:.0f}s")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-4000:]
    assert "main.sh: installing bubblewrap git with apt-get" in ran.stdout
    assert "main.sh: sandbox: local" in ran.stdout
    [run] = (src / "runs").iterdir()
    assert f"results: runs/{run.name}/" in ran.stdout
    assert (run / "summary.json").is_file() and len(list((run / "rollouts").iterdir())) == 1
    with sqlite3.connect(run / "pool.db") as db:
        turns = db.execute("SELECT length(prompt_delta), length(completion) FROM turns "
                           "ORDER BY seq").fetchall()
        status = db.execute("SELECT status FROM sessions").fetchall()
    assert turns and all(prompt > 0 and completion > 0 for prompt, completion in turns)
    assert turns[0][0] % 4 == 0  # int32 token ids
    # the rollout ran and was graded by a pytest that started (not an infrastructure failure)
    assert status == [("done",)], out[-4000:]
    [record] = (run / "rollouts").iterdir()
    problems = " ".join(json.loads(record.read_text())["verdict"].get("problems", []))
    assert "no pytest summary" not in problems and "no sealed record" not in problems, problems
    # quiet: nothing but main.sh's own lines and the run's progress before the results table
    before = ran.stdout.split("envhub run results")[0] + ran.stderr
    for noise in ["Traceback", "Warning", "deprecated", "Loading weights", "!!"]:
        assert noise not in before, before[-3000:]
    doctor_names_what_is_missing(image, src)


def doctor_names_what_is_missing(image: str, src: Path) -> None:
    """`envhub doctor` on a fresh container of the clean image (main.sh's venv in the mounted
    checkout; no dockerd, bubblewrap or Chromium there): each missing, with its fix; exit 1."""
    ran = subprocess.run(["docker", "run", "--rm", "-v", f"{src}:/src", "-w", "/src", image,
                          ".venv/bin/envhub", "doctor"], capture_output=True, text=True,
                         timeout=300, check=False)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    for name, fix in [("docker", "apt-get install -y docker.io"),
                      ("bubblewrap", "apt-get install -y bubblewrap"),
                      ("chromium", "apt-get install chromium"),
                      ("postgresql", "apt-get install -y postgresql")]:
        [i] = [i for i, line in enumerate(lines) if line.split()[1:2] == [name]]
        assert lines[i].startswith("MISSING"), ran.stdout
        assert fix in lines[i + 1] and "fix:" in lines[i + 1], ran.stdout
    assert any(line.startswith("ok") and " python " in line for line in lines), ran.stdout


def test_main_script_without_root_stops_before_the_run_with_the_command(tmp_path: Path) -> None:
    """Not root, so nothing can be installed: main.sh stops at once (exit 2) and prints the
    command that provisions the machine, before creating a venv or starting a run."""
    image, src = clean_machine(tmp_path)
    ran = subprocess.run(["docker", "run", "--rm", "--user", "65534:65534", "-v",
                          f"{src}:/src:ro", "-w", "/src", image, "bash", "scripts/main.sh"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "sudo apt-get install -y bubblewrap git" in ran.stderr
    assert "installing" not in ran.stdout and "sandbox:" not in ran.stdout
