"""`envhub view` options (flags map 1:1 onto these fields)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from envhub.gateway.config import is_loopback


class ViewConfig(BaseModel):
    source: str = Field(description="a run folder (runs/<run_id>), a folder of them (runs/), or "
                                    "a pool URL (sqlite:///FILE, postgresql://...)")
    host: str = Field("127.0.0.1", description="address to listen on; the viewer shows every "
                                               "recorded prompt, so loopback by default")
    port: int = Field(8600, ge=0, le=65535, description="port; 0 picks a free one")
    tokenizer: Path | None = Field(None, description="tokenizer folder for decoding ids "
                                                     "(default: the run's --model, else the "
                                                     "bundled model)")
    allow_remote: bool = Field(False, description="allow a non-loopback --host (no auth: "
                                                  "anyone who reaches it reads every session)")

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> ViewConfig:
        if not is_loopback(self.host) and not self.allow_remote:
            raise ValueError(f"--host {self.host}: the viewer has no authentication and shows "
                             "every prompt; keep 127.0.0.1 (e.g. reach it through `ssh -L`), or "
                             "add --allow-remote")
        return self
