"""`python -m envhub.envs.sandbox.e2b_fake [--host H] [--port P] [--api-key K]`."""

from __future__ import annotations

import argparse

import uvicorn

from envhub.envs.sandbox.e2b_fake import FakeE2B


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a fake E2B API + envd for the e2b SDK.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--api-key", default=None, help="require this X-API-Key (default: any)")
    args = parser.parse_args()
    print(f"export E2B_API_URL=http://{args.host}:{args.port} "
          f"E2B_SANDBOX_URL=http://{args.host}:{args.port} E2B_HTTP_VERSION=1.1 "
          f"E2B_API_KEY={args.api_key or 'anything'}", flush=True)
    uvicorn.run(FakeE2B(api_key=args.api_key), host=args.host, port=args.port,
                log_level="warning", loop="asyncio")  # commands: serve.py's `loop`


if __name__ == "__main__":
    main()
