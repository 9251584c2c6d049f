"""Breakdown: the human view of one preparation, as text.

Prepares a request whose blocks meet most decisions (protected, dependency, fits, projected,
expired, missing dependency, over the budget), reports a synthetic usage object, and prints
``GET /v1/preparations/{id}/breakdown`` as plain text: budget bars, every block's status, reason
and tokens, the sources, the hashes and the accounting. It never contains block bodies. In a
browser the same URL answers HTML.

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/breakdown.py
"""

from __future__ import annotations

import os
import sys
from typing import Any

from context_assembly_client import Client

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None

REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "max_context_tokens": 8000,
    "response_reserve": 512,
    "assembly": {"max_data_tokens": 400, "layout": "stable-prefix"},
    "instructions": "Answer from the retrieved documents; cite their ids.",
    "plugins": [
        {"name": "memory", "instructions": "Saved entries; read one with store_get."},
        {"name": "docs", "instructions": "Retrieved documents."},
    ],
    "whiteboard": {
        "source": "memory",
        "recovery_tool": "store_get",
        "entries": [
            {
                "key": "receipt",
                "description": "Keep exact identity",
                "value": {"id": "A42", "status": "completion-unknown"},
                "priority": "critical",
            },
            {
                "key": "background",
                "description": "Retained source",
                "value": "background " * 600,
                "priority": "low",
            },
        ],
    },
    "contributions": [
        {
            "source": "docs",
            "revision": "idx-7",
            "blocks": [
                {"id": "glossary", "text": "RPO: recovery point objective."},
                {
                    "id": "policy",
                    "text": "Backup policy: nightly full, hourly incremental. " * 8,
                    "priority": 10,
                    "dependencies": ["docs/glossary"],
                },
                {
                    "id": "old-policy",
                    "text": "Superseded backup policy.",
                    "expires_at": "2020-01-01T00:00:00Z",
                },
                {
                    "id": "old-policy-notes",
                    "text": "Notes on the superseded policy.",
                    "dependencies": ["docs/old-policy"],
                },
                {"id": "appendix", "text": "Appendix: restore drills. " * 120, "priority": -10},
            ],
        }
    ],
    "input": [{"role": "user", "content": "What is our recovery point objective?"}],
}


def main() -> int:
    with Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        prep = client.prepare(REQUEST)
        total = prep.budget.total_input_tokens
        usage = {"prompt_tokens": total, "completion_tokens": 17, "total_tokens": total + 17}
        client.report_usage(
            prep.preparation_id, report_id="chatcmpl-1", provider="openai", usage=usage
        )
        text = client.breakdown(prep.preparation_id)
        print(text.rstrip())
        html = client.breakdown(prep.preparation_id, html=True)
        print(f"(html view: {len(html)} characters, starts {html.lstrip()[:15]!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
