"""Names that vulture (`make lint`) cannot see used, because a framework or serialisation uses
them rather than a call in this repository.

Vulture matches by name, so each line names one attribute (the ``_.name`` form its
``--make-whitelist`` writes) and says who uses it. Only framework entry points and serialised
fields belong here: a name nothing uses is removed, not listed. FastAPI routes, pydantic
validators and serialisers, and MCP servers' resources and tools are left out by their
decorators (``ignore_decorators`` in pyproject.toml's ``[tool.vulture]``).
"""

from typing import Any

_: Any = None  # never run: vulture reads the names

# FastAPI and Starlette
_.openapi_schema  # FastAPI's cached OpenAPI document, reset per auth mode (api/app.py)
_.__signature__  # read by FastAPI's inspection of an endpoint (api/bodies.py)
_.webhook_timestamp  # header parameters of the documented webhooks (api/webhooks.py)
_.webhook_signature
_.app_from_env  # uvicorn's factory, named by string (server.py)

# uvicorn's HTTP protocol and server, overridden or set (http_limits.py, examples)
_.disconnected
_.send_400_response
_.process
_.should_exit

# pydantic-settings: the hook and its signature (config.py)
_.settings_customise_sources
_.dotenv_settings
_.file_secret_settings

# The async context manager protocol's arguments (contributors/client.py)
_.exc_type
_.tb

# Fields of response, record and webhook models: serialised into the answers, the OpenAPI
# document and the stored records, not read back by name
_.read_from
_.fallback_context_window
_.source_token_limit
_.folded_from
_.connector_accounts
_.task_id
_.principal
_.identities
_.input_format
_.latest_user_turn
_.placement
_.checked_at
_.currency
_.pending_sources
_.record_version

# Agent runtimes' model interfaces, implemented by the examples and benchmarks
_.bind_tools  # LangChain chat models
_.get_response  # OpenAI Agents SDK Model
_.stream_response
