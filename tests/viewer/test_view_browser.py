"""`envhub view` in a real Chromium over real recorded runs: runs, filters, a session's
token-level trajectory (sampled tokens, a context-management action, the reward breakdown)
and an env_failure's reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from envhub.gateway.config import BUNDLED_MODEL
from envhub.gateway.pool.store import Store
from envhub.gateway.pool.trajectory import build_trajectory
from tests.chromium import chromium_page, screenshot
from tests.viewer.conftest import Runs, Viewer

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # slow: records a run with the real model


def session_with_cm_action(run: Path) -> tuple[str, object]:
    """(session id, trajectory) of a recorded session with a CM action, read from the pool."""
    store = Store(f"sqlite:///{run / 'pool.db'}")
    try:
        for row in store.list_sessions():
            traj = build_trajectory(store, row)
            if traj.cm_actions:
                return row["id"], traj
    finally:
        store.close()
    raise AssertionError("the recorded run has no CM action: raise max_turns in conftest")


def test_open_a_run_filter_and_read_a_session(recorded_runs: Runs, viewer: Viewer,
                                              tmp_path: Path) -> None:
    sid, traj = session_with_cm_action(recorded_runs.arith)
    with chromium_page() as page:
        page.goto(viewer.url + "/")
        assert page.locator("#runs tbody tr").count() == 2
        screenshot(page, tmp_path, "1-runs")

        # filter: env failures of crashy, with their reasons
        page.goto(viewer.url + "/sessions")
        assert page.locator("#sessions tbody tr").count() == 4
        page.select_option("select[name=env]", "crashy")
        page.select_option("select[name=status]", "env_failure")
        page.click("#filters button[type=submit]")
        rows = page.locator("#sessions tbody tr")
        assert rows.count() == 1
        assert "SandboxError" in rows.locator(".reason").inner_text()
        screenshot(page, tmp_path, "2-filtered-env-failures")
        rows.locator("a.session").click()
        assert page.locator("#status").inner_text() == "env_failure"
        assert "container exited with code 137" in page.locator("#reason").inner_text()

        # filter: arith sessions by task text and reward range, then open the one with a CM
        page.goto(viewer.url + "/sessions")
        page.select_option("select[name=env]", "arith")
        page.fill("input[name=task]", traj.session.task_id[-4:])
        page.fill("input[name=min_reward]", "-10")
        page.fill("input[name=max_reward]", "10")
        page.click("#filters button[type=submit]")
        assert page.locator("#sessions tbody tr").count() == 2
        assert set(page.locator("#sessions .env").all_inner_texts()) == {"arith"}
        page.fill("input[name=min_reward]", "5")  # above anything arith pays
        page.click("#filters button[type=submit]")
        assert page.locator("#sessions tbody tr").count() == 0
        page.fill("input[name=min_reward]", "")
        page.click("#filters button[type=submit]")
        screenshot(page, tmp_path, "3-filtered-arith")
        page.click(f"a.session:has-text('{sid}')")

        # the session: sampled tokens, decoded with the run's tokenizer, with logprobs
        assert sid in page.locator("h1").inner_text()
        sampled = page.locator(".turn .tokens.sampled span.s")
        assert sampled.count() == sum(len(t.completion_ids) for t in traj.turns)
        first = traj.turns[0]
        tok = Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))
        shown = "".join(page.locator("#turn-0 .tokens.sampled span").all_text_contents())
        assert shown == tok.decode(first.completion_ids, skip_special_tokens=False)
        hover = sampled.first.get_attribute("title")
        assert f"id {first.completion_ids[0]}" in hover
        assert f"logprob {first.completion_logprobs[0]:.3f}" in hover and "weights v0" in hover
        assert page.locator("#turn-0 .wv").inner_text() == "weights v0"
        prompt = "".join(page.locator("#turn-0 .prompt span.p").all_text_contents())
        assert prompt == tok.decode(first.prompt_delta_ids, skip_special_tokens=False)

        # a CM action at the segment break it caused
        action = traj.cm_actions[0]
        cm = page.locator(".segment-break .cm").first
        assert f"context management: {action.kind}" in cm.inner_text()
        assert f"tokens {action.tokens_before} → {action.tokens_after}" in cm.inner_text()
        assert page.locator(".segment-break").count() == len(traj.segments) - 1
        cm.scroll_into_view_if_needed()
        screenshot(page, tmp_path, "4-session-cm-action", full_page=False)

        # the reward breakdown: components and every reward event
        head = page.locator("#rewards table.components th").all_inner_texts()
        assert {"outcome", "process", "time", "total"} <= set(head)
        events = page.locator("#reward-events tbody").inner_text()
        assert "verifier" in events and "completion_time" in events
        assert page.locator(".tool-call").count() == sum(len(t.tool_calls) for t in traj.turns)
        page.locator("#rewards").scroll_into_view_if_needed()
        screenshot(page, tmp_path, "5-session")
