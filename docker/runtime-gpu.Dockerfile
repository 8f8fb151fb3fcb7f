# The GPU runtime image: a worker with ONNX Runtime's CUDA build, TensorRT (both from the lock's
# wheels, which bring their own TensorRT libraries) and NVML, on NVIDIA's CUDA runtime with
# cuDNN. CUDA 13 because the lock's TensorRT is tensorrt-cu13. Tensor workers only: the GenAI
# extra would pull the CPU onnxruntime beside onnxruntime-gpu. Build from the repository root:
#   docker build -f docker/runtime-gpu.Dockerfile -t kiln/runtime-gpu:0.1.0 .

FROM python:3.11.14-slim-bookworm AS build
RUN pip install --no-cache-dir uv==0.13.9
# The CUDA image has no Python 3.11: uv installs a standalone build, copied over with the venv.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_PROJECT_ENVIRONMENT=/opt/kiln
RUN uv python install 3.11.14
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY platform/pyproject.toml platform/
COPY console/pyproject.toml console/
COPY runtimes/pyproject.toml runtimes/
RUN uv sync --frozen --no-dev --no-editable --no-install-workspace --python 3.11.14 \
    --package kiln-runtimes --extra gpu --extra tensorrt --extra s3
COPY runtimes/src runtimes/src
RUN uv sync --frozen --no-dev --no-editable --python 3.11.14 \
    --package kiln-runtimes --extra gpu --extra tensorrt --extra s3

FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
RUN groupadd --system --gid 10001 kiln \
    && useradd --system --uid 10001 --gid kiln --home-dir /var/lib/kiln --shell /usr/sbin/nologin kiln \
    && install -d -o kiln -g kiln -m 0700 /var/lib/kiln
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/kiln /opt/kiln
ENV PATH=/opt/kiln/bin:$PATH \
    LD_LIBRARY_PATH=/opt/kiln/lib/python3.11/site-packages/tensorrt_libs \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/kiln
EXPOSE 9000 9090
ENTRYPOINT ["kiln-worker"]
CMD ["--help"]
