"""Adapters that make agents built with other frameworks crash-safe on any World.

One module per framework, each behind its optional extra (``world-core[<extra>]``). This
package imports none of them, so importing it needs no framework installed:

- ``world_core.integrations.pydantic_ai``: pydantic-ai (extra ``pydantic-ai``)
- ``world_core.integrations.langgraph``: LangGraph (extra ``langgraph``)
- ``world_core.integrations.openai_agents``: OpenAI Agents SDK (extra ``openai-agents``)

Adapters build on the journal's public API and the World's SPI only.
"""
