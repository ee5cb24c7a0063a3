"""The embedded inference engine: a transformers causal LM behind a continuous-batching thread.

    engine = Engine(EngineConfig(model="path/to/hf-folder"))
    result = await engine.generate(GenerateRequest(prompt_ids=[...], params=SamplingParams()))
    await engine.load_weights("ckpt/model.safetensors")   # version + 1, between batches

Any local Hugging Face causal-LM folder works; logprob semantics are in `sampling.py`.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from envhub.gateway.backends.base import GenerateRequest
from envhub.gateway.engine.admission import check_request
from envhub.gateway.engine.config import EngineConfig
from envhub.gateway.engine.guide import Guides
from envhub.gateway.errors import MissingExtra
from envhub.sdk.device import auto_dtype, resolve_device

try:
    import torch
except ImportError as exc:  # torch is the [engine] extra
    raise MissingExtra("the embedded inference engine", "engine") from exc

from envhub.gateway.engine.result import EngineResult
from envhub.gateway.engine.scheduler import Job, Scheduler, WeightSwap
from envhub.gateway.engine.speculative import DraftIndex
from envhub.gateway.engine.weights import check_weights, read_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _device(name: str) -> torch.device:
    return resolve_device(name)  # DeviceUnavailable (a ValueError) names the fix


def _dtype(name: str, device: torch.device) -> torch.dtype:
    name = auto_dtype(name, device.type)
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


class Engine:
    """Token ids in, token ids + logprobs out; requests are batched continuously."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.config = config = (config or EngineConfig()).model_copy(update=overrides)
        folder = Path(config.model)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no "
                                    "config.json); pass --model PATH to a local model folder")
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = _device(config.device)
        self.dtype = _dtype(config.dtype, self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        self.model.to(self.device).eval()  # type: ignore[arg-type]
        text_config = self.model.config.get_text_config()
        self.vocab_size: int = text_config.vocab_size
        self.max_model_len: int = (config.max_model_len
                                   or int(getattr(text_config, "max_position_embeddings", 4096)))
        self.eos_ids = _eos_ids(folder, self.tokenizer, GenerationConfig)
        self.name = config.served_name()
        self.model_path = str(folder)
        # The engine thread decodes (stop strings) while the server thread may encode text
        # prompts: a private copy avoids the fast tokenizer's "Already borrowed" error.
        self._guides = Guides(self.tokenizer, self.vocab_size, self.eos_ids)
        self._scheduler = Scheduler(
            self.model, self.device, self.eos_ids, copy.deepcopy(self.tokenizer),
            config.max_batch_size,
            config.max_prefill_tokens, config.weight_version, config.seed,
            drafts=_draft_index(config, text_config), max_draft=config.spec_max_draft)

    @property
    def weight_version(self) -> int:
        return self._scheduler.version

    def validate(self, request: GenerateRequest) -> None:
        """Raise BadRequest (with the fix) for a request the model cannot run."""
        check_request(request, self.vocab_size, self.max_model_len)

    async def generate(self, request: GenerateRequest, *, ignore_eos: bool = False
                       ) -> EngineResult:
        """Sample a completion. Cancelling the awaiting task drops the row from the batch."""
        self.validate(request)
        constraint = request.params.constraint
        matcher = None if constraint is None else await asyncio.to_thread(
            self._guides.matcher, constraint)
        future = self._scheduler.submit(Job(request, ignore_eos, matcher=matcher))
        return await asyncio.wrap_future(future)

    async def load_weights(self, path: str, version: int | None = None) -> int:
        """Swap in weights from a `.safetensors` file or HF folder once running sequences have
        finished; returns the new version (`version`, or the current one + 1)."""
        tensors = await asyncio.to_thread(read_weights, path)
        check_weights(tensors, self.model)
        return await asyncio.wrap_future(self._scheduler.swap(WeightSwap(tensors, version)))

    async def set_weight_version(self, version: int) -> None:
        """Relabel the weights loaded now (vLLM's /update_weight_version); rows already
        running keep the version they were admitted with."""
        self._scheduler.version = version

    def remember(self, group_id: str, ids: list[int]) -> None:
        """Seed group `group_id`'s draft index with a sequence (a reference solution, a
        finished sample from elsewhere); a no-op with speculative decoding off."""
        if self._scheduler.drafts is not None:
            self._scheduler.drafts.open(group_id, list(ids), live=False)

    def stats(self) -> dict[str, Any]:
        s = self._scheduler.stats
        return {"decode_steps": s.decode_steps, "prefills": s.prefills,
                "max_batch_size": s.max_batch_size,
                "batch_sizes": {str(k): v for k, v in sorted(s.batch_sizes.items())},
                "finished": s.finished, "generated_tokens": s.generated_tokens,
                "forwards": s.prefills + s.decode_steps, "spec_steps": s.spec_steps,
                "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
                "weight_version": self.weight_version, **self._scheduler.load()}

    def close(self) -> None:
        self._scheduler.close()


def _draft_index(config: EngineConfig, model_config: Any) -> DraftIndex | None:
    if config.speculative == "off":
        return None
    if _sliding(model_config):
        # transformers' sliding windows count cache columns, and a speculative step leaves
        # holes in them: the window would not be the model's
        raise ValueError(f"--speculative {config.speculative}: this model has sliding-window "
                         "attention, which speculative decoding here cannot keep exact; run "
                         "it with --speculative off")
    return DraftIndex(min_n=config.spec_min_match, max_n=max(config.spec_min_match, 5))


def _sliding(cfg: Any) -> bool:
    """The model has layers with a sliding attention window."""
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return "sliding_attention" in types
    return bool(getattr(cfg, "sliding_window", None)) and \
        getattr(cfg, "use_sliding_window", True) is not False


def _eos_ids(folder: Path, tokenizer: Any, generation_config_cls: Any) -> set[int]:
    """EOS ids from generation_config.json (Qwen lists <|im_end|> and <|endoftext|>), else the
    tokenizer's eos token."""
    ids: set[int] = set()
    if (folder / "generation_config.json").is_file():
        eos = generation_config_cls.from_pretrained(folder).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
