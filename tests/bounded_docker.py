"""A second, real Docker engine whose containers' writable layers can be bounded, for the tests
of docker sandboxes' `[sandbox] disk_mb`.

`--storage-opt size` (what envs/sandbox/docker.py asks for) needs a storage driver with quotas:
btrfs, zfs, or overlay2 on xfs mounted with pquota. CI's main engine is Debian's default,
overlay2 on ext4, which refuses it, and this kernel has no XFS quotas. Giving the main engine a
btrfs data root was tried (0f13e00): the qgroup accounting of every dropped container
(btrfs-cleaner, ~20% of a core) pushed the docker-heavy swe tests past their limit under load.
So the bound is tested on an engine of its own: dockerd on a btrfs filesystem in a sparse
loop file, with its own socket, exec root and containerd, a bridge interface of its own and no
iptables rules, holding only the base image, loaded from the main engine. It lives as long as
the test module that asks for it. Not `--bridge none`: a daemon started so deletes the host's
`docker0`, the main engine's bridge, after which every networked container of the main engine
fails ("could not find bridge docker0": five tests of a loaded CI run failed that way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import docker_reachable, require, require_tool

SIZE_GB = 4  # sparse: the base image (~0.3 GB) and the bounded writes of a test or two


def _sh(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, timeout=120, **kwargs)


@contextmanager
def bounding_engine(root: Path) -> Iterator[str]:
    """Start the engine under `root` (a fresh folder) and yield its DOCKER_HOST; stop it,
    unmount and remove everything afterwards."""
    require(os.geteuid() == 0, "root (a loop mount and a second dockerd)")
    require(docker_reachable(), "a running Docker engine (`dockerd`)")
    require("btrfs" in Path("/proc/filesystems").read_text(), "a kernel with btrfs")
    require_tool("mkfs.btrfs")
    require_tool("dockerd")
    from envhub.envs.images import ensure_base_image

    base = ensure_base_image().tag  # in the main engine (built once per machine)
    image, mount = root / "disk.btrfs", root / "mnt"
    # short paths: containerd's socket under the exec root must fit a Unix socket's 108 bytes
    run = Path(f"/run/envhub-bounded-{os.getpid()}")
    host = f"unix://{run}/docker.sock"
    bridge = f"envhub-b{os.getpid() % 100000}"  # at most 15 characters
    require_tool("ip")
    main_bridge = Path("/sys/class/net/docker0").exists()  # the main engine's: must survive
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(SIZE_GB << 30)
    _sh("mkfs.btrfs", "-q", str(image))
    _sh("mount", "-o", "loop", str(image), str(mount))
    daemon = None
    try:
        _sh("btrfs", "quota", "enable", str(mount))
        # past this depth a dropped subvolume marks every quota inconsistent, and inconsistent
        # quotas bound nothing (seen in CI, 86b31cf)
        uuid = _sh("findmnt", "-no", "UUID", str(mount), text=True).stdout.strip()
        threshold = Path(f"/sys/fs/btrfs/{uuid}/qgroups/drop_subtree_threshold")
        if threshold.exists():
            threshold.write_text("8")
        run.mkdir(exist_ok=True)
        (root / "daemon.json").write_text("{}")  # no user's /etc/docker/daemon.json applies
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"10.213.{os.getpid() % 250}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - closed below, after the daemon
        daemon = subprocess.Popen(
            ["dockerd", "--data-root", str(mount / "data"), "--exec-root", str(run / "exec"),
             "--pidfile", str(run / "docker.pid"), "-H", host, "--storage-driver", "btrfs",
             "--bridge", bridge, "--iptables=false", "--ip6tables=false",
             "--config-file", str(root / "daemon.json")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        env = {**os.environ, "DOCKER_HOST": host}
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bounding dockerd did not start:\n" +
                                   (root / "dockerd.log").read_text()[-3000:])
            time.sleep(0.2)
        save = subprocess.Popen(["docker", "save", base], stdout=subprocess.PIPE)
        _sh("docker", "load", stdin=save.stdout, env=env)
        assert save.wait(60) == 0, "docker save of the base image failed"
        yield host
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
            log.close()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        image.unlink(missing_ok=True)
        shutil.rmtree(run, ignore_errors=True)
    assert not main_bridge or Path("/sys/class/net/docker0").exists(), \
        "the second engine removed the main engine's docker0 bridge"
