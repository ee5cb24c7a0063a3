"""Several trainer ranks under torchrun: rank 0 leads, the others follow.

Rank 0 runs the gateway, the rollouts and the loop (orchestrator/training/loop.py). The trainer is
FSDP2-sharded, so every rank must join each step's and each push's collectives: rank 0's
`RankLeader` stands in for the Trainer in the loop and announces every `step(groups)` and
`sync(root)` and `save_checkpoint(folder)` to the other ranks (a pickled broadcast), which run
the same call in `follow` (a checkpoint: each rank writes its own DCP shards and RNG).
A `stop` (always sent, also when rank 0 fails) ends the followers; a follower waits for it
also after rank 0's weight push failed, so that rank 0 lives to report the error.

The commands travel on their own gloo group whose timeout is `COMMAND_TIMEOUT`, not the
process group's (gloo's default 30 min, NCCL's 10): between two commands rank 0 runs
rollouts, evaluations or starts an engine, which may take longer, and a follower waiting for
the next command must not give up then. A rank 0 that dies does not leave followers waiting
out this timeout: torchrun ends the other ranks when one exits with an error.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.errors import PeerFailed

if TYPE_CHECKING:
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.source import Group
    from envhub.trainer.trainer import Trainer


COMMAND_TIMEOUT = timedelta(days=7)


def _command_group() -> Any:
    """The group commands travel on (collective: every rank calls it once, at the start)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)


def _broadcast(group: Any, message: Any) -> Any:
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


class RankLeader:
    """The Trainer as rank 0's loop sees it; each call is announced to the other ranks."""

    def __init__(self, trainer: Trainer, dp: DataParallel):
        self.trainer = trainer
        self.ranks = dp.world
        self._stopped = False
        self._commands = _command_group()

    @property
    def version(self) -> int:
        return self.trainer.version

    def step(self, groups: list[Group]) -> dict[str, Any]:
        _broadcast(self._commands, ("step", groups))
        return self.trainer.step(groups)

    @property
    def last_fates(self) -> dict[str, Any]:
        return self.trainer.last_fates

    def sync(self, root: str | Path, push: Any = None, *, bump: bool = True) -> Path | None:
        _broadcast(self._commands, ("sync", (str(root), bump)))
        return self.trainer.sync(root, push=push, bump=bump)

    def save_checkpoint(self, folder: str | Path, window: Any = None, **kw: Any) -> Path:
        _broadcast(self._commands, ("checkpoint", str(folder)))
        return self.trainer.save_checkpoint(folder, window, **kw)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            _broadcast(self._commands, ("stop", None))
            _close(together=True)


def follow(trainer: Trainer, weights: Path) -> None:
    """A non-zero rank: run rank 0's steps and pushes (rank 0 alone writes and pushes)."""
    commands = _command_group()
    try:
        while True:
            command, arg = _broadcast(commands, None)
            if command == "step":
                trainer.step(arg)
            elif command == "checkpoint":
                trainer.save_checkpoint(arg)
            elif command == "sync":
                root, bump = arg
                try:
                    trainer.sync(root, push=None, bump=bump)
                except PeerFailed:
                    # Rank 0's push failed: it raises the push's own error, reports it and
                    # sends `stop`. Leaving now would make torchrun end rank 0 before it can.
                    continue
            else:
                _close(together=True)
                return
    finally:
        _close()


def _close(together: bool = False) -> None:
    """Leave the process group; `together` (on `stop`, both ranks there) after a barrier: a
    rank tearing gloo down while its peer still has the stop broadcast in flight was seen to
    abort a rank at exit ("terminate called without an active exception"). Not on a failure,
    where the peer may never come."""
    import torch.distributed as dist

    if dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()


def spawn(argv: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run `argv` (torchrun starting the ranks) and wait for it; (its exit code, whether a
    Ctrl-C was passed on). torchrun runs in a session of its own, so a Ctrl-C at the terminal
    reaches this process only, which passes it to rank 0 alone: the loop there stops at the
    next step boundary and writes a checkpoint with every rank, then ends the followers as at
    the end of a run. A Ctrl-C that reached every rank (and torchrun, which ends its workers
    on one) would cut that checkpoint short. A second Ctrl-C goes to rank 0 too (it stops at
    once); SIGTERM and SIGHUP end torchrun and its ranks."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    passed = False

    def interrupt(signum: int, frame: Any) -> None:
        nonlocal passed
        leader = rank_zero(proc.pid)
        try:
            if leader is not None:
                os.kill(leader, signal.SIGINT)
                passed = True
            else:  # no rank yet (torchrun starting): nothing to checkpoint
                os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def terminate(signum: int, frame: Any) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    handlers = {signal.SIGINT: interrupt, signal.SIGTERM: terminate, signal.SIGHUP: terminate}
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        return proc.wait(), passed
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def rank_zero(torchrun: int) -> int | None:
    """The pid of the rank-0 worker torchrun `torchrun` started (RANK=0 in its environment),
    from /proc; None before it runs."""
    children: list[int] = []
    try:
        with open(f"/proc/{torchrun}/task/{torchrun}/children") as f:
            children = [int(p) for p in f.read().split()]
    except OSError:  # a kernel without that file: every process's parent
        for entry in Path("/proc").iterdir():
            try:
                status = (entry / "status").read_text() if entry.name.isdigit() else ""
            except OSError:
                continue
            if f"\nPPid:\t{torchrun}\n" in status:
                children.append(int(entry.name))
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"\0RANK=0\0" in b"\0" + environ:
            return pid
    return None
