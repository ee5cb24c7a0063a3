"""A real Ray cluster of two nodes on loopback, for tests (or the head alone: `start(nodes=1)`):
`ray start --head` plus a second `ray start --address`, each with its own custom resource and
temp folder, each under `--block` in its own process session so that one node can be killed
alone (SIGKILL to its process group: raylet and workers together) and everything is torn down
by process id, never by `ray stop` (which would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support import free_port

RAY = str(Path(sys.executable).with_name("ray"))
# Fast detection of a dead node (defaults take ~30 s), small object stores, no dashboard.
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 1000}
COMMON = ["--num-cpus", "1", "--object-store-memory", str(80 * 1024 * 1024),
          "--disable-usage-stats", "--block",
          "--node-ip-address", "127.0.0.1"]


class TwoNodeCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.marks = root / "marks"  # see `_start`
        self.marks.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "RAY_ADDRESS": self.address,
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def start(self, nodes: int = 2) -> TwoNodeCluster:
        self._start("node_a", ["--head", "--port", str(self.port),
                               "--include-dashboard=false",
                               "--system-config", json.dumps(SYSTEM_CONFIG)])
        self._wait_nodes(1)
        if nodes > 1:
            self._start("node_b", ["--address", self.address])
            self._wait_nodes(2)
        return self

    def _start(self, name: str, args: list[str]) -> None:
        tmp = self.root / name  # Ray's socket paths must stay short
        tmp.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "wb")
        self.nodes[name] = subprocess.Popen(
            [RAY, "start", *args, *COMMON, "--resources", json.dumps({name: 1}),
             "--temp-dir", str(tmp)],
            # processes Ray starts on the node (a host agent's too) can tell which node they are on
            env={**self.env, "ENVHUB_TEST_NODE": name, "ENVHUB_TEST_MARKS": str(self.marks)},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive_nodes(self) -> list[dict]:
        try:  # ray.init keeps trying while the head is still starting: bounded, then retried
            out = subprocess.run(
                [sys.executable, "-c", "import ray, json; ray.init(logging_level='ERROR', "
                 "log_to_driver=False); print(json.dumps([n['Resources'] for n in ray.nodes() "
                 "if n['Alive']]))"], env=self.env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return []
        if out.returncode != 0:
            return []
        return json.loads(out.stdout.strip().splitlines()[-1])

    def _wait_nodes(self, count: int, timeout: float = 300.0) -> None:  # a loaded CI machine
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.nodes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start for {name} exited: "
                                       f"{(self.root / f'{name}.log').read_text()[-3000:]}")
            if len(self.alive_nodes()) >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {count} nodes in {timeout:g}s")

    def kill(self, name: str) -> None:
        """SIGKILL one node: its `ray start`, raylet, workers and helpers."""
        proc = self.nodes[name]
        procs = _tree(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in procs:  # anything that left the process group
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):  # workers first, the head last
            self.kill(name)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
