"""Python clients of the context-assembly service.

- :class:`Client` / :class:`AsyncClient`: every HTTP operation, typed models in and out
  (:mod:`context_assembly_client.types`), one exception per problem code.
- :func:`usage_from_openai`, :func:`usage_from_anthropic`, :func:`usage_from_gemini`: the
  ``(provider, usage)`` pair for ``report_usage`` from a provider SDK's response.
- :func:`make_contributor_app` (in :mod:`context_assembly_client.contributor`): a contributor
  webhook as an ASGI app around one function, with signature and deadline handling.
- :mod:`context_assembly_client.testing` (imported on its own): a scripted contributor double
  and a helper that serves the service or an app in a process of its own, for tests.
"""

from context_assembly_client import types
from context_assembly_client._client import AsyncClient, Client
from context_assembly_client._constants import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from context_assembly_client._exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AssemblyOverflowError,
    AssemblyTimeoutError,
    AuthenticationError,
    BadRequestError,
    ContextAssemblyError,
    ContextOverflowError,
    ContributorFailedError,
    ContributorUrlRejectedError,
    InternalServerError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    RecordTooNewError,
    RequestHeadTooLargeError,
    RequestTimeoutError,
    StaleError,
    StoreUnavailableError,
    make_status_error,
)
from context_assembly_client._types import NOT_GIVEN, NotGiven, Timeout
from context_assembly_client.contributor import make_contributor_app
from context_assembly_client.provider_usage import (
    usage_from_anthropic,
    usage_from_gemini,
    usage_from_openai,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "APIConnectionError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AssemblyOverflowError",
    "AssemblyTimeoutError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ContextAssemblyError",
    "ContextOverflowError",
    "ContributorFailedError",
    "ContributorUrlRejectedError",
    "InternalServerError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "NotGiven",
    "PayloadTooLargeError",
    "RecordTooNewError",
    "RequestHeadTooLargeError",
    "RequestTimeoutError",
    "StaleError",
    "StoreUnavailableError",
    "Timeout",
    "make_contributor_app",
    "make_status_error",
    "types",
    "usage_from_anthropic",
    "usage_from_gemini",
    "usage_from_openai",
]
