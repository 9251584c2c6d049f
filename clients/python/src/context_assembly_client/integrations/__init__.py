"""Adapters that put the context-assembly service behind agent runtimes' own extension points.

- :mod:`.langchain`: ``ContextAssemblyMiddleware``, a LangChain v1 ``AgentMiddleware``
  (``pip install 'context-assembly-client[langchain]'``).
- :mod:`.pydantic_ai`: ``ContextAssemblyCapability``, a Pydantic AI capability
  (``[pydantic-ai]``).
- :mod:`.openai_agents`: ``ContextAssemblyInputFilter`` and ``ContextAssemblyHooks`` for the OpenAI
  Agents SDK (``[openai-agents]``).

Each adapter is a thin mapping between its runtime's types and the service's neutral shape around
the one loop in :mod:`.preparer` (request, prepare under a deadline, frame, background usage
report, fail open). Import the runtime's module itself; this package imports no runtime.
"""
