"""Adapters that put the context-assembly service behind agent runtimes' own extension points.

- :mod:`.langchain`: ``ContextAssemblyMiddleware``, a LangChain v1 ``AgentMiddleware``
  (``pip install 'context-assembly-client[langchain]'``).
- :mod:`.pydantic_ai`: ``ContextAssemblyCapability``, a Pydantic AI capability
  (``[pydantic-ai]``).
- :mod:`.openai_agents`: ``ContextAssemblyInputFilter`` for the OpenAI Agents SDK, with its
  ``Model`` wrapper ``ContextAssemblyModel`` (``[openai-agents]``); the SDK's items and tools
  map to and from the neutral shape in :mod:`.openai_agents_items`.

Each adapter is a thin mapping between its runtime's types and the service's neutral shape around
the one loop in :mod:`.preparer` (request for the runtime's model, prepare under a deadline,
frame in the provider's terms, output limit, bounded background usage reports, fail open), which
draws on :mod:`.frames` (the call in neutral form, the frame aligned with it),
:mod:`.call_settings` (cache plan, native compaction, output limit), :mod:`.usage_reports` and
:mod:`.outcomes` (counters, failures told apart).
Import the runtime's module itself; this package imports no runtime.
"""
