"""The retrieval source of bench_conversation.py as a signed webhook contributor.

Every call answers 8 fresh ~150-token passages (``agent_conversation.passages``), drawn from the
packet's input and scope: a new turn gets new passages, the same turn the same ones. Built with
the Python client's ``make_contributor_app`` (it verifies the service's signature with the secret
in ``RETRIEVAL_SECRET``); served by uvicorn on loopback: ``uvicorn retrieval_contributor:app``.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from agent_conversation import passages
from context_assembly_client.contributor import ContributePacket, make_contributor_app


def contribute(packet: ContributePacket) -> dict[str, Any]:
    turn = hashlib.sha256(packet.model_dump_json(include={"input", "scope"}).encode()).digest()
    return {"revision": turn.hex()[:16], "blocks": passages(random.Random(turn), turn.hex()[:8])}


app = make_contributor_app(contribute, secret=os.environ["RETRIEVAL_SECRET"])
