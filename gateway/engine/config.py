"""Engine configuration (CLI flags of `envhub engine` map 1:1 onto these fields)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

BUNDLED_MODEL = Path(__file__).resolve().parent / "tiny"
"""The tiny Qwen2-architecture model shipped in the wheel (random weights, Qwen2.5 tokenizer)."""


class EngineConfig(BaseModel):
    model: str = Field(str(BUNDLED_MODEL), description="local HF model folder (config + weights)")
    tokenizer: str | None = Field(None, description="tokenizer folder; default: the model folder")
    device: str = Field("auto", description="'auto' (cuda when present, else cpu), 'cpu', 'cuda:0'")
    dtype: str = Field(
        "auto", description="'auto' (float32 on cpu, bfloat16 on cuda), 'float32', 'bfloat16', "
        "'float16'")
    max_batch_size: int = Field(32, ge=1, description="most sequences decoded together")
    max_prefill_tokens: int = Field(
        8192, ge=1, description="padded prompt tokens admitted in one prefill (always >= 1 row)")
    max_model_len: int | None = Field(
        None, ge=1, description="prompt + completion limit; default: max_position_embeddings")
    weight_version: int = Field(0, description="version reported until the first weight update")
    seed: int = Field(0, description="seed of the generator used by requests without a seed")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: torch's")
    name: str | None = Field(None, description="served model name; default: the folder name")

    def served_name(self) -> str:
        return self.name or Path(self.model).name
