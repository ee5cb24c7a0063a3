"""Agent-side SDK and wire types. Importable without torch or the server's dependencies."""

from envhub.sdk.types import (
    CMAction,
    RewardEvent,
    Segment,
    SessionInfo,
    SessionStatus,
    Signal,
    ToolCall,
    Trajectory,
    Turn,
)

__all__ = [
    "CMAction", "RewardEvent", "Segment", "SessionInfo", "SessionStatus", "Signal", "ToolCall",
    "Trajectory", "Turn",
]
