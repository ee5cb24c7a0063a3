"""A rollout run away from the driver (a Ray node, a task service) holds only its session's
own key, and the gateway takes process signals (tool errors: process rewards) from the
runner's admin key alone. The node holds the signals its runner raises and the driver posts
them; posting one from the node crashed the rollout as `agent_error` (a 403 in the agent
phase, CI's `test_train_runs_its_rollouts_as_ray_tasks` whenever the tiny model misused a
tool). Against a real gateway with an admin key."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from envhub.orchestrator.groups.attached import HeldSignals, post_held_signals
from envhub.orchestrator.groups.plan import RolloutKey
from envhub.orchestrator.groups.rollout import PendingRollout
from envhub.sdk import AsyncSession
from envhub.sdk.session import GatewayError
from tests.support import gateway_in_thread, scripted_backend, trajectory_json

ADMIN = "held-signals-admin"


def test_the_node_holds_its_signals_and_the_driver_posts_them(tmp_path) -> None:
    gw = gateway_in_thread(tmp_path, scripted_backend(["ok"]), admin_key=ADMIN)
    try:
        asyncio.run(_held_and_posted(gw))
    finally:
        gw.close()


async def _held_and_posted(gw) -> None:
    driver = await AsyncSession.open(gw.url, admin_key=ADMIN)
    http = httpx.AsyncClient()  # the node's: it uses the driver's session, never closes it
    node = HeldSignals(gw.url, driver.id, driver.api_key, http)
    plain = AsyncSession(gw.url, driver.id, driver.api_key, http)  # what the node posted with
    try:
        with pytest.raises(GatewayError) as refused:
            await plain.signal("tool_error", seq=0)
        assert refused.value.status == 403  # the crash the node's rollout died of

        await node.signal("tool_error", seq=0, info={"tool": "calc", "error": "bad args"})
        await node.signal("malformed_tool_call", value=0.5)
        assert [s.name for s in node.held] == ["tool_error", "malformed_tool_call"]
        assert trajectory_json(gw, driver.id, ADMIN)["signals"] == []  # nothing posted yet

        p = PendingRollout(RolloutKey("arith", "t0", 0), "g0", session=driver)
        await post_held_signals(p, node.held)
        assert p.status == "done", p.reason
        posted = trajectory_json(gw, driver.id, ADMIN)["signals"]
        assert [(s["name"], s["seq"], s["value"]) for s in posted] == [
            ("tool_error", 0, 1.0), ("malformed_tool_call", None, 0.5)]
        assert posted[0]["info"] == {"tool": "calc", "error": "bad args"}
    finally:
        await http.aclose()
        await driver.aclose()


def test_signals_the_gateway_will_not_take_fail_the_rollout_as_env_failure(tmp_path) -> None:
    """The gateway gone when the driver posts: its process reward would be wrong, so the
    rollout is an env_failure (not trained on), never scored without them."""
    gw = gateway_in_thread(tmp_path, scripted_backend(["ok"]), admin_key=ADMIN)

    async def go() -> PendingRollout:
        driver = await AsyncSession.open(gw.url, admin_key=ADMIN)
        async with httpx.AsyncClient() as http:
            node = HeldSignals(gw.url, driver.id, driver.api_key, http)
            await node.signal("tool_error", seq=0)
        gw.close()
        p = PendingRollout(RolloutKey("arith", "t0", 0), "g0", session=driver)
        return await post_held_signals(p, node.held)

    try:
        p = asyncio.run(go())
    finally:
        gw.close()
    assert p.status == "env_failure" and "process signals" in (p.reason or ""), p.reason
