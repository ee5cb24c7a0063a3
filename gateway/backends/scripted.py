"""A backend that answers with scripted texts, tokenized with the real tokenizer.

Product code for tests and demos (the `DeterministicModel` idea from mini-swe-agent): it lets a
test drive realistic multi-turn tool-calling conversations through the whole gateway without a
model that has learned to call tools. Logprobs are not a model's: each sampled token gets
-1.0. It records every prompt it received, like an engine would, for token-exactness checks.

From the command line (demos, audits, end-to-end checks of a black-box agent): `envhub gateway
--backend scripted --script FILE` or `envhub run --model scripted:FILE`, FILE a JSON list of
completion texts in the model's own format (tool calls as its chat template writes them, e.g.
Hermes `<tool_call>` blocks for the bundled model), answered once each, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.gateway.backends.base import (
    GenerateRequest,
    GenerateResult,
    WeightsNotLoadable,
    refuse_constraint,
)
from envhub.gateway.errors import BadRequest

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.fleet.upstreams import UpstreamSpec


_MARGIN = 64  # tokens encoded past a completion's budget (ScriptedBackend._encode_within)


class ScriptedBackend:
    name = "scripted"
    instance = "scripted"
    remote = False
    text_only = False

    def __init__(self, encode: Callable[[str], list[int]], script: list[str],
                 stop_token_id: int, weight_version: int = 0, cycle: bool = True,
                 record_prompts: bool = True):
        if not script:
            raise ValueError("the script needs at least one completion text")
        self._encode = encode
        self._script = script
        self._stop = stop_token_id
        self._next = 0
        self._cycle = cycle
        self.weight_version = weight_version
        self.record_prompts = record_prompts
        self.received: list[tuple[str, list[int]]] = []  # (request_id, prompt ids)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0)
        refuse_constraint(request, "scripted")
        if self._next >= len(self._script) and not self._cycle:
            raise BadRequest(f"the script is exhausted: all {len(self._script)} scripted "
                             "completions were answered")
        text = self._script[self._next % len(self._script)]
        self._next += 1
        if self.record_prompts:
            self.received.append((request.request_id, list(request.prompt_ids)))
        ids = self._encode_within(text, request.params.max_tokens) + [self._stop]
        finish = "stop"
        if len(ids) > request.params.max_tokens:
            ids, finish = ids[: request.params.max_tokens], "length"
        return GenerateResult(completion_ids=ids, logprobs=[-1.0] * len(ids),
                              finish_reason=finish, weight_version=self.weight_version,
                              instance=self.instance)

    def _encode_within(self, text: str, budget: int) -> list[int]:
        """The ids of `text`, or, where it holds more than `budget` tokens, those of a prefix
        that fills the budget: the whole of an audit's 7 MB scripted call costs the tokenizer
        ~10 s, and all but its first `budget` ids would be cut. What is kept decodes to a prefix
        of the text; the prefix runs _MARGIN tokens past the budget, so that the piece split by
        the cut (which the whole text's encoding may split otherwise) is not kept."""
        size = max(4096, 8 * budget)
        while size < len(text):
            ids = self._encode(text[:size])
            if len(ids) > budget + _MARGIN:
                return ids
            size *= 4
        return self._encode(text)

    @classmethod
    def from_config(cls, config: GatewayConfig, upstream: UpstreamSpec | None = None
                    ) -> ScriptedBackend:
        """The texts of `config.script` (a JSON list of strings), each answered once, in order,
        tokenized by the config's tokenizer; a call past the end gets a 400."""
        from envhub.gateway.render.chat_template import ChatRenderer

        renderer = ChatRenderer.from_pretrained(config.tokenizer_path(), config.chat_template)
        return cls(renderer.encode, read_script(config.script), renderer.stop_token_ids[0],
                   cycle=False, record_prompts=False)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        raise WeightsNotLoadable("the scripted backend replays texts: it has no weights to load")

    async def health(self) -> dict[str, Any]:
        return {"backend": self.name, "weight_version": self.weight_version}

    async def aclose(self) -> None:
        pass


def read_script(path: str | None) -> list[str]:
    """The completion texts of a script file (a JSON list of strings); ValueError with the fix."""
    if not path:
        raise ValueError("the scripted backend needs --script FILE: a JSON list of completion "
                         "texts, e.g. [\"hello\", \"<tool_call>...</tool_call>\"]")
    try:
        texts = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--script {path}: cannot read a JSON list of texts from it: {e}") from e
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"--script {path}: must hold a non-empty JSON list of strings (the "
                         "completion texts, in order)")
    return texts
