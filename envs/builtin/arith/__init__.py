"""Built-in `arith` environment (see envhub.toml)."""
