//===- Packed.cuh - 16-byte loads and stores for memory-bound kernels -----===//
//
// A memory-bound kernel that moves one 2-byte element per load reaches about
// half of the H200's bandwidth; moving 16 bytes per load (8 bf16 or 4 fp32)
// lets it reach nearly all of it. Pack<T> is one such 16-byte group with its
// elements widened to float, so the kernels compute in fp32 and round once.
//
//===----------------------------------------------------------------------===//

#ifndef ADAPT_RUNTIME_CUDA_PACKED_CUH
#define ADAPT_RUNTIME_CUDA_PACKED_CUH

#include <cstdint>
#include <initializer_list>

namespace adapt::rt::cuda {

/// 16 bytes of T, read or written in one instruction, elements as floats.
template <typename T>
struct Pack {
  /// How many elements of T one 16-byte access moves.
  static constexpr int kSize = 16 / sizeof(T);
  float v[kSize];

  /// Loads kSize elements from \p p, which must be 16-byte aligned.
  __device__ __forceinline__ static Pack load(const T *p) {
    union {
      uint4 raw;
      T elems[kSize];
    } u;
    u.raw = *reinterpret_cast<const uint4 *>(p);
    Pack out;
#pragma unroll
    for (int i = 0; i < kSize; ++i)
      out.v[i] = static_cast<float>(u.elems[i]);
    return out;
  }

  /// Stores the elements, each rounded once to T, at \p p (16-byte aligned).
  __device__ __forceinline__ void store(T *p) const {
    union {
      uint4 raw;
      T elems[kSize];
    } u;
#pragma unroll
    for (int i = 0; i < kSize; ++i)
      u.elems[i] = static_cast<T>(v[i]);
    *reinterpret_cast<uint4 *>(p) = u.raw;
  }
};

/// Adds four floats at \p address (16-byte aligned): one 16-byte atomic on
/// sm_90 and later, four scalar ones before.
__device__ __forceinline__ void atomicAddFour(float *address, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4 *>(address), v);
#else
  atomicAdd(address, v.x);
  atomicAdd(address + 1, v.y);
  atomicAdd(address + 2, v.z);
  atomicAdd(address + 3, v.w);
#endif
}

/// Whether rows of \p width elements of T starting at each pointer can all be
/// accessed in 16-byte packs.
template <typename T>
inline bool packable(int64_t width, std::initializer_list<const void *> pointers) {
  if (width % Pack<T>::kSize != 0)
    return false;
  for (const void *p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return false;
  return true;
}

} // namespace adapt::rt::cuda

#endif // ADAPT_RUNTIME_CUDA_PACKED_CUH
