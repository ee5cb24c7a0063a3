"""The OpenAI Agents SDK (openai-agents, Responses API) with one function tool, run twice in
one session: the second run resends the first run's items (`to_input_list()`) and asks more.
Recorded by traces/record.py (OPENAI_BASE_URL, OPENAI_API_KEY set)."""

from agents import Agent, Runner, function_tool, set_tracing_disabled


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


set_tracing_disabled(True)
agent = Agent(name="calc", instructions="Use the add tool for sums.", tools=[add])
first = Runner.run_sync(agent, "What is 2 + 3?")
print(first.final_output)
second = Runner.run_sync(agent, first.to_input_list() + [
    {"role": "user", "content": "And 5 + 4?"}])
print(second.final_output)
