"""Switchboard as the session store of agent frameworks, one module per framework,
each installed with its extra: `pip install "switchboard-client[openai-agents]"`,
`[adk]` or `[langgraph]`. Importing a module needs its framework installed."""
