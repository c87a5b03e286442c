//===- Mma.cuh - warp-level tensor-core tiles (mma.sync, bf16 and TF32) ---===//
//
// The register layout of mma.sync.m16n8k16 with bf16 inputs and fp32
// accumulators, per lane (g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g + 8, 2t..),
//                           a[2] = (g, 2t+8..),   a[3] = (g + 8, 2t+8..);
//   B (16 x 8, k x n):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g);
//   C (16 x 8):             c[0..1] = (g, 2t..2t+1), c[2..3] = (g + 8, 2t..).
// Two bf16 in one register hold the lower index in the low half. Kernels
// using these are built for sm_80 and later (the H200 is sm_90).
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_MMA_CUH
#define ADAPT_RUNTIME_CUDA_MMA_CUH

#include <cuda_bf16.h>

#include <cstdint>

namespace adapt::rt::cuda {

/// c += a * b for one m16n8k16 tile (bf16 in, fp32 accumulation).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// \p x rounded to TF32 (10-bit mantissa, to nearest, ties away) in a
/// register, as mma1688Tf32 reads it.
__device__ __forceinline__ uint32_t toTf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

/// c += a * b for one m16n8k8 tile with TF32 inputs and fp32 accumulation.
/// Per lane (g = lane / 4, t = lane % 4): a[0] = (g, t), a[1] = (g + 8, t),
/// a[2] = (g, t + 4), a[3] = (g + 8, t + 4) of A (16 x 8, row-major);
/// b0 = (k t, n g), b1 = (k t + 4, n g) of B (8 x 8); c as m16n8k16's.
__device__ __forceinline__ void mma1688Tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two adjacent bf16 as one register (4-byte aligned address).
__device__ __forceinline__ uint32_t bf16Pair(const __nv_bfloat16 *p) {
  return *reinterpret_cast<const uint32_t *>(p);
}

/// The A fragment of rows [0, 16) and columns [16 ks, 16 ks + 16) of a
/// row-major bf16 tile with \p stride elements per row.
__device__ __forceinline__ void loadFragmentA(uint32_t (&a)[4], const __nv_bfloat16 *tile, int stride, int ks,
                                              int g, int t) {
  const __nv_bfloat16 *low = tile + g * stride + ks * 16 + 2 * t, *high = low + 8 * stride;
  a[0] = bf16Pair(low);
  a[1] = bf16Pair(high);
  a[2] = bf16Pair(low + 8);
  a[3] = bf16Pair(high + 8);
}

/// Four 8x8 bf16 matrices from shared memory, each transposed on the way:
/// lane l gives the address of row l % 8 of matrix l / 8 (16-byte aligned),
/// and register j receives matrix j as a fragment: (row 2t..2t+1, column g)
/// of the stored matrix. With a [k][n] tile (rows k) this gives B fragments,
/// with a [k][m] tile A fragments of its transpose.
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16 *p) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// -inf as a float constant usable in device code.
__device__ __forceinline__ float negativeInfinity() { return __int_as_float(0xff800000); }

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_MMA_CUH
