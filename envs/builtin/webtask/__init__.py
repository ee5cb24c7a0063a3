"""Built-in `webtask` environment (see envhub.toml)."""
