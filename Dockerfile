# syntax=docker/dockerfile:1
# mcp-sse-gateway: resumable-streaming reverse proxy for MCP servers.
#
#   docker build -t mcp-sse-gateway .
#   docker run --rm -p 8080:8080 -e MCP_SSE_GATEWAY_UPSTREAM__URL=http://mcp:3000/mcp \
#     -e MCP_SSE_GATEWAY_SERVER__ALLOWED_HOSTS='["mcp.example.com"]' mcp-sse-gateway
#
# Dependencies come from requirements.lock (hash-pinned, generated from pyproject.toml; see the
# README to regenerate it), the application as a wheel built from this tree.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements.lock ./
RUN /opt/venv/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY mcp_sse_gateway ./mcp_sse_gateway
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-deps /wheels/*.whl \
    && /opt/venv/bin/python -m compileall -q /opt/venv

# The bundled example MCP server (official SDK, no event store): a stand-in upstream for
# deploy/compose (docker build --target example). Not the gateway image.
FROM build AS example
RUN /opt/venv/bin/pip install "mcp==2.3.0" "uvicorn==0.54.0"
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["/opt/venv/bin/python", "-m", "mcp_sse_gateway.example"]
CMD ["--host", "0.0.0.0", "--port", "3000", "--allow-host", "upstream:*"]

# The gateway image (the default target).
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="mcp-sse-gateway" \
      org.opencontainers.image.description="Resumable-streaming reverse proxy for MCP servers (Streamable HTTP, SSE, Last-Event-ID)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/mcp-sse-gateway/mcp-sse-gateway"
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MCP_SSE_GATEWAY_SERVER__HOST=0.0.0.0 \
    MCP_SSE_GATEWAY_SERVER__PORT=8080 \
    MCP_SSE_GATEWAY_LOGGING__FORMAT=json
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
# Liveness, not readiness: a draining gateway answers /readyz 503 on purpose, and must not be
# restarted for it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["mcp-sse-gateway", "healthcheck"]
ENTRYPOINT ["mcp-sse-gateway"]
CMD ["serve"]
