//===- ApplyPlan.cpp - record adapt plan's layout on the model ------------===//
//
// The compiler's half of `adapt build --plan`: the chosen layout becomes
// attributes of adapt.model, after the same legality checks the runtime
// makes at start-up (runtime/Distributed.h, checkLayout), so that a plan made
// for another model, or edited by hand, fails here with the op that refuses
// it instead of on the cluster.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"

namespace adapt {
#define GEN_PASS_DEF_APPLYPLANPASS
#include "passes/Passes.h.inc"
} // namespace adapt

using namespace mlir;

namespace adapt {
namespace {

struct ApplyPlanPass : impl::ApplyPlanPassBase<ApplyPlanPass> {
  using ApplyPlanPassBase::ApplyPlanPassBase;

  void runOnOperation() override {
    if (failed(apply(getOperation())))
      signalPassFailure();
  }

  LogicalResult apply(ModelOp model) {
    const int64_t sizes[] = {tp, ep, pp, cp, dp};
    for (int64_t size : sizes)
      if (size < 1)
        return model.emitError() << "parallel sizes must be >= 1, got tp=" << int64_t(tp) << " ep=" << int64_t(ep)
                                 << " pp=" << int64_t(pp) << " cp=" << int64_t(cp) << " dp=" << int64_t(dp);
    int64_t mixers = 0;
    WalkResult walk = model.walk([&](Operation *op) -> WalkResult {
      if (auto attention = dyn_cast<AttentionOp>(op)) {
        ++mixers;
        if (tp > 1 && attention.getKind() == AttentionKind::Mla)
          return attention.emitError() << "TP " << int64_t(tp) << ": the runtime splits softmax GQA/MHA heads only";
        if (tp > 1 && (attention.getNumHeads() % tp || attention.getNumKvHeads() % tp))
          return attention.emitError() << "TP " << int64_t(tp) << " must divide the " << attention.getNumHeads()
                                       << " query and " << attention.getNumKvHeads() << " key/value heads";
      } else if (auto sparse = dyn_cast<SparseAttentionOp>(op)) {
        ++mixers;
        if (tp > 1 || cp > 1)
          return sparse.emitError() << "DSA sparse attention runs without TP and CP (plan: tp=" << int64_t(tp)
                                    << " cp=" << int64_t(cp) << ")";
      } else if (auto linear = dyn_cast<LinearAttentionOp>(op)) {
        ++mixers;
        if (tp > 1)
          return linear.emitError() << "TP " << int64_t(tp) << ": the runtime does not split linear attention";
      } else if (auto moe = dyn_cast<MoEOp>(op)) {
        if (moe.getNumExperts() % ep)
          return moe.emitError() << "EP " << int64_t(ep) << " must divide the " << moe.getNumExperts()
                                 << " routed experts";
      }
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return failure();
    if (pp > std::max<int64_t>(mixers, 1))
      return model.emitError() << "PP " << int64_t(pp) << " exceeds the " << mixers << " decoder layers";
    model.setParallelLayout(ArrayRef<int64_t>(sizes));
    model.setRecompute(recompute);
    return success();
  }
};

} // namespace
} // namespace adapt
