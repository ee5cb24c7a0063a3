"""When a sequence is finished: EOS, stop token ids, stop strings, max_tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Decoder(Protocol):
    # A flat id list decodes to one str; the list[str] is transformers' batch case, in its
    # signature too.
    def decode(self, ids: list[int], /, skip_special_tokens: bool = ...) -> str | list[str]: ...


@dataclass
class Finish:
    reason: str  # "stop" | "length"
    stop_reason: int | str | None = None  # the stop id or string that matched (None for EOS)


class StopRule:
    """Checks one sequence after each sampled token.

    The sampled tokens are kept up to and including the one that completes a stop (the EOS id,
    a stop id, or the last token of a stop string): the ids record what was sampled. A stop
    string is searched in the decoded text of only the last few tokens (enough to span it:
    a token covers at least one byte, a character at most four), so each check is O(1).
    """

    def __init__(self, max_tokens: int, eos_ids: set[int], stop_ids: list[int],
                 stop_strings: list[str], decoder: Decoder | None, ignore_eos: bool = False):
        self.max_tokens = max_tokens
        self.eos_ids = set() if ignore_eos else set(eos_ids)
        self.stop_ids = set(stop_ids)
        self.stop_strings = [s for s in stop_strings if s]
        self.decoder = decoder
        self.window = 4 * max((len(s) for s in self.stop_strings), default=0) + 4

    def check(self, ids: list[int]) -> Finish | None:
        last = ids[-1]
        if last in self.stop_ids:
            return Finish("stop", last)
        if last in self.eos_ids:
            return Finish("stop", None)
        if self.stop_strings and self.decoder is not None:
            tail = self.decoder.decode(ids[-self.window:], skip_special_tokens=False)
            for s in self.stop_strings:
                if s in tail:
                    return Finish("stop", s)
        if len(ids) >= self.max_tokens:
            return Finish("length")
        return None
