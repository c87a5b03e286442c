//===- Hardware.cpp - GPU and fabric constants, with their sources --------===//

#include "planner/Hardware.h"

namespace adapt::plan {

const Hardware &h200() {
  static const Hardware h = [] {
    Hardware x;
    x.name = "NVIDIA H200 (141 GB HBM3e, NVLink 4, 400 Gb/s InfiniBand per GPU)";
    // NVIDIA H200 datasheet: 141 GB. The lent machine reports ~139 GiB usable.
    x.memoryBytes = 139.0 * (1ull << 30);
    // Measured on the lent H200: bf16 torch.matmul ~780 TFLOP/s at large
    // shapes (the developers' guide); FP8 is twice the bf16 rate (datasheet ratio).
    x.bf16Flops = 780e12;
    x.fp8Flops = 1560e12;
    // NVLink 4: 900 GB/s per GPU both directions (datasheet), 450 GB/s each
    // way; NCCL reaches ~80 % of it in all-to-all and ring all-reduce (NCCL
    // tests' bus bandwidth on H100/H200 HGX, ~360 GB/s).
    x.intraNodeBytesPerS = 360e9;
    // One 400 Gb/s ConnectX-7 per GPU (HGX H200 reference design): 50 GB/s,
    // ~40 GB/s reached by NCCL across nodes.
    x.interNodeBytesPerS = 40e9;
    // CUDA context, cuBLAS/cuDNN handles and NCCL buffers outside the
    // caching allocator: ~0.6 GiB in nvidia-smi beyond the allocator peak on
    // the H200 runs (docs/performance.md), 1 GiB with NCCL's channels.
    x.contextBytes = 1.0 * (1ull << 30);
    // Measured, bench/h200_speed.sh on 2026-12-05 (docs/performance.md,
    // "Ninth and tenth rounds measured"): Qwen3-30B-A3B's widths, 2 x 4096
    // tokens, LoRA r=16 on attention and experts, one CUDA graph per step:
    // 8.42 ms per MoE layer for 2.81 TFLOP (4 x active matmul parameters +
    // causal attention, Planner.cpp's count) = 0.43 of 780 TFLOP/s; the
    // fixed part, 21.9 ms for the 10.2 TFLOP LM head + loss = 0.59.
    x.layerEfficiency = 0.43;
    x.headEfficiency = 0.59;
    // Same runs: allocator peak per extra layer 2.201 GiB, of which 1.160 GiB
    // weights and 0.200 GiB adapter state; 0.841 GiB of activations at 8,192
    // tokens against the planner's count of 1.125 GiB: 0.75. The 48-layer
    // run peaked at 107.8 GiB, as this predicts.
    x.activationScale = 0.75;
    // Same runs: 1 layer peaks at 4.35 GiB; weights 2.32, adapters 0.20,
    // activations 0.84 leave 0.99 GiB (embedding output, loss chunk of
    // 832 x vocab logits, cuBLAS workspace).
    x.fixedAllocatorBytes = 0.99 * (1ull << 30);
    // Gated DeltaNet with its kernels, fitted on Qwen3-Next-80B-A3B's widths
    // at 4 and 8 layers (session 43, H200, 2 x 4096 tokens; validation/
    // records/h200/speed-qwen3-next-80b-a3b.json): from 4 to 8 layers the
    // allocator peak grows 21.3 GiB, of which this planner's other terms
    // (weights, adapter state, the MoE and softmax layers' activations)
    // account for 17.33; the three more GDN layers 1.323 GiB each at 8,192
    // tokens: ~173 KB a token at 32 x 128 value channels (the LibTorch
    // composition kept ~0.6 MiB). Each depth's total is the check
    // (tests/e2e/test_plan.py: -1.0 % and -0.5 %).
    x.deltaRuleBytesPerToken = 1.323 * (1ull << 30) / 8192.0;
    // The same runs: 14.68 ms a layer (the 3:1 mix's average, from 105.3K
    // and 60.0K tokens/s), of which this planner's FLOP count and softmax
    // terms give 7.33; so one GDN layer takes 9.80 ms at 8,192 tokens
    // beyond its projections' FLOPs (1.196 us a token). Its op alone is
    // deltaRuleOpSecondsPerToken (3.14 ms at 8K); the rest, 0.813 us a token
    // (the convolution, gates, gated norm, and whatever the FLOP count
    // misses in these layers), is this constant; Kimi's layers add Kimi's op
    // to it instead. Checked at each depth's total: -3.8 % and -2.2 %.
    x.deltaRuleLayerRestSecondsPerToken = 1.196e-6 - 3.14e-3 / 8192.0;
    // Lightning attention alone at 1 x 64 heads x 32,768 tokens, forward +
    // backward 11.13-11.31 ms on the delta rule's kernels (session 53, an
    // H100, whose memory is slower than the H200's: an upper bound here;
    // docs/performance/long-context-and-attention-kernels.md "Lightning
    // attention on the kernels"): ~340 ns per token, ~360 at 8K.
    x.lightningSecondsPerToken = 11.22e-3 / 32768.0;
    // The delta rule's op alone at 1 x 32 heads x 8,192 tokens, forward +
    // backward 3.14 ms on the delta rule's kernels (session 43, H200; the
    // same doc, "The kernels inside the model, measured").
    x.deltaRuleOpSecondsPerToken = 3.14e-3 / 8192.0;
    // Kimi delta attention's op alone at 1 x 32 heads x 8,192 tokens,
    // forward + backward 5.92 ms on its kernels (session 58, an H100: its
    // latest figure; the same doc, "Kimi's forward pairs eight channels a
    // step"), 1.9x GDN's figure above.
    x.kimiDeltaOpSecondsPerToken = 5.92e-3 / 8192.0;
    // The indexer's quadratic part (bf16 scores per head, the head reduction,
    // top-k; 2026-12-04, docs/performance.md "Sparse MLA: values inside the
    // gathered keys"): ~70 ms of the 475 ms DSA layer at 32,768 tokens, for
    // Planner.cpp's count of 8.8e12 FLOP: ~120 TFLOP/s (the per-head score
    // tile's memory traffic, not the GEMM, sets it). At 131,072 tokens that
    // is ~1.2 s of the measured 2.9 s.
    x.indexerFlops = 120e12;
    return x;
  }();
  return h;
}

} // namespace adapt::plan
