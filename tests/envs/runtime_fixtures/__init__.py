"""Fixtures for the environment-runtime tests: a CLI agent script and a crash-injecting env."""
