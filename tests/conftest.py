"""Fixtures shared by every test folder; helpers live in tests/support.py."""

import random
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from tests.support import IN_CI


@pytest.fixture(scope="session")
def postgres_server() -> Iterator["PostgresServer"]:  # noqa: F821
    """One real PostgreSQL server per test worker; tests take databases from it."""
    from tests.postgres import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle", type=int, metavar="SEED", default=None,
        help="run the tests in an order shuffled by SEED (the same on every xdist worker), to "
             "find a test whose verdict depends on what ran before it in the same process")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--shuffle SEED` first. Then, under `--dist loadgroup` (scripts/test.sh), tests go to
    the workers one by one, so a long file (test_audit.py: a dozen minutes of audits) no longer
    runs on one worker while the other idles, except the tests of a file holding a fixture set
    up once for the file (scope module, or session defined in the file: a vLLM server, a Ray
    cluster, a second dockerd), which stay together on one worker so that it is set up once.
    xdist reads the groups in the workers, in its own hook of this name, hence tryfirst. (Till
    2026-12-08 no group was ever given: the workers' options say `loadgroup`, not `dist`; the
    verified hub's 3-minute setup ran on both workers, and so did a vLLM server.)"""
    seed = config.getoption("shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    # in xdist's workers `dist` is "no" and `loadgroup` says it (xdist/remote.py)
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        path = item.nodeid.split("::")[0]
        for defs in item._fixtureinfo.name2fixturedefs.values():
            fixture = defs[-1]
            if fixture.scope in ("module", "package") or (
                    fixture.scope == "session" and fixture.baseid == path):
                item.add_marker(pytest.mark.xdist_group(path))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """In CI (CI=true) a skipped test is a failed one: CI provisions every service and tool,
    so a skip there means a test that silently did not run (`require` already fails in CI;
    this catches `pytest.skip`, `importorskip` and skip marks too). xfail stays as it is."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and IN_CI:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped while collected (a module-level `importorskip`)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and IN_CI:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"
