#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (CPU only) from the llama.cpp sources vendored in the
# llama-cpp-python sdist of the version installed in the venv, into a cache outside the repo.
#
#   bash bench/build_llama_server.sh            # prints the path of the llama-server binary
#
# Idempotent: a binary already built for this llama-cpp-python version is reused.
# Env: KILN_BENCH_CACHE (default ~/.cache/kiln-bench), PYTHON (default .venv/bin/python or python3),
#      JOBS (default 2), LLAMA_CPP_PYTHON_VERSION (default: the installed one, else 0.3.36).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
# the installed llama-cpp-python's version; the one the benchmarks were run with when it is not
# installed (it is not in uv.lock: only its sdist's vendored llama.cpp is needed here)
version="${LLAMA_CPP_PYTHON_VERSION:-$("$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || echo 0.3.36)}"
cache="${KILN_BENCH_CACHE:-$HOME/.cache/kiln-bench}"
root="$cache/llama-cpp-python-$version"
binary="$root/build/bin/llama-server"

if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi

mkdir -p "$root"
src="$root/src"
if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
    dl="$root/download"
    rm -rf "$dl" "$src"
    mkdir -p "$dl"
    "$python" -m pip download --quiet --no-binary :all: --no-deps --dest "$dl" \
        "llama-cpp-python==$version" >&2
    archive="$(ls "$dl"/llama_cpp_python-*.tar.gz | head -n 1)"
    mkdir -p "$src"
    tar -xzf "$archive" -C "$src" --strip-components=1
fi

cmake -B "$root/build" -S "$src/vendor/llama.cpp" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$root/build" --target llama-server -j "${JOBS:-2}" >&2
"$binary" --version >&2 || true
echo "$binary"
