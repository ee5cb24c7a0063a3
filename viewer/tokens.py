"""Token ids -> the text each token adds, with the tokenizer the run used.

Decoding ids one at a time breaks characters that span tokens (byte-level BPE splits a CJK
character over two ids, each decoding to U+FFFD alone); here each id's text is the difference
between decoding a short window ending with it and the same window without it, and an id
whose bytes end mid-character gives its text to the id that completes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envhub.viewer.errors import ViewerError

_WINDOW = 6  # ids of left context per decode: enough for any UTF-8 character split


@dataclass(frozen=True)
class TokenPiece:
    id: int
    text: str  # what this id adds to the decoded text ("" when the next id completes it)
    special: bool  # a special/added token (<|im_start|>, ...)


class TokenDecoder:
    """Decodes ids with a Hugging Face `tokenizer.json` (the `tokenizers` library)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        file = folder / "tokenizer.json" if folder.is_dir() else folder
        if not file.is_file():
            raise ViewerError(f"no tokenizer.json in {folder}; pass --tokenizer with the "
                              "model folder the run used")
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as e:  # a corrupt or foreign file: say which one
            raise ViewerError(f"{file}: not a tokenizers tokenizer.json ({e})") from e
        self.folder = folder
        self._special = set(self._tok.get_added_tokens_decoder())
        self._vocab = self._tok.get_vocab_size(with_added_tokens=True)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False) if ids else ""

    def pieces(self, ids: list[int]) -> list[TokenPiece]:
        out: list[TokenPiece] = []
        start = 0  # first id whose text is not emitted yet
        for i, tid in enumerate(ids):
            if not 0 <= tid < self._vocab:  # ids from another tokenizer: say so, do not crash
                out.append(TokenPiece(tid, f"⟨{tid}?⟩", True))
                start = i + 1
                continue
            ctx = max(0, start - _WINDOW)
            before, text = self._decode(ids[ctx:start]), self._decode(ids[ctx:i + 1])
            if text.endswith("\ufffd") and i + 1 < len(ids) and i + 1 - start < _WINDOW:
                out.append(TokenPiece(tid, "", tid in self._special))  # completed by a later id
                continue
            new = text[len(before):] if text.startswith(before) else self._decode(ids[start:i + 1])
            out.append(TokenPiece(tid, new, tid in self._special))
            start = i + 1
        return out
