#!/usr/bin/env bash
# Installs every dependency of adapt on Debian 12 (as root) and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="cmake ninja-build g++ python3 libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools \
  libonnx-dev libprotobuf-dev protobuf-compiler libfmt-dev nlohmann-json3-dev libgtest-dev \
  clang-19 libclang-rt-19-dev"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "== installing: $missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi
# LibTorch (the runtime) and the reference implementations (transformers +
# PEFT) come from PyTorch's pinned wheel, in a virtual environment of ours.
if ! .venv/bin/python -c 'import torch, transformers, peft' >/dev/null 2>&1; then
  echo "== creating .venv with torch, transformers and peft (pinned; a few GB)"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt
fi
echo "== configuring and building (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir
cmake --build build -j "$(nproc)"
echo "== built build/bin/adapt and build/bin/adapt-opt"
