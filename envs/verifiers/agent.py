"""The `vf` agent: a verifiers environment's own harness (its agent loop) as the rollout's
agent, its model client pointed at the rollout's gateway session. The default agent of `vf:`
environments; it runs nothing else."""

from __future__ import annotations

from envhub.envs.agents.base import AgentContext, AgentResult
from envhub.envs.errors import AgentError
from envhub.envs.verifiers.env import VerifiersEnv

# verifiers' stop conditions -> envhub's (anything else ended the harness on its own)
STOPS = {"agent_completed": "finished", "max_turns_reached": "max_turns",
         "agent_timeout": "time_limit", "rollout_timeout": "time_limit"}


class VerifiersAgent:
    name = "vf"

    async def run(self, ctx: AgentContext) -> AgentResult:
        if not isinstance(ctx.env, VerifiersEnv):
            raise AgentError("--agent vf runs a verifiers environment's own harness; this "
                             "environment is not one (give a vf: reference, or another agent)")
        session = (f"{ctx.gateway_url.rstrip('/')}/v1", str(ctx.session.api_key), ctx.model)
        summary = await ctx.env.rollout(ctx.task, ctx.run, session, ctx.limits)
        stops = [str(s) for s in summary.get("stop") or [] if s]
        stopped = STOPS.get(stops[-1], "exited") if stops else "exited"
        return AgentResult(stopped=stopped, turns=int(summary.get("calls") or 0),
                           info={"verifiers_stop": stops, "verifiers_ok": summary.get("ok"),
                                 "verifiers_errors": summary.get("errors") or []})
