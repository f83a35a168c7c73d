"""Sandboxes as agent frameworks ask for them (docs/integrations.md): `deepagents` (LangChain
deepagents' `BaseSandbox`) and `openai_agents` (the OpenAI Agents SDK's sandbox client).

Each module imports its framework, so each needs its extra (`pip install
'sandboxer[deepagents]'`, `'sandboxer[openai-agents]'`); this package imports neither, and
nothing else in the library imports this package."""
