"""`envhub audit ENV`: generic cheating agents against an environment, beside a no-op and the
oracle, and a table of which beat the no-op or escaped into env_failure.

Modules: battery (the cheats: shell scripts in cheats/ for envs with a shell, hostile tool
calls for tool-only envs), audit (runs them through the runner, one run per cheat), report
(rows, verdicts, the table).
"""

from envhub.orchestrator.audit.audit import AuditConfig, AuditReport, audit
from envhub.orchestrator.audit.battery import NOOP, ORACLE, Cheat, command_battery, scripted_battery
from envhub.orchestrator.audit.report import AuditRow, explain, flagged, judge, render

__all__ = ["NOOP", "ORACLE", "AuditConfig", "AuditReport", "AuditRow", "Cheat", "audit",
           "command_battery", "explain", "flagged", "judge", "render", "scripted_battery"]
