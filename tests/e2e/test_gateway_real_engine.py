"""What a user does: `envhub engine` (the bundled model) behind `envhub gateway`, an agent
using the official openai client, the token-level record read back over HTTP. The prompts are
checked at the engine (its own log of received ids), not at the gateway."""

from __future__ import annotations

import httpx
import openai
import pytest

from envhub.gateway.engine.process import EngineProcess
from tests.support import free_port, start_gateway


@pytest.mark.slow
def test_multi_turn_record_matches_what_the_engine_received(tmp_path):
    with EngineProcess(["--threads", "1"], log_path=tmp_path / "engine.log") as engine:
        port = free_port()
        gw = start_gateway(f"sqlite:///{tmp_path}/pool.db", port,
                           ["--upstream", f"vllm={engine.url}"], backend="vllm")
        try:
            url = f"http://127.0.0.1:{port}"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="run-42", max_retries=0)
            msgs = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Say something."}]
            for k in range(4):
                resp = client.chat.completions.create(model="default", messages=msgs,
                                                      max_tokens=12, seed=k)
                msgs += [resp.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"And then? ({k})"}]
            traj = httpx.get(f"{url}/sessions/run-42/trajectory").json()
            received = httpx.get(f"{engine.url}/debug/requests", params={"limit": 50}).json()
        finally:
            gw.kill()
            gw.wait()
    turns = traj["turns"]
    assert len(turns) == 4 and len(traj["segments"]) == 1
    for k in range(1, 4):
        assert turns[k]["prompt_ids"] == (turns[k - 1]["prompt_ids"] + turns[k - 1][
            "completion_ids"] + turns[k]["prompt_delta_ids"])
    got = [r["prompt_token_ids"] for r in received["requests"]]
    assert got[-4:] == [t["prompt_ids"] for t in turns]
    # real rollout logprobs and the engine's weight version are on every turn
    assert all(lp <= 0 for t in turns for lp in t["completion_logprobs"])
    assert all(t["weight_version"] == 0 for t in turns)
