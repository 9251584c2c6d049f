"""The baseline of bench_service.py: a bare FastAPI app that parses the same prepare request
model and echoes it back (what any typed FastAPI endpoint pays for the same payload)."""

from __future__ import annotations

from fastapi import FastAPI

from context_assembly.core.request import PrepareRequest

app = FastAPI()


@app.post("/v1/prepare")
async def echo(body: PrepareRequest) -> PrepareRequest:
    return body
