"""`oracle`: applies the task's gold solution, validating that the environment's tasks are
solvable and its verifier accepts a correct answer. Makes no model calls."""

from __future__ import annotations

from envhub.envs.agents.base import AgentContext, AgentResult


class OracleAgent:
    name = "oracle"

    async def run(self, ctx: AgentContext) -> AgentResult:
        await ctx.env.solve(ctx.task, ctx.sandbox, ctx.run)
        return AgentResult(stopped="solved")
