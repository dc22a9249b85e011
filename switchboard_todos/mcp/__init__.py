"""The queue's verbs as MCP tools, over streamable HTTP and stdio (`switchboard-todos[agents]`).

`server.build_server` makes the tools, each one call of the agent service layer;
`http.streamable_http` serves them at an HTTP path behind the agents' bearer tokens;
`manage.py todo_mcp --agent NAME` serves them over stdio. docs/agents.md shows both.
"""
