"""Built-in `slides` environment (see envhub.toml)."""
