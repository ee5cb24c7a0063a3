"""LangChain (langchain-openai's ChatOpenAI, chat completions) running its tool loop with one
tool, then a final summary call over the same history without the tools (the pattern of
frameworks that end with a summary). Recorded by traces/record.py (OPENAI_BASE_URL set)."""

import os

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


llm = ChatOpenAI(model="x", base_url=os.environ["OPENAI_BASE_URL"], max_retries=0)
with_tools = llm.bind_tools([add])
history = [SystemMessage("You add numbers with the add tool."), HumanMessage("What is 2 + 3?")]
while True:
    reply = with_tools.invoke(history)
    history.append(reply)
    if not reply.tool_calls:
        break
    for call in reply.tool_calls:
        history.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
print(llm.invoke(history + [HumanMessage("Summarize what you did in one line.")]).content)
