"""Constrained decoding for the embedded engine: llguidance token masks, one matcher per row.

The tokenizer wrapper costs about a second to build (6 s on this 2-core machine), so it is built
on the first constrained request and kept. Each row gets its own `LLMatcher`; before a row
samples, the tokens its grammar forbids get logit -inf, so the reported logprob is that of the
masked, renormalised distribution the token was drawn from (see gateway/structured.py for what
that means for training). A grammar that completes leaves only the end-of-sequence tokens.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from envhub.gateway.errors import BadRequest
from envhub.gateway.structured import Constraint


class Guides:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]):
        self._hf = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _llg(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError as e:
                    raise BadRequest("structured outputs need the 'llguidance' package: "
                                     "pip install 'envhub[engine]'") from e
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._vocab_size, eos_token=self._eos)
            return self._tokenizer

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher for one row; BadRequest when the constraint does not compile."""
        import llguidance

        tokenizer = self._llg()
        matcher = llguidance.LLMatcher(
            tokenizer, llguidance.LLMatcher.grammar_from_lark(constraint.lark()))
        if matcher.is_error():
            raise BadRequest(f"the structured-output constraint cannot be compiled: "
                             f"{matcher.get_error()}", param="structured_outputs")
        return Matcher(matcher, tokenizer.vocab_size)


class Matcher:
    """One row's grammar state."""

    def __init__(self, matcher: Any, vocab_size: int):
        import llguidance.torch as llt

        self._m = matcher
        self._llt = llt
        self._mask = llt.allocate_token_bitmask(1, vocab_size)

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [V] with every token the grammar forbids now set to -inf (a copy)."""
        self._llt.fill_next_token_bitmask(self._m, self._mask, 0)
        out = logits.unsqueeze(0).clone()
        self._llt.apply_token_bitmask_inplace(out, self._mask.to(out.device))
        return out[0]

    def advance(self, token: int) -> None:
        if not self._m.consume_token(token):  # the mask allowed it: cannot happen
            raise RuntimeError(f"grammar rejected token {token}: {self._m.get_error()}")
