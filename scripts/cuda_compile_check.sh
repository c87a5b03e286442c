#!/usr/bin/env bash
# Compile-checks the runtime's CUDA kernels for sm_90 on a machine without a
# GPU or a CUDA toolkit (this 2-core machine): nvcc, the CUDA runtime and
# cccl headers, and the cuBLAS/cuSPARSE/cuSOLVER headers that ATen's CUDA
# headers include come from NVIDIA's CUDA 13 wheels on PyPI (the H200's CUDA),
# into .cuda13/ (git-ignored; ~1 GB downloaded once, only headers kept of the
# libraries); LibTorch's headers from the setup script's .venv. Prints
# ptxas's registers, shared memory and any spills per kernel. It compiles
# only: whether a kernel is right is the op stage's question, on a GPU.
# usage: scripts/cuda_compile_check.sh [FILE.cu ...]   (default: runtime/cuda/*.cu)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD C=$PWD/.cuda13
TORCH_INCLUDE=$(ls -d .venv/lib/python3*/site-packages/torch/include 2>/dev/null | head -1)
[ -n "$TORCH_INCLUDE" ] || { echo "error: .venv has no torch; run scripts/setup.sh first" >&2; exit 2; }
if [ ! -x "$C/venv/bin/python" ]; then
  echo "== fetching nvcc and CUDA headers (CUDA 13 wheels) into .cuda13"
  python3 -m venv "$C/venv"
  "$C/venv/bin/pip" install -q nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl
  mkdir -p "$C/wheels" "$C/libheaders"
  "$C/venv/bin/pip" download -q --no-deps nvidia-cublas nvidia-cusparse nvidia-cusolver -d "$C/wheels"
  for w in "$C"/wheels/*.whl; do (cd "$C/libheaders" && python3 -m zipfile -e "$w" . >/dev/null); done
  find "$C/libheaders" -type f ! -path "*/include/*" -delete
  rm -rf "$C/wheels"
fi
NV=$(ls -d "$C"/venv/lib/python3*/site-packages/nvidia/cu13)
FILES=("$@"); [ ${#FILES[@]} -gt 0 ] || FILES=(runtime/cuda/*.cu)
status=0
for f in "${FILES[@]}"; do
  echo "== $f"
  if ! log=$("$NV/bin/nvcc" -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -DADAPT_WITH_CUDA_KERNELS \
      -I"$ROOT" -I"$NV/include" -I"$NV/cccl" -I"$C/libheaders/nvidia/cu13/include" -I"$TORCH_INCLUDE" \
      -I"$TORCH_INCLUDE/torch/csrc/api/include" -Xptxas -v -c "$f" -o /dev/null 2>&1); then
    status=1
  fi
  # Drop ptxas's per-kernel headers and the zero-spill lines: registers,
  # shared memory, spills and errors remain.
  printf '%s\n' "$log" | grep -v "Compile time\|Compiling entry\|Function properties\|bytes gmem\|0 bytes stack frame, 0 bytes spill" || true
done
exit $status
