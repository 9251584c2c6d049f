"""Contributor webhooks: SSRF guard, signing, the shared client, and the deadline-bound calls.

Data flows one way: the API layer builds :class:`ContributorTarget` values (registered ones from
configuration, inline ones through :func:`check_url`), calls :func:`contribute_all` with the one
shared :class:`ContributorClient` from :func:`create_client`, and hands the outcomes to the core;
:func:`raise_for_failures` applies the ``fail`` policy.
"""

from context_assembly.contributors.calls import (
    TIMEOUT_HEADER,
    ContributorTarget,
    contribute_all,
    query_revision,
    raise_for_failures,
)
from context_assembly.contributors.client import (
    ContributorClient,
    PinnedResolver,
    create_client,
)
from context_assembly.contributors.outcomes import ContributorOutcome, PacketFields, Status
from context_assembly.contributors.packets import ContributorAnswer
from context_assembly.contributors.signing import sign_headers, validate_secret, webhook_id
from context_assembly.contributors.ssrf import (
    CheckedTarget,
    Resolver,
    UrlPolicy,
    check_url,
    forbidden_category,
    system_resolver,
)

__all__ = [
    "TIMEOUT_HEADER",
    "CheckedTarget",
    "ContributorAnswer",
    "ContributorClient",
    "ContributorOutcome",
    "ContributorTarget",
    "PacketFields",
    "PinnedResolver",
    "Resolver",
    "Status",
    "UrlPolicy",
    "check_url",
    "contribute_all",
    "create_client",
    "forbidden_category",
    "query_revision",
    "raise_for_failures",
    "sign_headers",
    "system_resolver",
    "validate_secret",
    "webhook_id",
]
