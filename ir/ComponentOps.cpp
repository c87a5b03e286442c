//===- ComponentOps.cpp - verifiers of the component ops ------------------===//
//
// Each component checks its weights' shapes against its hyper-parameters,
// so an importer bug or a hand-edited IR file cannot describe a model that
// does not exist.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"

using namespace mlir;

namespace adapt {
namespace {
constexpr int64_t kAny = ShapedType::kDynamic;

/// The shared part of every component's symbol verification.
template <typename OpT>
FailureOr<llvm::StringMap<WeightOp>> weightsOf(OpT op,
                                               SymbolTableCollection &symbols) {
  return lookupComponentWeights(op.getOperation(), op.getWeights(), symbols);
}

/// Ops without shape rules beyond "every weight exists".
template <typename OpT>
LogicalResult verifyWeightsExist(OpT op, SymbolTableCollection &symbols) {
  return failure(failed(weightsOf(op, symbols)));
}
} // namespace

LogicalResult EmbeddingOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto weights = weightsOf(*this, symbols);
  if (failed(weights))
    return failure();
  auto model = (*this)->getParentOfType<ModelOp>();
  return expectWeightShape(*this, *weights, "embed_tokens",
                           {model ? model.getVocab() : kAny,
                            model ? model.getHidden() : kAny});
}

LogicalResult RMSNormOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}

LogicalResult AttentionOp::verify() {
  if (getNumHeads() % getNumKvHeads() != 0)
    return emitOpError("num_heads must be a multiple of num_kv_heads");
  if (getKind() == AttentionKind::Mla && getKvLoraRank() == 0)
    return emitOpError("mla needs kv_lora_rank > 0");
  return success();
}

LogicalResult AttentionOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto w = weightsOf(*this, symbols);
  if (failed(w))
    return failure();
  int64_t h = componentHidden(*this);
  int64_t heads = getNumHeads(), hd = getHeadDim(), vd = getVHeadDim();
  if (getKind() == AttentionKind::Mla) {
    int64_t nope = hd - getQkRopeHeadDim();
    return expectWeightShapes(*this, *w,
        {{"kv_b_proj", {heads * (nope + vd), getKvLoraRank()}},
         {"kv_a_proj_with_mqa", {getKvLoraRank() + getQkRopeHeadDim(), h}},
         {"q_b_proj", {heads * hd, getQLoraRank()}},
         {"o_proj", {h, heads * vd}}});
  }
  int64_t qOut = heads * hd * (getOutputGate() ? 2 : 1);
  int64_t kvOut = getNumKvHeads() * hd;
  return expectWeightShapes(*this, *w,
      {{"q_proj", {qOut, h}},
       {"k_proj", {kvOut, h}},
       {"v_proj", {kvOut, h}},
       {"o_proj", {h, heads * vd}},
       {"sinks", {heads}}});
}

LogicalResult SparseAttentionOp::verify() {
  if (getQkRopeHeadDim() >= getHeadDim())
    return emitOpError("qk_rope_head_dim must be smaller than head_dim");
  return success();
}

LogicalResult
SparseAttentionOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto w = weightsOf(*this, symbols);
  if (failed(w))
    return failure();
  int64_t h = componentHidden(*this);
  int64_t heads = getNumHeads(), nope = getHeadDim() - getQkRopeHeadDim();
  int64_t qIn = getQLoraRank() > 0 ? getQLoraRank() : h;
  if (getReusesIndexer()) // No indexer of its own: the previous full layer's top-k.
    return expectWeightShape(*this, *w, "kv_b_proj", {heads * (nope + getVHeadDim()), getKvLoraRank()});
  return expectWeightShapes(*this, *w,
      {{"kv_b_proj", {heads * (nope + getVHeadDim()), getKvLoraRank()}},
       {"indexer.wq_b", {getIndexHeads() * getIndexHeadDim(), qIn}},
       {"indexer.wk", {getIndexHeadDim(), h}},
       {"indexer.weights_proj", {getIndexHeads(), h}}});
}

LogicalResult LinearAttentionOp::verify() {
  if (getValueHeads() % getKeyHeads() != 0)
    return emitOpError("value_heads must be a multiple of key_heads");
  return success();
}

LogicalResult
LinearAttentionOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto w = weightsOf(*this, symbols);
  if (failed(w))
    return failure();
  int64_t h = componentHidden(*this);
  int64_t keyDim = getKeyHeads() * getKeyHeadDim();
  int64_t valueDim = getValueHeads() * getValueHeadDim();
  if (getKind() == LinearAttentionKind::Lightning)
    return expectWeightShapes(*this, *w,
        {{"qkv_proj", {3 * valueDim, h}},
         {"output_gate", {valueDim, h}},
         {"norm", {valueDim}},
         {"out_proj", {h, valueDim}}});
  if (getKind() == LinearAttentionKind::GatedDeltaRule)
    return expectWeightShapes(*this, *w,
        {{"in_proj_qkvz", {2 * keyDim + 2 * valueDim, h}},
         {"in_proj_qkv", {2 * keyDim + valueDim, h}},
         {"out_proj", {h, valueDim}}});
  return expectWeightShapes(*this, *w,
      {{"q_proj", {keyDim, h}},
       {"o_proj", {h, valueDim}}});
}

LogicalResult MoEOp::verify() {
  if (getTopK() > getNumExperts())
    return emitOpError("top_k (") << getTopK() << ") exceeds num_experts ("
                                  << getNumExperts() << ")";
  if (getNumExperts() % getNumGroups() != 0)
    return emitOpError("num_experts must be divisible by num_groups");
  if (getTopkGroups() > getNumGroups())
    return emitOpError("topk_groups exceeds num_groups");
  // scoring is open: a value no library variant knows is a gap (the gap
  // analysis reports it missing), not an inconsistent model.
  return success();
}

LogicalResult MoEOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto w = weightsOf(*this, symbols);
  if (failed(w))
    return failure();
  int64_t h = componentHidden(*this);
  for (auto &entry : *w) {
    WeightOp weight = entry.second;
    if (!weight.getRouted())
      continue;
    auto type = llvm::cast<RankedTensorType>(weight.getType());
    if (type.getShape().front() != getNumExperts())
      return emitOpError() << "routed weight " << weight.getSymName()
                           << " has " << type.getShape().front()
                           << " experts but num_experts is "
                           << getNumExperts();
  }
  return expectWeightShapes(*this, *w,
      {{"gate", {getNumExperts(), h}},
       {"router", {getNumExperts(), h}}});
}

LogicalResult MLPOp::verify() { return success(); }

LogicalResult MLPOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto w = weightsOf(*this, symbols);
  if (failed(w))
    return failure();
  int64_t h = componentHidden(*this);
  return expectWeightShapes(*this, *w,
      {{"gate_proj", {getIntermediate(), h}},
       {"down_proj", {h, getIntermediate()}}});
}

LogicalResult MTPOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}
LogicalResult EncoderOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}
LogicalResult LMHeadOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}
LogicalResult UnmappedOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}
LogicalResult
GenericComponentOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyWeightsExist(*this, symbols);
}

} // namespace adapt
