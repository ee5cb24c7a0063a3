"""Messages → prompt token ids through a model family's chat template (TITO rendering).

Two entry points:
- `render_prompt`: the whole conversation (a segment's first turn).
- `render_continuation`: only the messages appended after an assistant turn whose sampled ids we
  already hold. The previous ids are kept verbatim; this returns the ids to append, so the cost
  is proportional to the new messages, never to the history.

How the continuation is found without re-rendering history: the template is rendered for
`[anchor user, assistant(SENTINEL)] + new messages`; the text after SENTINEL is the assistant
turn's closing (e.g. `<|im_end|>\\n`) followed by the new messages and the generation prompt. The
part of the closing the model already sampled (its stop token) is dropped.

Control tokens come from the template only. Text a client passes as data (user, system, tool and
developer contents, tool schemas) may spell a control token (`<|im_start|>`, `<tool_call>`): a
web page or a command's output read by an agent easily does. Encoded as it stands, that text
would become the real token and forge a role or a tool call in the prompt the model sees. Such
spellings are swapped for markers before the template runs and encoded afterwards as the
plain characters they are (the tokenizer's pipeline without its added-token matching).
Assistant messages are the policy's own output and render as they are.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from envhub.gateway.errors import BadRequest
from envhub.gateway.render.toolcalls import PARSERS, ParsedCompletion, detect_format

SENTINEL = "\x00ENVHUB-SENTINEL\x00"
_ANCHOR_USER = {"role": "user", "content": "."}
_OWN_OUTPUT_ROLE = "assistant"  # the model's own messages: rendered as they are
_MARK, _MARK_END = "\ue000", "\ue001"  # private-use characters around a quoted spelling
_MARKER_RE = re.compile(_MARK + r"(\d+)" + _MARK_END)
_MARK_RE = re.compile(_MARK)  # all that is quoted in the model's own messages
TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class RenderedPrompt:
    ids: list[int]
    text: str


class ChatRenderer:
    """Renders with a HF tokenizer (`tokenizer.json`) and a jinja chat template."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None,
                 tool_format: str | None = None, stop_token_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError("the tokenizer has no chat_template; pass --chat-template FILE "
                             "(a jinja template) or use a model folder whose "
                             "tokenizer_config.json carries one")
        self.chat_template = template
        # transformers' sandboxed, cached compile; rendering it directly skips the per-call
        # copying apply_chat_template does (the same template, globals and variables)
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self._compiled = _compile_jinja_template(template)
        self._variables = {k: str(v) for k, v in tokenizer.special_tokens_map.items()
                           if isinstance(v, str) or hasattr(v, "content")}
        self.tool_format = tool_format or detect_format(template)
        self._parse = PARSERS[self.tool_format]
        self._fast = tokenizer.backend_tokenizer  # the Rust tokenizer: no Python overhead
        self.stop_token_ids = stop_token_ids if stop_token_ids is not None else \
            _default_stops(tokenizer)
        self._special_ids = set(tokenizer.all_special_ids) | set(self.stop_token_ids)
        # every added token's spelling, and the markers' first character (so data cannot
        # spell a marker either: its own is quoted like a control token)
        added = sorted({t.content for t in self._fast.get_added_tokens_decoder().values()
                        if t.content} | {_MARK}, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, added)))

    @classmethod
    def from_pretrained(cls, path: str | Path, chat_template: str | Path | None = None,
                        tool_format: str | None = None) -> ChatRenderer:
        """The renderer of a tokenizer folder, shared by every caller in the process while its
        files are unchanged: loading one costs ~1 s of CPU (transformers' tokenizer classes
        parsing a multi-MB tokenizer.json), paid before by each in-process gateway (an audit
        starts two per cheat). A renderer is read-only after it is made."""
        template = None if chat_template is None else str(chat_template)
        return _renderer(str(path), _files_stamp(path, chat_template), template, tool_format)

    @classmethod
    def _load(cls, path: str, chat_template: str | None, tool_format: str | None
              ) -> ChatRenderer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        template = None
        if chat_template is not None:
            p = Path(chat_template)
            if not p.exists() and (TEMPLATES / f"{chat_template}.jinja").exists():
                p = TEMPLATES / f"{chat_template}.jinja"
            template = p.read_text(encoding="utf-8")
        return cls(tok, template, tool_format)

    # -- rendering -----------------------------------------------------------------------------

    def _template(self, messages: list[dict], tools: list[dict] | None, gen: bool) -> str:
        try:
            return self._compiled.render(messages=messages, tools=tools,
                                         add_generation_prompt=gen, **self._variables)
        except Exception as e:  # template errors are the request's fault (e.g. role order)
            raise BadRequest(f"the chat template rejected these messages: {e}",
                             param="messages") from None

    def encode(self, text: str) -> list[int]:
        return self._fast.encode(text, add_special_tokens=False).ids

    def encode_plain(self, text: str) -> list[int]:
        """`text` as characters: the tokenizer's normalizer, pre-tokenizer and model without
        its added-token matching, so `<|im_start|>` here is the six tokens of its spelling."""
        fast = self._fast
        if fast.normalizer is not None:
            text = fast.normalizer.normalize_str(text)
        pieces = fast.pre_tokenizer.pre_tokenize_str(text) if fast.pre_tokenizer is not None \
            else [(text, (0, len(text)))]
        return [tok.id for piece, _ in pieces for tok in fast.model.tokenize(piece)]

    def _quote(self, value: Any, quoted: list[str], pattern: re.Pattern[str]) -> Any:
        """`value` with every match of `pattern` in its strings replaced by a marker (the
        match appended to `quoted`); the same object when there is none."""
        if isinstance(value, str):
            if pattern.search(value) is None:
                return value

            def mark(m: re.Match[str]) -> str:
                quoted.append(m.group(0))
                return f"{_MARK}{len(quoted) - 1}{_MARK_END}"

            return pattern.sub(mark, value)
        if isinstance(value, dict):
            out: dict[Any, Any] | None = None
            for k, v in value.items():
                q = self._quote(v, quoted, pattern)
                if q is not v:
                    out = out if out is not None else dict(value)
                    out[k] = q
            return value if out is None else out
        if isinstance(value, list):
            items = [self._quote(v, quoted, pattern) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def _render(self, messages: list[dict], tools: list[dict] | None
                ) -> tuple[str, list[str]]:
        """The template's text with data's control-token spellings as markers, and those
        spellings in marker order."""
        quoted: list[str] = []
        data = self._added_re
        messages = [self._quote(m, quoted, _MARK_RE if m.get("role") == _OWN_OUTPUT_ROLE
                                else data) for m in messages]
        return self._template(messages, self._quote(tools, quoted, data), gen=True), quoted

    def _encode_rendered(self, text: str, quoted: list[str]) -> RenderedPrompt:
        if not quoted:
            return RenderedPrompt(self.encode(text), text)
        ids: list[int] = []
        parts: list[str] = []
        pos = 0
        for m in _MARKER_RE.finditer(text):
            literal = quoted[int(m.group(1))]
            ids += self.encode(text[pos:m.start()]) + self.encode_plain(literal)
            parts += [text[pos:m.start()], literal]
            pos = m.end()
        ids += self.encode(text[pos:])
        parts.append(text[pos:])
        return RenderedPrompt(ids, "".join(parts))

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self._fast.decode(ids, skip_special_tokens=skip_special)

    def render_prompt(self, messages: list[dict], tools: list[dict] | None) -> RenderedPrompt:
        return self._encode_rendered(*self._render(messages, tools))

    def render_continuation(self, completion_ids: list[int], new_messages: list[dict],
                            tools: list[dict] | None) -> RenderedPrompt:
        """Ids to append after a sampled assistant turn for `new_messages` (+ generation prompt).

        `tools` is passed so templates that branch on it render the tail as they would in full.
        """
        anchor = [_ANCHOR_USER, {"role": "assistant", "content": SENTINEL}]
        text, quoted = self._render(anchor + new_messages, tools)
        cut = text.find(SENTINEL)
        if cut < 0:
            raise BadRequest("the chat template dropped the assistant message's content; "
                             "incremental rendering needs a template that renders it",
                             param="messages")
        tail = text[cut + len(SENTINEL):]
        # Drop the part of the closing the model sampled itself (its stop token), if it did.
        if completion_ids and completion_ids[-1] in self._special_ids:
            sampled_end = self.decode(completion_ids[-1:])
            if tail.startswith(sampled_end):
                tail = tail[len(sampled_end):]
        return self._encode_rendered(tail, quoted)

    # -- parsing -------------------------------------------------------------------------------

    def completion_text(self, completion_ids: list[int]) -> str:
        """The sampled text as parsed: without the final stop token, with tool-call markup
        (some families make it special tokens) but no other special tokens."""
        ids = completion_ids
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        text = self.decode(ids)
        for tok in self._strip_tokens:
            text = text.replace(tok, "")
        return text

    def parse_completion(self, completion_ids: list[int]) -> ParsedCompletion:
        return self._parse(self.completion_text(completion_ids))

    def parse_text(self, text: str) -> ParsedCompletion:
        """Tool calls from text-only backends (hosted models)."""
        return self._parse(text)

    @cached_property
    def _strip_tokens(self) -> list[str]:
        keep = ("tool", "think")
        return [t for t in self.tokenizer.all_special_tokens if not any(k in t for k in keep)]


def _default_stops(tokenizer: Any) -> list[int]:
    """EOS ids: the tokenizer's eos plus generation_config.json's eos_token_id list, if any."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    path = Path(getattr(tokenizer, "name_or_path", "") or "") / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text()).get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos] if eos is not None else []:
            if i not in ids:
                ids.append(i)
    return ids


@functools.lru_cache(maxsize=4)
def _renderer(path: str, stamp: tuple[tuple[str, int, int], ...], chat_template: str | None,
              tool_format: str | None) -> ChatRenderer:
    return ChatRenderer._load(path, chat_template, tool_format)


def _files_stamp(*paths: str | Path | None) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime, size) of each file of these folders and files: a cached renderer is
    reloaded once a tokenizer file or the template is rewritten (a folder also holds the
    weights, whose rewrite reloads it too: rare, and correct)."""
    stamp: list[tuple[str, int, int]] = []
    for p in paths:
        if p is None:
            continue
        p = Path(p)
        for f in sorted(p.iterdir()) if p.is_dir() else [p] if p.is_file() else []:
            try:
                st = f.stat()
            except OSError:
                continue
            stamp.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(stamp)
