//===- Ops.h - the operator library's stateless kernels ---------*- C++ -*-===//
//
// Pure functions over tensors: norms, rotary embeddings, attention, routing,
// grouped expert GEMMs and activations. Each composes ATen operators whose
// backward LibTorch's autograd derives, so every op has forward and backward
// in fp32 and bf16 on CPU and CUDA. Modules with weights (Layers.h) call
// these; numerics follow the Hugging Face reference implementations (norms,
// softmax and routing computed in fp32).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_OPS_H
#define ADAPT_RUNTIME_OPS_H

#include "runtime/ModelDef.h"

#include <torch/torch.h>

namespace adapt::rt {

/// RMSNorm over the last dim, computed in fp32; \p weight may be undefined
/// (weightless, Llama-4's QK norm).
torch::Tensor rmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps);

/// RMSNorm scaled by (weight + \p offset) with fp32 inside and one rounding,
/// by the runtime's CUDA kernels when they take \p x (a CUDA tensor whose
/// last dim fits 16-byte packs; runtime/cuda/RmsNormKernel.h), else an
/// undefined tensor: the caller then runs its composition.
torch::Tensor rmsNormByKernel(const torch::Tensor &x, const torch::Tensor &weight, double eps, double offset);

/// Zero-centred RMSNorm (Qwen3-Next): rmsnorm(x) * (1 + weight), all in fp32,
/// result in x's dtype.
torch::Tensor zeroCentredRmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps);

/// The decoder's residual stream entering a norm: {h, norm(h)} with
/// h = \p residual + \p branch, or h = \p residual itself when \p branch is
/// undefined; the norm is zeroCentredRmsNorm when \p zeroCentred, else
/// rmsNorm. Callers use the returned h (not \p residual) as the stream from
/// here on, so that h's gradient from the stream reaches this op. On the GPU
/// (runtime/cuda/RmsNormKernel.h; ADAPT_RESIDUAL_NORM_KERNEL=0 opts out) it is one kernel
/// each way: the forward writes h and the norm in one pass, and the backward
/// adds h's gradient from the stream into the norm's input gradient in the
/// same pass, where autograd would sum the two with one more kernel (one
/// pass of [tokens, hidden] fewer in the forward and four in the backward
/// per decoder layer). Elsewhere the composition, which is the reference.
std::pair<torch::Tensor, torch::Tensor> residualRmsNorm(const torch::Tensor &residual, const torch::Tensor &branch,
                                                        const torch::Tensor &weight, double eps, bool zeroCentred);

/// Rotary tables for positions 0..T-1: cos and sin [T, rotaryDim] in fp32,
/// already multiplied by YaRN's attention factor.
struct RopeTables {
  torch::Tensor cos, sin;
  /// M-RoPE positions [3, B, T] of image documents; undefined: 0..T-1 on
  /// every axis. Only a generated rotary operator reads them.
  torch::Tensor positions;
};

/// Inverse frequencies [rotaryDim/2] for \p rope (default, YaRN, llama3).
torch::Tensor ropeInverseFrequencies(const RopeDef &rope);
/// YaRN's cos/sin multiplier (1 for other scalings).
double ropeAttentionFactor(const RopeDef &rope);
/// Tables for \p seqLen positions on \p device.
RopeTables ropeTables(const RopeDef &rope, int64_t seqLen, torch::Device device);
/// Tables for positions first .. first + count - 1 (a context-parallel part).
RopeTables ropeTablesAt(const RopeDef &rope, int64_t first, int64_t count, torch::Device device);
/// Rotates the first rotaryDim dims of \p x [B, H, T, D]: halves
/// (rotate_half) or interleaved pairs (2i, 2i+1).
torch::Tensor applyRope(const torch::Tensor &x, const RopeTables &tables, bool interleaved);

/// Which keys each query may see, beyond causality.
struct AttentionMask {
  int64_t slidingWindow = 0; ///< key j visible from i when i - j < window.
  int64_t chunkSize = 0;     ///< key j visible when j / chunk == i / chunk.
  /// Context parallelism: query i sits at position queryOffset + i of the
  /// keys (which start at position 0 and may outnumber the queries).
  int64_t queryOffset = 0;
};

/// applyRope() by the approved generated operator \p component (task rope,
/// runtime/GeneratedOps.h): \p x [B, H, T, D], one call per sequence with
/// x as [T, H, D] and its integer positions [A, T] (A = 3 for M-RoPE).
torch::Tensor generatedRope(const std::string &component, const torch::Tensor &x,
                            const RopeTables &tables, const RopeDef &rope);

/// Scaled dot-product attention. q [B, H, T, Dq], k [B, KV, S, Dq],
/// v [B, KV, S, Dv] (H a multiple of KV; S = T unless mask.queryOffset
/// places the queries after earlier keys). \p sinks [H] adds one learned
/// logit per head to the softmax denominator (gpt-oss). Returns [B, H, T, Dv].
torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k,
                        const torch::Tensor &v, double scale,
                        const AttentionMask &mask, const torch::Tensor &sinks);

/// attention() by the approved generated core \p component (task
/// attention_core, runtime/GeneratedOps.h): same layouts and result; one call
/// per sequence of the batch; chunked masks are refused.
torch::Tensor generatedAttention(const std::string &component, const torch::Tensor &q,
                                 const torch::Tensor &k, const torch::Tensor &v, double scale,
                                 const AttentionMask &mask, const torch::Tensor &sinks);

/// Expert choice of a router for N tokens.
struct Routing {
  torch::Tensor experts; ///< [N, k] int64 expert ids.
  torch::Tensor weights; ///< [N, k] fp32 combine weights (Llama-4: input scales).
};

/// Picks experts from router logits [N, E] (fp32) per \p ffn's router kind.
/// \p correctionBias [E] biases selection only (DeepSeek's aux-loss-free).
Routing route(const torch::Tensor &logits, const FfnDef &ffn,
              const torch::Tensor &correctionBias);

/// route() with the experts given instead of chosen: \p experts [N, k] int64
/// (e.g. the reference's choice), weighted exactly as route() weighs the
/// experts it picks (the same scores gathered and normalised). Lets a loss
/// curve be compared with a reference whose near-tied router scores pick
/// another expert in the last bit of fp32. Throws BadInput for a wrong shape
/// and for a generated router (its weights are dense, opaque). It reads
/// nothing back from the device (a CUDA graph may capture it): the expert
/// ids are checked beforehand by checkForcedExperts.
Routing routeForced(const torch::Tensor &logits, const FfnDef &ffn,
                    const torch::Tensor &correctionBias, const torch::Tensor &experts);
/// Throws BadInput (naming \p block) unless every id of \p experts is in
/// [0, \p count): forced experts are checked once, before the forwards.
void checkForcedExperts(const torch::Tensor &experts, int64_t count, const std::string &block);

/// Tokens whose chosen experts (as a set) differ between \p a and \p b: an
/// int64 scalar on their device, read after the step.
torch::Tensor routingDifferences(const Routing &a, const Routing &b);

/// Tokens grouped by expert: the permutation and group offsets that the
/// grouped GEMMs use. With alignment, each expert's group is padded to a
/// multiple of `align` rows; padding rows repeat token 0 with weight 0, so
/// they add nothing to outputs or gradients.
struct ExpertGroups {
  torch::Tensor tokenOfRow;  ///< [rows] int64: source token of each row.
  torch::Tensor weightOfRow; ///< [rows] fp32 routing weight (0 on padding).
  torch::Tensor expertOfRow; ///< [rows] int64 expert of each row.
  torch::Tensor offsets;     ///< [E] int32 cumulative (padded) row counts.
  torch::Tensor rowCounts;   ///< [E] int64 (padded) rows per expert.
  torch::Tensor counts;      ///< [E] int64 tokens routed to each expert.
  torch::Tensor rowOfPair;   ///< [N*k] int64: the row of (token t, slot j) at t*k+j.
  int64_t pairsPerToken = 1; ///< k, the experts each token is routed to.
};
/// Sorts the N*k (token, expert) pairs of \p routing by expert, padding each
/// group to a multiple of \p align rows (1: no padding). Sizes stay on the
/// device: no host synchronisation.
ExpertGroups groupByExpert(const Routing &routing, int64_t experts, int64_t align = 1);

/// Row alignment the grouped GEMM wants on \p device: 16 rows on CUDA (the
/// Hopper kernels' tile/TMA alignment), none elsewhere.
int64_t groupAlignment(const torch::Device &device);


/// Whether LibTorch has a grouped-GEMM kernel for \p x [R, K] times \p w
/// [E, N, K]: fp32 or bf16 on CPU, bf16 on CUDA, and both N and K rows a
/// multiple of 16 bytes (a rank-4 LoRA factor in bf16 is not).
bool hasGroupedMm(const torch::Tensor &x, const torch::Tensor &w);

/// Row-grouped matmul: rows of \p x [R, K] in group g (by \p groups.offsets)
/// are multiplied by \p w [E, N, K] transposed, giving [R, N]. Uses
/// at::_grouped_mm where LibTorch has a kernel for the device and dtype, and
/// a per-expert loop otherwise.
torch::Tensor groupedLinear(const torch::Tensor &x, const torch::Tensor &w,
                            const ExpertGroups &groups);

/// SwiGLU on a fused gate/up projection [.., 2I]: "concat" halves (gate
/// first) or "interleaved" (gate at even columns). Clamped form when
/// \p ffn.act is ClampedSwiGLU (gpt-oss: (up + 1) * gate * sigmoid(alpha gate)).
torch::Tensor gatedActivation(const torch::Tensor &gateUp, bool interleaved,
                              const FfnDef &ffn);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_OPS_H
