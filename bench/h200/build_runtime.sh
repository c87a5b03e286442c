# Sourced by the GPU scripts: builds the runtime (LibTorch only) with
# adapt-op-check into $W/rt and the long-context bench into $W/lc, logs in
# $W; on a failure prints the first errors and exits 1. RUNTIME_ONLY=1:
# the runtime library alone (what the generated trainers link). LINEINFO=1:
# the kernels carry source lines for Nsight Compute (ADAPT_CUDA_LINEINFO).
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S runtime -B $W/rt -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  $([ "${LINEINFO:-0}" = 1 ] && echo -DADAPT_CUDA_LINEINFO=ON) > $W/cmake-runtime.log 2>&1 || { tail -20 $W/cmake-runtime.log; exit 1; }
cmake --build $W/rt --target adapt_runtime $([ "${RUNTIME_ONLY:-0}" = 1 ] || echo adapt-op-check) \
  > $W/build-runtime.log 2>&1 || { grep -m5 -A8 error $W/build-runtime.log; exit 1; }
if [ "${RUNTIME_ONLY:-0}" != 1 ]; then
cmake -S bench/h200/long_context -B $W/lc -G Ninja -DAdaptRuntime_DIR=$W/rt > $W/cmake-lc.log 2>&1 || { tail -20 $W/cmake-lc.log; exit 1; }
cmake --build $W/lc > $W/build-lc.log 2>&1 || { grep -m5 -A8 error $W/build-lc.log; exit 1; }
fi
