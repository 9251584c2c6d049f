# syntax=docker/dockerfile:1
#
# context-assembly service image (docs/deploy.md).
#
#   docker build -t context-assembly:0.1.0 .
#   docker run --rm -p 127.0.0.1:8080:8080 \
#     -e CONTEXT_ASSEMBLY_AUTH__KEYS='[{"tenant":"acme","key_sha256":"<sha256 hex of the key>"}]' \
#     context-assembly:0.1.0
#
# Two stages: the builder installs the project, its dependencies and its `otel` extra into
# /opt/venv (the only step that downloads anything, at build time); the runtime stage copies that
# venv onto the same slim base and runs as a fixed non-root uid. Traces stay off until the
# standard OTEL_* variables ask for them (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...:
# docs/operations.md, "Traces"). The tokenizer rank files are package data
# ([tool.setuptools.package-data] in pyproject.toml: tokens/data/*.tiktoken, SHA256SUMS, *.json),
# so `pip install .` puts them inside the venv; the builder checks that they load, so the image
# never fetches a tokenizer at run time.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --------------------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /build
# Only what the build reads: the project metadata (pyproject names README.md as the readme) and
# the package sources with their data files.
COPY pyproject.toml README.md LICENSE ./
COPY service ./service
# The project itself with its extra, pinned by pyproject.toml's ranges (DL3013 asks for a pin on
# registry packages named here, and counts `.[otel]` as one).
# hadolint ignore=DL3013
RUN pip install .[otel] \
 && python -m compileall -q /opt/venv/lib

# Fail the build if the shipped tokenizer files did not make it into the installed package, or if
# they do not load without a network (tiktoken would otherwise try to download them), or if the
# tracing packages of the `otel` extra are missing.
RUN python -c "import importlib.resources as r; d = r.files('context_assembly') / 'tokens' / 'data'; missing = [n for n in ('o200k_base.tiktoken', 'cl100k_base.tiktoken', 'SHA256SUMS', 'models.json') if not (d / n).is_file()]; assert not missing, missing" \
 && python -c "from context_assembly.tokens.counter import get_counter; [get_counter(n).count('warm up') for n in ('o200k_base', 'cl100k_base')]" \
 && python -c "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.instrumentation.aiohttp_client"

# --------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="context-assembly" \
      org.opencontainers.image.description="Budgeted, deterministic, explained selection of source data for every model call." \
      org.opencontainers.image.licenses="MIT"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# A fixed uid/gid (10001) so Kubernetes securityContext and volume ownership can name it.
RUN groupadd --system --gid 10001 context-assembly \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin context-assembly \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/context-assembly

COPY --from=builder /opt/venv /opt/venv
# The default configuration: API-key auth with no key baked in (the service refuses to start until
# keys are given through CONTEXT_ASSEMBLY_AUTH__KEYS or a mounted config), SQLite store in
# /var/lib/context-assembly. Mount your own file over it, or override keys with environment
# variables (CONTEXT_ASSEMBLY_*, nested with __).
COPY deploy/docker/config.toml /etc/context-assembly/config.toml

WORKDIR /srv
USER 10001:10001
EXPOSE 8080

# Liveness only (never the store): the same path the Kubernetes liveness probe uses. Python's
# urllib, so the image needs neither curl nor wget. Assumes the default port 8080.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]

ENTRYPOINT ["context-assembly", "serve"]
CMD ["--host", "0.0.0.0", "--config", "/etc/context-assembly/config.toml"]
