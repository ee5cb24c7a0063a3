"""Engine configuration (CLI flags of `envhub engine` map 1:1 onto these fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from envhub.sdk.device import DEVICES, DTYPES, check_device, check_dtype

BUNDLED_MODEL = Path(__file__).resolve().parent / "tiny"
"""The tiny Qwen2-architecture model shipped in the wheel (random weights, Qwen2.5 tokenizer)."""


class EngineConfig(BaseModel):
    model: str = Field(str(BUNDLED_MODEL), description="local HF model folder (config + weights)")
    tokenizer: str | None = Field(None, description="tokenizer folder; default: the model folder")
    device: str = Field("auto", description=f"where the model runs: {DEVICES} (auto: cuda "
                        "when present, else cpu)")
    dtype: str = Field("auto", description=f"the weights' and the compute's dtype: "
                       f"{', '.join(DTYPES)} (auto: bfloat16 on cuda, float32 elsewhere)")
    max_batch_size: int = Field(32, ge=1, description="most sequences decoded together")
    max_prefill_tokens: int = Field(
        8192, ge=1, description="padded prompt tokens admitted in one prefill (always >= 1 row)")
    max_model_len: int | None = Field(
        None, ge=1, description="prompt + completion limit; default: max_position_embeddings")
    weight_version: int = Field(0, description="version reported until the first weight update")
    seed: int = Field(0, description="seed of the generator used by requests without a seed")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: torch's")
    name: str | None = Field(None, description="served model name; default: the folder name")
    speculative: Literal["off", "group"] = Field(
        "off", description="'group': speculative decoding drafted from the other samples of a "
        "request's group (Seer); exact, the sampled distribution and logprobs are unchanged, "
        "but a seeded request's draws then depend on its group's other samples")
    spec_max_draft: int = Field(8, ge=1, description="speculative: most tokens drafted per row "
                                "and step (the draft length adapts to acceptance up to this)")
    spec_min_match: int = Field(2, ge=1, description="speculative: shortest n-gram (tokens) "
                                "that must match the group's text before drafting")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        return check_dtype(v)

    def served_name(self) -> str:
        return self.name or Path(self.model).name
