#!/usr/bin/env bash
# Runs the test suite: gtest units, lit/FileCheck, end-to-end runs of adapt on
# every model in ../shared/models, every family's tiny model trained and checked
# against transformers + PEFT, the validation ladder, bad inputs and faults, and
# bounded fuzz runs. Independent tests run two at a time (ctest -j), the
# longest first.
#
#   bash scripts/test.sh          the default tier (what .ci/run calls): every
#                                 family and every command; loss curves on six
#                                 representative families, 20 s per fuzz target
#   bash scripts/test.sh --full   also 50-step loss curves on every family and
#                                 150 s per fuzz target
# Extra arguments go to ctest (e.g. -R e2e-validate).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=default
if [ "${1:-}" = "--full" ]; then
  tier=full
  shift
  export ADAPT_FUZZ_SECONDS=${ADAPT_FUZZ_SECONDS:-150}  # 5 targets within the fuzz test's 900 s
fi
export ADAPT_TEST_TIER=$tier
cmake --build build -j "$(nproc)"
start=$(date +%s)
# Every test's whole output (measured errors beside their bounds, timings)
# also goes to build/Testing/test-output.log.
ctest --test-dir build --output-on-failure --output-log build/Testing/test-output.log \
  -j "${ADAPT_TEST_JOBS:-2}" "$@"
echo "== $tier tier passed in $(( $(date +%s) - start )) s"
