"""`envhub view`: a local web viewer over run folders and pools.

Runs and sessions with rewards and status (filtered by run, env, task, status, reward), and per
session the token-level trajectory: prompt vs sampled tokens decoded with the run's tokenizer,
logprobs, weight version per turn, context-management actions at segment breaks, tool calls,
signals, reward components and env_failure reasons. Reads the pool through the gateway's
public pool reader (gateway/pool), like the trainer; nothing else of the gateway.
"""

from envhub.viewer.errors import ViewerError

__all__ = ["ViewerError"]
