"""`python -m envhub.gateway.fakes sglang|openai [--port N] [--length N] [--token-delay S]`."""

from __future__ import annotations

import argparse

import uvicorn

from envhub.gateway.fakes.openai_chat import FakeChat, openai_chat_app
from envhub.gateway.fakes.sglang import FakeSGLang, sglang_app


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m envhub.gateway.fakes",
                                 description="serve a fake engine on loopback")
    ap.add_argument("kind", choices=["sglang", "openai"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--length", type=int, default=8, help="sglang: completion length")
    ap.add_argument("--token-delay", type=float, default=0.0, help="sglang: s per token")
    ap.add_argument("--model", default="gpt-fake", help="openai: model name")
    args = ap.parse_args()
    app = sglang_app(FakeSGLang(args.length, args.token_delay)) if args.kind == "sglang" \
        else openai_chat_app(FakeChat(args.model))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
