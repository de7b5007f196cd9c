"""Agent programs Polar ships for harnesses that are libraries, not CLIs (run in their own venv, not imported).

:mod:`gateway.harnesses.openai_agents` copies ``openai_agents_agent.py`` into the session's ``HOME`` and runs it
with the ``openai-agents`` virtual environment's Python.
"""
