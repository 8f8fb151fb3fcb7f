# The platform image: the `kiln` command (gateway, console, pool manager, admin CLI), with boto3
# for the S3 artifact store and RDS IAM tokens. No engine library, no torch: workers run from
# the runtime images. Build from the repository root (docker/README.md):
#   docker build -f docker/platform.Dockerfile -t kiln/platform:0.1.0 .

FROM python:3.11.14-slim-bookworm AS build
# uv at the version the Makefile pins; --frozen installs uv.lock as it is, resolving nothing.
RUN pip install --no-cache-dir uv==0.13.9
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/kiln
WORKDIR /src
# Third-party packages first: this layer changes only with the lock.
COPY pyproject.toml uv.lock README.md ./
COPY platform/pyproject.toml platform/
COPY console/pyproject.toml console/
COPY runtimes/pyproject.toml runtimes/
RUN uv sync --frozen --no-dev --no-editable --no-install-workspace --package kiln-console --extra aws
# Kiln's own packages, as wheels (the platform's carries migrations/ as kiln_platform/_migrations).
COPY migrations migrations
COPY platform/src platform/src
COPY console/src console/src
COPY runtimes/src runtimes/src
RUN uv sync --frozen --no-dev --no-editable --package kiln-console --extra aws

FROM python:3.11.14-slim-bookworm
RUN groupadd --system --gid 10001 kiln \
    && useradd --system --uid 10001 --gid kiln --home-dir /var/lib/kiln --shell /usr/sbin/nologin kiln \
    && install -d -o kiln -g kiln -m 0700 /var/lib/kiln
COPY --from=build /opt/kiln /opt/kiln
ENV PATH=/opt/kiln/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KILN_HOST=0.0.0.0 \
    KILN_PORT=8000 \
    KILN_GRPC_PORT=8001 \
    KILN_DATA_DIR=/var/lib/kiln
USER 10001:10001
WORKDIR /var/lib/kiln
EXPOSE 8000 8001
# Liveness as Kubernetes probes it (gateway.yaml: /healthz; readiness is /readyz).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["kiln"]
CMD ["up", "--no-import"]
