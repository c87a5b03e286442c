//===- CountParameters.cpp - total and active parameters ------------------===//

#include "ir/AdaptDialect.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace adapt {
#define GEN_PASS_DEF_COUNTPARAMETERSPASS
#include "passes/Passes.h.inc"
} // namespace adapt

using namespace mlir;

namespace adapt {
namespace {

/// Where a component's parameters are booked.
std::string bucketOf(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::string>(op)
      .Case<EmbeddingOp>([](auto) { return "embedding"; })
      .Case<LMHeadOp>([](auto) { return "lm_head"; })
      .Case<MTPOp>([](auto) { return "mtp"; })
      .Case<EncoderOp>([](EncoderOp encoder) { return encoder.getModality().str() + "_encoder"; })
      .Case<AttentionOp, SparseAttentionOp, LinearAttentionOp>([](auto) { return "attention"; })
      .Case<MoEOp>([](auto) { return "moe"; })
      .Case<MLPOp>([](auto) { return "mlp"; })
      .Case<RMSNormOp>([](auto) { return "norm"; })
      .Default([](Operation *) { return "other"; });
}

/// Adds N to SUM unless that overflows int64; then sets OVERFLOWED. Sizes
/// are bounded where they are read (parser/SizeLimits.h, the ONNX reader's
/// per-tensor check), but a sum of many bounded tensors is checked here too,
/// so a hostile file can never make a count wrap to a negative number.
void addChecked(int64_t &sum, int64_t n, bool &overflowed) {
  if (__builtin_add_overflow(sum, n, &sum))
    overflowed = true;
}

/// Sums a component's weights; routed ones count top_k / num_experts active.
std::pair<int64_t, int64_t> countComponent(Operation *op, ArrayAttr weights,
                                           SymbolTable &symbols, bool &overflowed) {
  int64_t total = 0, active = 0;
  int64_t topK = 0, experts = 1;
  if (auto moe = dyn_cast<MoEOp>(op)) {
    topK = moe.getTopK();
    experts = moe.getNumExperts();
  } else if (auto mtp = dyn_cast<MTPOp>(op)) {
    // MTP blocks reuse the decoder's routing: find any MoE for top_k.
    if (auto moe = *op->getParentOp()->getRegion(0).getOps<MoEOp>().begin()) {
      topK = moe.getTopK();
      experts = moe.getNumExperts();
    }
  }
  for (Attribute attr : weights) {
    auto weight = symbols.lookup<WeightOp>(
        llvm::cast<FlatSymbolRefAttr>(attr).getValue());
    if (!weight)
      continue;
    int64_t n = 1;
    for (int64_t dim : llvm::cast<RankedTensorType>(weight.getType()).getShape())
      if (dim < 0 || __builtin_mul_overflow(n, dim, &n))
        overflowed = true;
    int64_t routedActive = 0;
    if (weight.getRouted() && experts > 0 &&
        __builtin_mul_overflow(n / experts, topK, &routedActive))
      overflowed = true;
    addChecked(total, n, overflowed);
    addChecked(active, weight.getRouted() && experts > 0 ? routedActive : n, overflowed);
  }
  return {total, active};
}

struct CountParametersPass
    : impl::CountParametersPassBase<CountParametersPass> {
  CountParametersPass() = default;
  explicit CountParametersPass(AnalysisContext context) : context(context) {}

  void runOnOperation() override { countModel(getOperation()); }

  void countModel(ModelOp model) {
    SymbolTable symbols(model);
    Builder b(model.getContext());
    ParameterCounts counts;
    int64_t mtpActive = 0, headActive = 0;
    bool overflowed = false;
    model.walk([&](Operation *op) {
      auto weights = op->getAttrOfType<ArrayAttr>("weights");
      if (!weights || isa<ModelOp>(op))
        return;
      auto [total, active] = countComponent(op, weights, symbols, overflowed);
      std::string bucket = bucketOf(op);
      if (auto head = dyn_cast<LMHeadOp>(op); head && head.getTied())
        total = 0; // The embedding owns the table; the matmul is still active.
      op->setAttr("params", b.getI64IntegerAttr(total));
      op->setAttr("active_params", b.getI64IntegerAttr(active));
      addChecked(counts.byComponent[bucket], total, overflowed);
      addChecked(counts.total, total, overflowed);
      if (bucket == "mtp") {
        addChecked(counts.mtp, total, overflowed);
        addChecked(mtpActive, active, overflowed);
      } else if (bucket.find("_encoder") != std::string::npos) {
        addChecked(counts.encoders, total, overflowed);
      } else {
        addChecked(counts.decoder, total, overflowed);
        addChecked(counts.active, active, overflowed);
        if (bucket == "embedding")
          addChecked(counts.embedding, total, overflowed);
        if (bucket == "lm_head") {
          addChecked(counts.lmHead, total, overflowed);
          addChecked(headActive, active, overflowed);
        }
      }
    });
    counts.activeWithMtp = counts.active;
    addChecked(counts.activeWithMtp, mtpActive, overflowed);
    if (overflowed) {
      model.emitError("the parameter count overflows a 64-bit integer: the "
                      "model's shapes are not those of a real model");
      return signalPassFailure();
    }
    counts.activeWithoutEmbedding = counts.active - counts.embedding;
    counts.activeNonEmbedding = counts.activeWithoutEmbedding - headActive;
    counts.decoderNonEmbedding =
        counts.decoder - counts.embedding - counts.lmHead;
    NamedAttrList summary;
    summary.append("total", b.getI64IntegerAttr(counts.total));
    summary.append("active", b.getI64IntegerAttr(counts.active));
    summary.append("decoder", b.getI64IntegerAttr(counts.decoder));
    summary.append("embedding", b.getI64IntegerAttr(counts.embedding));
    summary.append("lm_head", b.getI64IntegerAttr(counts.lmHead));
    summary.append("mtp", b.getI64IntegerAttr(counts.mtp));
    summary.append("encoders", b.getI64IntegerAttr(counts.encoders));
    model->setAttr("adapt.params", b.getDictionaryAttr(summary));
    if (context.report)
      context.report->parameters = counts;
  }

  AnalysisContext context;
};

} // namespace

std::unique_ptr<Pass> createCountParametersPass(AnalysisContext context) {
  return std::make_unique<CountParametersPass>(context);
}

} // namespace adapt
