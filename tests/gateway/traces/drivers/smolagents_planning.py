"""smolagents' ToolCallingAgent (chat completions through OpenAIServerModel) with one function
tool and planning every 2 steps: an initial plan asked alone (a user message, no system prompt,
no tools), action steps that carry the plan in the agent's memory, and at step 3 an updated
plan asked under a planning system prompt of its own without tools, over the memory so far.
Recorded by traces/record.py (OPENAI_BASE_URL, OPENAI_API_KEY set). smolagents asks for
`tool_choice: "required"`, which the scripted engine cannot enforce (a 400): the model is told
`tool_choice: "auto"` instead (a model kwarg, as a user would), nothing else changes."""

import os

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


model = OpenAIServerModel(model_id="x", api_base=os.environ["OPENAI_BASE_URL"],
                          api_key=os.environ["OPENAI_API_KEY"], tool_choice="auto")
agent = ToolCallingAgent(tools=[add], model=model, planning_interval=2, max_steps=5,
                         verbosity_level=0)
print(agent.run("What is 2 + 3, plus 4?"))
