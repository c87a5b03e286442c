#!/usr/bin/env bash
# Runs the whole test suite: gtest units, lit/FileCheck, end-to-end runs of
# adapt on every model in ../shared/models, bad inputs, and bounded fuzz runs.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure

