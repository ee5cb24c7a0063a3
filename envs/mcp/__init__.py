"""MCP (Model Context Protocol) both ways, with the official `mcp` SDK: the MCP servers an
environment declares, used by its agents (client.py), and an environment's tools served to a
command agent inside its sandbox (server.py)."""
