# The CPU runtime image: a worker (`kiln-worker`, or `python -m kiln_runtimes` as the kubernetes
# pool backend runs it) with ONNX Runtime, ONNX Runtime GenAI and the S3 store's client. Build
# from the repository root (docker/README.md):
#   docker build -f docker/runtime-cpu.Dockerfile -t kiln/runtime-cpu:0.1.0 .

FROM python:3.11.14-slim-bookworm AS build
RUN pip install --no-cache-dir uv==0.13.9
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/kiln
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY platform/pyproject.toml platform/
COPY console/pyproject.toml console/
COPY runtimes/pyproject.toml runtimes/
RUN uv sync --frozen --no-dev --no-editable --no-install-workspace --package kiln-runtimes \
    --extra onnxruntime --extra genai --extra s3
COPY runtimes/src runtimes/src
RUN uv sync --frozen --no-dev --no-editable --package kiln-runtimes \
    --extra onnxruntime --extra genai --extra s3

FROM python:3.11.14-slim-bookworm
RUN groupadd --system --gid 10001 kiln \
    && useradd --system --uid 10001 --gid kiln --home-dir /var/lib/kiln --shell /usr/sbin/nologin kiln \
    && install -d -o kiln -g kiln -m 0700 /var/lib/kiln
COPY --from=build /opt/kiln /opt/kiln
ENV PATH=/opt/kiln/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/kiln
# 9000: the gateway's calls; 9090: GET /metrics only (--metrics-port). No HEALTHCHECK: the port
# is a flag; the pool backend gives the pod its probes (/readyz, /livez: docker/README.md).
EXPOSE 9000 9090
ENTRYPOINT ["kiln-worker"]
CMD ["--help"]
