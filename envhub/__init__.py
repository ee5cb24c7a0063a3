"""envhub: infrastructure for training LLM agents with reinforcement learning."""

__version__ = "0.1.0"
__all__ = ["__version__"]
