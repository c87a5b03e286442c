//===- LinearLayersTest.cpp - delta-rule mixers in recomputed segments ----===//
//
// A long sequence runs through a Gated DeltaNet or Kimi delta layer in
// segments, each recomputed in the backward pass from its input and the
// convolution tail and state entering it. The segments must give the values
// and gradients (input and every LoRA factor) of one pass over the sequence,
// including a last segment shorter than the convolution's tail. Under
// context parallelism (two ranks on threads, exchanging the tail and state
// through an in-process point-to-point group) the segments of each rank's
// part must give the single-process result too.
//
//===----------------------------------------------------------------------===//

#include "runtime/LightningLayer.h"
#include "runtime/LinearAttention.h"
#include "runtime/LinearLayers.h"
#include "runtime/Recompute.h"
#include "runtime/SparseAttention.h"
#include "runtime/tests/CpuMemory.h"
#include "runtime/tests/Loopback.h"
#include "runtime/tests/Margins.h"
#include "runtime/tests/SparseMlaLayer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <thread>

using namespace adapt::rt;
using adapt::rt::test::expectWithin;
using adapt::rt::test::relError;
using adapt::rt::test::LoopbackCollectives;
using adapt::rt::test::LoopbackMailbox;

namespace {

constexpr int64_t kHidden = 24, kRank = 2;

/// A frozen projection with a LoRA adapter whose B is not zero, so the
/// adapter changes the output and every factor gets a gradient.
LoraLinear adapted(int64_t out, int64_t in) {
  LoraLinear l;
  l.weight = torch::randn({out, in}) * 0.3;
  l.loraA = (torch::randn({kRank, in}) * 0.3).requires_grad_();
  l.loraB = (torch::randn({out, kRank}) * 0.3).requires_grad_();
  l.scale = 1.0;
  return l;
}

LinearAttentionDef deltaDef(int64_t keyHeads, int64_t valueHeads, int64_t dk, int64_t dv) {
  LinearAttentionDef d;
  d.keyHeads = keyHeads, d.valueHeads = valueHeads, d.keyHeadDim = dk, d.valueHeadDim = dv;
  d.convKernel = 4, d.chunkSize = 8, d.segmentTokens = 0;
  return d;
}

/// Qwen3-Next's layout: 2 key heads of 8, 4 value heads of 6.
GatedDeltaNetLayer gatedDeltaNet() {
  GatedDeltaNetLayer g;
  g.def = deltaDef(2, 4, 8, 6);
  g.inProjQkvz = adapted(2 * (2 * 8 + 2 * 2 * 6), kHidden);
  g.inProjBa = adapted(2 * 2 * 2, kHidden);
  g.outProj = adapted(kHidden, 4 * 6);
  g.conv = torch::randn({2 * 16 + 24, 1, 4}) * 0.5;
  g.aLog = torch::log(torch::rand({4}) * 4 + 1);
  g.dtBias = torch::rand({4});
  g.norm = torch::rand({6}) + 0.5;
  return g;
}

/// Kimi-Linear's layout: 2 heads of 8, per-channel decay.
KimiDeltaLayer kimiDelta() {
  KimiDeltaLayer k;
  k.def = deltaDef(2, 2, 8, 8);
  for (LoraLinear *l : {&k.q, &k.k, &k.v})
    *l = adapted(16, kHidden);
  k.fA = adapted(8, kHidden), k.fB = adapted(16, 8);
  k.b = adapted(2, kHidden);
  k.gA = adapted(8, kHidden), k.gB = adapted(16, 8);
  k.o = adapted(kHidden, 16);
  k.conv = torch::randn({48, 1, 4}) * 0.5;
  k.aLog = torch::log(torch::rand({2}) * 4 + 1);
  k.dtBias = torch::rand({16});
  k.norm = torch::rand({8}) + 0.5;
  return k;
}

/// MiniMax's layout: 3 heads of 8 (q, k, v of each head side by side in one
/// projection), blocks of 8, layer 1 of 4 (slow decays: a part's state
/// reaches far into the next).
LightningLayer lightning() {
  LightningLayer l;
  l.def.keyHeads = l.def.valueHeads = 3, l.def.keyHeadDim = l.def.valueHeadDim = 8;
  l.def.chunkSize = 8, l.def.decayLayers = 4;
  l.qkvProj = adapted(3 * 3 * 8, kHidden);
  l.outputGate = adapted(24, kHidden);
  l.outProj = adapted(kHidden, 24);
  l.norm = torch::rand({24}) + 0.5;
  l.setLayer(1);
  return l;
}

/// The output and the gradients of x and of every LoRA factor for a fixed
/// cotangent, with the layer's segment length set to \p segmentTokens.
template <typename Layer>
std::vector<torch::Tensor> valueAndGradients(Layer layer, const torch::Tensor &x0, const torch::Tensor &cot,
                                             int64_t segmentTokens) {
  layer.def.segmentTokens = segmentTokens;
  for (LoraLinear *l : layer.linears())
    for (torch::Tensor *t : {&l->loraA, &l->loraB})
      if (t->grad().defined())
        t->mutable_grad().zero_();
  torch::Tensor x = x0.clone().requires_grad_();
  torch::Tensor out = layer.forward(x, /*training=*/true);
  out.backward(cot);
  std::vector<torch::Tensor> all{out.detach(), x.grad().clone()};
  for (LoraLinear *l : layer.linears())
    for (torch::Tensor *t : {&l->loraA, &l->loraB})
      all.push_back(t->grad().clone());
  return all;
}

/// Segments of 16 tokens (two chunks) over 66 tokens: four whole segments
/// and a last one of 2 tokens, shorter than the convolution's tail of 3.
/// fp32 throughout; segmenting changes which tensors the chunk GEMMs are
/// batched over, not the chunk boundaries, so the results agree to a few
/// fp32 roundings. Measured (ADAPT_PRINT_MARGINS=1): 8e-8 to 6e-7 relative;
/// bound 1e-5 (17x over the worst, a LoRA gradient). A state or tail not
/// carried across a boundary moves the results by O(1).
template <typename Layer> void expectSegmentsMatchOnePass(const Layer &layer, const std::string &name) {
  torch::Tensor x = torch::randn({2, 66, kHidden});
  torch::Tensor cot = torch::randn({2, 66, kHidden});
  const std::vector<torch::Tensor> whole = valueAndGradients(layer, x, cot, 0);
  const std::vector<torch::Tensor> segmented = valueAndGradients(layer, x, cot, 16);
  ASSERT_EQ(whole.size(), segmented.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const std::string what = name + (i == 0 ? " output" : i == 1 ? " input gradient" : " LoRA gradient " +
                                                                                           std::to_string(i - 2));
    ASSERT_GT(whole[i].abs().max().item<double>(), 0.0) << what; // every gradient reaches its tensor
    expectWithin(what, relError(segmented[i], whole[i]), 1e-5);
  }
  // Without grad mode the segments still run one after another (bounded
  // memory at inference lengths), with the same values.
  torch::NoGradGuard noGrad;
  Layer copy = layer;
  copy.def.segmentTokens = 16;
  expectWithin(name + " output without grad", relError(copy.forward(x, false), whole[0]), 1e-5);
}

/// The layer with adapters of its own (fresh leaves with the same values),
/// so each rank's gradients accumulate apart.
template <typename Layer> Layer withOwnAdapters(const Layer &layer) {
  Layer copy = layer;
  for (LoraLinear *l : copy.linears()) {
    l->loraA = l->loraA.detach().clone().requires_grad_();
    l->loraB = l->loraB.detach().clone().requires_grad_();
  }
  return copy;
}

/// \p part(group, rank) for ranks 0 to \p size - 1, each on its own thread,
/// joined by one in-process group; each rank's results. A rank's exception
/// fails the test with its message.
std::vector<std::vector<torch::Tensor>>
onRanks(int size, const std::function<std::vector<torch::Tensor>(Collectives &, int)> &part) {
  LoopbackMailbox mailbox;
  std::vector<std::vector<torch::Tensor>> perRank(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r)
    ranks.emplace_back([&, r] {
      try {
        LoopbackCollectives group(mailbox, r, size);
        perRank[r] = part(group, r);
      } catch (const std::exception &e) {
        errors[r] = e.what();
      }
    });
  for (std::thread &t : ranks)
    t.join();
  std::string all;
  for (const std::string &e : errors)
    all += e;
  EXPECT_EQ(all, "");
  return perRank;
}

/// The ranks' [output, input gradient, LoRA gradients...] against one
/// process's: outputs and input gradients joined along the sequence, LoRA
/// gradients summed; each within 1e-5 and reaching its tensor.
void expectRanksMatchOneProcess(const std::vector<std::vector<torch::Tensor>> &perRank,
                                const std::vector<torch::Tensor> &whole, const std::string &name) {
  for (const std::vector<torch::Tensor> &mine : perRank)
    ASSERT_EQ(mine.size(), whole.size());
  const std::string cp = " CP" + std::to_string(perRank.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    std::vector<torch::Tensor> parts;
    for (const std::vector<torch::Tensor> &mine : perRank)
      parts.push_back(mine[i]);
    const torch::Tensor joined = i < 2 ? torch::cat(parts, 1) : torch::stack(parts).sum(0);
    const std::string what = name + cp + (i == 0 ? " output" : i == 1 ? " input gradient" : " LoRA gradient " +
                                                                                             std::to_string(i - 2));
    ASSERT_GT(whole[i].abs().max().item<double>(), 0.0) << what;
    expectWithin(what, relError(joined, whole[i]), 1e-5);
  }
}

/// Two ranks, each its half of a 66-token sequence in segments of 16 (a
/// 1-token last segment, shorter than the convolution's tail), against one
/// process over the whole sequence in one pass: outputs and input gradients
/// joined, adapter gradients summed (two partial sums: a little more
/// rounding). Measured (ADAPT_PRINT_MARGINS=1): 1.7e-7 to 1.4e-6; bound 1e-5
/// (7x over the worst, a KDA LoRA gradient). A state or tail not exchanged
/// moves the second rank's results by O(1).
template <typename Layer> void expectContextParallelSegmentsMatch(const Layer &layer, const std::string &name) {
  torch::Tensor x = torch::randn({2, 66, kHidden});
  torch::Tensor cot = torch::randn({2, 66, kHidden});
  const std::vector<torch::Tensor> whole = valueAndGradients(layer, x, cot, 0);

  const auto perRank = onRanks(2, [&](Collectives &group, int r) {
    Layer mine = withOwnAdapters(layer);
    mine.context = ContextSplit{&group, r, 2};
    return valueAndGradients(mine, x.narrow(1, 33 * r, 33), cot.narrow(1, 33 * r, 33), 16);
  });
  expectRanksMatchOneProcess(perRank, whole, name);
}

/// The mission's 3:1 block at test size: three Gated DeltaNet layers, then
/// one DeepSeek sparse attention layer, each added to the residual stream.
/// LoRA on every delta-rule projection and on the sparse layer's kv_b and o.
struct HybridBlock {
  std::vector<GatedDeltaNetLayer> deltas;
  AttentionLayer sparse;

  std::vector<LoraLinear *> adapted() {
    std::vector<LoraLinear *> all;
    for (GatedDeltaNetLayer &g : deltas)
      for (LoraLinear *l : g.linears())
        all.push_back(l);
    all.push_back(&sparse.kvB);
    all.push_back(&sparse.o);
    return all;
  }
  /// A copy whose adapters are fresh leaves with the same values.
  HybridBlock withOwnAdapters() const {
    HybridBlock copy = *this;
    for (LoraLinear *l : copy.adapted()) {
      l->loraA = l->loraA.detach().clone().requires_grad_();
      l->loraB = l->loraB.detach().clone().requires_grad_();
    }
    return copy;
  }
  /// The output, the input's gradient and every LoRA factor's gradient for
  /// \p x at global positions \p first onwards, delta-rule segments of 16;
  /// with \p recomputed each layer runs again in the backward pass (the
  /// trainer's --recompute), its context exchange included.
  std::vector<torch::Tensor> valueAndGradients(const torch::Tensor &x0, const torch::Tensor &cot, int64_t first,
                                               bool recomputed = false) {
    torch::Tensor x = x0.clone().requires_grad_();
    RopeTables rope = ropeTablesAt(sparse.def.rope, first, x.size(1), torch::kCPU);
    auto layer = [recomputed](const RecomputedFunction &body, const torch::Tensor &in) {
      return recomputed ? recompute(body, in) : body(in);
    };
    torch::Tensor h = x;
    for (GatedDeltaNetLayer &g : deltas) {
      g.def.segmentTokens = 16;
      h = layer([&g](const torch::Tensor &in) { return in + g.forward(in, /*training=*/true); }, h);
    }
    h = layer([&](const torch::Tensor &in) { return in + sparseMlaForward(sparse, in, rope, /*training=*/true); }, h);
    h.backward(cot);
    std::vector<torch::Tensor> all{h.detach(), x.grad().clone()};
    for (LoraLinear *l : adapted())
      for (torch::Tensor *t : {&l->loraA, &l->loraB})
        all.push_back(t->grad().clone());
    return all;
  }
};

HybridBlock hybridBlock() {
  HybridBlock b;
  for (int i = 0; i < 3; ++i)
    b.deltas.push_back(gatedDeltaNet());
  b.sparse = adapt::rt::test::sparseMlaLayer(kHidden, /*indexerPairs=*/false);
  const int64_t kvOut = b.sparse.kvB.weight.size(0), oIn = b.sparse.o.weight.size(1);
  b.sparse.kvB = adapted(kvOut, b.sparse.kvB.weight.size(1));
  b.sparse.o = adapted(kHidden, oIn);
  return b;
}

} // namespace

/// Both delta-rule kinds (Gated DeltaNet's scalar decay, Kimi's per-channel
/// one); each check names the kind it failed for.
TEST(LinearLayers, SegmentsMatchOnePass) {
  torch::manual_seed(3);
  expectSegmentsMatchOnePass(gatedDeltaNet(), "gated deltanet");
  torch::manual_seed(4);
  expectSegmentsMatchOnePass(kimiDelta(), "kimi delta");
}

TEST(LinearLayers, ContextParallelSegmentsMatchOnePass) {
  torch::manual_seed(5);
  expectContextParallelSegmentsMatch(gatedDeltaNet(), "gated deltanet");
  torch::manual_seed(6);
  expectContextParallelSegmentsMatch(kimiDelta(), "kimi delta");
}

/// Lightning attention under CP runs every part from a zero state at once and
/// adds the entering state's share from one all-gather of the parts' leaving
/// states (LightningLayer.cpp), where the delta rule's layers chain them. On
/// 2 and 3 ranks (the third sums two earlier states, decayed over the part
/// between), 66 tokens in parts of 33 and 22 (blocks of 8, the last ragged):
/// as one process, outputs and input gradients joined, LoRA gradients summed.
/// Measured (ADAPT_PRINT_MARGINS=1): 1.0e-7 to 3.7e-7; bound 1e-5 as the
/// delta rule's (27x over the worst). The entering state dropped: errors
/// 0.5 to 0.8; decayed over one token too few a part: 1.3e-3 to 2e-3 (CP3).
TEST(LinearLayers, LightningContextParallelMatchesOneProcess) {
  torch::manual_seed(7);
  const LightningLayer layer = lightning();
  const torch::Tensor x = torch::randn({2, 66, kHidden}), cot = torch::randn({2, 66, kHidden});
  const std::vector<torch::Tensor> whole = valueAndGradients(layer, x, cot, 0);
  for (int ranks : {2, 3}) {
    const int64_t part = 66 / ranks;
    const auto perRank = onRanks(ranks, [&](Collectives &group, int r) {
      LightningLayer mine = withOwnAdapters(layer);
      mine.context = ContextSplit{&group, r, ranks};
      return valueAndGradients(mine, x.narrow(1, part * r, part), cot.narrow(1, part * r, part), 0);
    });
    expectRanksMatchOneProcess(perRank, whole, "lightning");
  }
}

namespace {

/// The hybrid block's 64 tokens on two CP ranks (each layer recomputed in the
/// backward pass when \p recomputed) against one process, not recomputed.
void expectHybridBlockOnTwoRanksMatches(bool recomputed) {
  torch::manual_seed(9);
  const int64_t kPart = 32; // a whole number of chunks of 8 (see below)
  HybridBlock block = hybridBlock();
  torch::Tensor x = torch::randn({2, 2 * kPart, kHidden});
  torch::Tensor cot = torch::randn({2, 2 * kPart, kHidden});
  const std::vector<torch::Tensor> whole = block.withOwnAdapters().valueAndGradients(x, cot, 0);
  const auto perRank = onRanks(2, [&](Collectives &group, int r) {
    HybridBlock mine = block.withOwnAdapters();
    for (GatedDeltaNetLayer &g : mine.deltas)
      g.context = ContextSplit{&group, r, 2};
    mine.sparse.context = ContextSplit{&group, r, 2};
    return mine.valueAndGradients(x.narrow(1, kPart * r, kPart), cot.narrow(1, kPart * r, kPart), kPart * r,
                                  recomputed);
  });
  expectRanksMatchOneProcess(perRank, whole, recomputed ? "hybrid, recomputed" : "hybrid");
}

} // namespace

/// The 3:1 hybrid block on two context-parallel ranks (threads, an
/// in-process group) against one process over the whole 64-token sequence:
/// each rank runs its 32 tokens, the delta-rule layers in segments of 16
/// from the state and tail the previous rank sends, the sparse layer's
/// indexer over every rank's keys (the later ones masked) and its attention
/// over the earlier ranks' latents. Outputs and input gradients joined,
/// adapter gradients summed. A missing exchange, a query offset not applied
/// (RoPE, the causal mask, the indexer's positions) or a selection that
/// differs from one process moves the second rank's results by O(1).
/// The parts are whole chunks of 8, so both runs take the same fp32 chunk
/// paths: measured (ADAPT_PRINT_MARGINS=1) up to 3.1e-7; bound 1e-5 (32x).
/// Parts that split a chunk (33 tokens) take other, equally exact, fp32
/// paths through four stacked layers and land at up to 1.1e-5; the ragged
/// boundary itself is covered per layer by the tests above.
TEST(HybridBlock, ContextParallelMatchesOneProcess) { expectHybridBlockOnTwoRanksMatches(/*recomputed=*/false); }

/// The same block with every layer recomputed in the backward pass on each
/// rank (the trainer's --recompute with --cp): the recomputation receives
/// the previous rank's state again (which that rank sends again from its own
/// recomputation) and gathers the sparse layer's keys again, and the state
/// gradients go back once. Against the same one process, not recomputed:
/// measured (ADAPT_PRINT_MARGINS=1) up to 2.76e-7, as the test above, since
/// recomputation repeats the same fp32 operations; bound 1e-5 (36x).
TEST(HybridBlock, ContextParallelWithRecomputationMatchesOneProcess) {
  expectHybridBlockOnTwoRanksMatches(/*recomputed=*/true);
}

/// What lets one delta-rule layer train at 512K and 1M tokens: in segments
/// it keeps, between forward and backward, its output and at each segment's
/// end the carried convolution tail and fp32 state (CarriedState), plus the
/// random generator's state recompute() saves per segment. Nothing per
/// token of the mixer's inner widths: one pass over the same 128 tokens
/// keeps ~13x more here (~4.6 KB against 344 B per token, at toy widths;
/// the real widths widen that gap). Counted exactly on the CPU (the same
/// graph keeps the same tensors on the GPU, where the generator's state is
/// smaller); the bound allows 1 % for LibTorch's own small allocations. A
/// segment's projections or chunk intermediates kept by mistake add
/// kilobytes per token and fail it.
TEST(LinearLayers, SegmentsKeepOnlyTheOutputAndTheCarriedStates) {
  torch::manual_seed(21);
  const int64_t batch = 2, tokens = 128, segment = 16, segments = tokens / segment;
  GatedDeltaNetLayer g = gatedDeltaNet();
  const LinearAttentionDef &d = g.def;
  const int64_t rngStateBytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  const int64_t carriedBytes = 4 * batch * ((d.convKernel - 1) * g.conv.size(0) + d.valueHeads * d.keyHeadDim *
                                                                                      d.valueHeadDim);
  const int64_t stated = 4 * batch * tokens * kHidden + segments * (carriedBytes + rngStateBytes);
  auto keptBytes = [&](int64_t segmentTokens) {
    g.def.segmentTokens = segmentTokens;
    torch::Tensor x = torch::randn({batch, tokens, kHidden}).requires_grad_();
    test::CountCpuAllocations count;
    torch::Tensor out = g.forward(x, /*training=*/true);
    return count.liveBytes();
  };
  const int64_t segmented = keptBytes(segment), onePass = keptBytes(0);
  EXPECT_GE(segmented, stated);
  EXPECT_LE(segmented, stated + stated / 100) << "kept " << segmented << " bytes, the stated tensors are " << stated;
  // What the segments are for: one pass keeps the delta rule's fp32 inputs,
  // T, the chunks' entering states and V_new (its node's backward is written
  // out; the composition's autograd kept over 10x the segments' bytes here,
  // the node ~6x), besides the layer's projections.
  EXPECT_GT(onePass, 4 * segmented);
  // And the node keeps no more than that (6.4x measured; allocation counts
  // are deterministic): a saved intermediate too many shows here.
  EXPECT_LT(onePass, 8 * segmented) << "one pass kept " << onePass << " bytes";
}

/// In bf16 training the delta rule gets bf16 q, k and v with unit-stride
/// rows, what its CUDA kernels take: with fp32 q and k, and rows strided by
/// T after the convolution, every Gated DeltaNet and Kimi layer fell back to
/// the LibTorch composition. q and k are still normalised in fp32 (unit rows
/// to bf16's rounding), and an fp32 layer stays fp32.
TEST(LinearLayers, DeltaInputsKeepTheActivationsDtype) {
  torch::manual_seed(3);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  // q, k, v as the layers split them from the convolution's [B, T, C] output.
  torch::Tensor mixed = causalConv1dSilu(torch::randn({2, 5, 6 * 16 + 3 * 8}, bf16),
                                         torch::randn({6 * 16 + 3 * 8, 1, 4}, bf16));
  ASSERT_TRUE(mixed.is_contiguous());
  auto parts = torch::split_with_sizes(mixed, {3 * 16, 3 * 16, 3 * 8}, -1);
  torch::Tensor q = parts[0].reshape({2, 5, 3, 16}) * 4, k = parts[1].reshape({2, 5, 3, 16}),
                v = parts[2].reshape({2, 5, 3, 8});
  torch::Tensor g = -torch::rand({2, 5, 3}), beta = torch::rand({2, 5, 3}, bf16);
  const DeltaRuleInputs in = deltaInputs(q, k, v, g, beta);
  for (const torch::Tensor *x : {&in.query, &in.key, &in.value}) {
    EXPECT_EQ(x->scalar_type(), torch::kBFloat16);
    EXPECT_EQ(x->stride(3), 1);
  }
  EXPECT_EQ(in.query.sizes(), (std::vector<int64_t>{2, 3, 5, 16}));
  EXPECT_EQ(in.decay.sizes(), (std::vector<int64_t>{2, 3, 5}));
  // The fp32 normalisation rounded once: within bf16's half ulp (2^-9) of it.
  torch::Tensor exact = l2Normalize(q.to(torch::kFloat32)).transpose(1, 2);
  EXPECT_LE((in.query.to(torch::kFloat32) - exact).abs().max().item<double>(), std::ldexp(1.0, -9));
  torch::Tensor norms = in.key.to(torch::kFloat32).pow(2).sum(-1).sqrt();
  EXPECT_LE((norms - 1).abs().max().item<double>(), 0.01); // 16 values each off by <= 2^-9 relative
  const DeltaRuleInputs f32 = deltaInputs(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), g,
                                          beta.to(torch::kFloat32));
  EXPECT_EQ(f32.query.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(f32.query, exact));
}
