"""Built-in `search` environment (see envhub.toml)."""
