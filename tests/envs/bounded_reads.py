"""The read limit every sandbox kind keeps (run from each kind's test file): a file past it is
refused by its size, before its bytes reach the host's memory."""

from __future__ import annotations

import asyncio
import resource

import pytest

from envhub.envs.errors import AgentOutputError
from envhub.envs.sandbox import Sandbox, SandboxFileError
from envhub.envs.sandbox.base import MAX_READ_BYTES
from envhub.envs.sandbox.errors import FileTooLarge


def check_bounded_reads(box: Sandbox) -> None:
    async def scenario() -> None:
        await box.write_file("ten.txt", b"0123456789")
        assert await box.read_file("ten.txt", limit=10) == b"0123456789"  # at the limit: read
        with pytest.raises(FileTooLarge) as small:
            await box.read_file("ten.txt", limit=9)
        assert small.value.size == 10 and small.value.limit == 9
        # 1 GiB that costs the agent nothing (sparse), and more than the default limit
        made = await box.exec("truncate -s 1G big.bin && truncate -s 65M over.bin")
        assert made.exit_code == 0, made.stderr
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name in ("big.bin", "over.bin"):
            with pytest.raises(FileTooLarge) as large:
                await box.read_file(name)
            assert large.value.limit == MAX_READ_BYTES and large.value.size > MAX_READ_BYTES
            # a missing answer and an oversized one are both what the verifier sees as no answer;
            # the runner scores the oversized one 0 (the agent's doing), never env_failure
            assert isinstance(large.value, SandboxFileError)
            assert isinstance(large.value, AgentOutputError)
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kib < MAX_READ_BYTES >> 10, f"the refused reads cost {grown_kib} KiB"

    asyncio.run(scenario())



