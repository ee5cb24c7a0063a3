"""What a run sets up before its rollouts (orchestrator/groups/setup.py)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap


def test_a_run_may_open_as_many_files_as_the_hard_limit_allows() -> None:
    """896 rollouts in flight held 7,643 descriptors (bench/bench_inflight.py): with the usual
    soft limit of 1,024 the rollouts past it would fail to connect. A process started with the
    soft limit at 1,024 may open up to the hard limit once the run's set-up raised it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        raise AssertionError(f"hard limit {hard}: this machine cannot show the raise")
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
        from envhub.orchestrator.groups.setup import raise_open_files_limit
        limit = raise_open_files_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == limit
        print(limit)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert int(out) > 1024
    if hard != resource.RLIM_INFINITY:
        assert int(out) == hard
