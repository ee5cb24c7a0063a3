"""Agent-side SDK and wire types. Importable without torch or the server's dependencies."""

from envhub.sdk.session import AsyncSession, GatewayError, Session
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
    "AsyncSession", "GatewayError", "Session",
    "CMAction", "RewardEvent", "Segment", "SessionInfo", "SessionStatus", "Signal", "ToolCall",
    "Trajectory", "Turn",
]
