//===- ImportModel.cpp - ModelSpec into the adapt dialect -----------------===//

#include "ir/ImportModel.h"

#include "ir/AdaptDialect.h"
#include "parser/ConfigReader.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/ErrorHandling.h"

#include <algorithm>
#include <type_traits>

using namespace mlir;

namespace adapt {
namespace {

/// The enumerator of a ModelSpec field that the config reader fills from its
/// own fixed spellings (never from config text, so every value is known).
template <typename EnumT>
EnumT knownSpelling(std::optional<EnumT> value, llvm::StringRef field) {
  if (!value)
    llvm::report_fatal_error(llvm::Twine("ModelSpec::") + field +
                             " holds a value the adapt dialect does not enumerate");
  return *value;
}

/// Builds the model body; one instance per import.
class ModelImporter {
public:
  ModelImporter(MLIRContext &context, const ModelSpec &spec)
      : context(context), spec(spec), builder(&context),
        loc(FileLineColLoc::get(&context, spec.configFile, 1, 1)) {
    if (spec.dtype == "float32")
      elementType = builder.getF32Type();
    else if (spec.dtype == "float16")
      elementType = builder.getF16Type();
    else
      elementType = builder.getBF16Type();
  }

  OwningOpRef<ModuleOp> run(const std::vector<ComponentDecl> &components) {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
    builder.setInsertionPointToEnd(module->getBody());
    std::string name = spec.modelType.empty() ? "model" : spec.modelType;
    auto model = builder.create<ModelOp>(loc, name, spec.modelType,
                                         spec.family, spec.hidden, spec.vocab,
                                         spec.architecture, /*parallel_layout=*/mlir::DenseI64ArrayAttr(),
                                         /*recompute=*/false);
    model->setAttr("adapt.dtype", builder.getStringAttr(spec.dtype));
    if (!spec.quant.method.empty()) {
      const QuantSpec &q = spec.quant;
      llvm::SmallVector<StringAttr> excluded;
      for (const std::string &e : q.excluded)
        excluded.push_back(builder.getStringAttr(e));
      llvm::SmallVector<int64_t, 2> block;
      if (q.blockRows || q.blockCols)
        block = {q.blockRows, q.blockCols};
      model->setAttr("adapt.quant", QuantAttr::get(&context, q.method, q.format, block, q.groupSize, q.bits,
                                                   excluded));
    }
    Block *body = builder.createBlock(&model.getBody());
    body->addArgument(RankedTensorType::get({ShapedType::kDynamic},
                                            builder.getI64Type()),
                      loc);
    builder.setInsertionPointToStart(body);
    declareWeights(components);
    buildGraph(components, body->getArgument(0));
    return module;
  }

private:
  RankedTensorType activation(int64_t width) {
    return RankedTensorType::get({ShapedType::kDynamic, width}, elementType);
  }

  /// One adapt.weight per declared tensor (per-expert ones stacked).
  void declareWeights(const std::vector<ComponentDecl> &components) {
    for (const ComponentDecl &component : components)
      for (const WeightDecl &w : component.weights) {
        llvm::SmallVector<int64_t> shape;
        if (w.experts > 0)
          shape.push_back(w.experts);
        shape.append(w.shape.begin(), w.shape.end());
        auto type = RankedTensorType::get(shape, elementType);
        builder.create<WeightOp>(loc, w.name, type, w.role,
                                 w.experts > 0, w.routed, w.linear,
                                 StringAttr(), StringAttr(), DictionaryAttr());
      }
  }

  ArrayAttr refs(const ComponentDecl &c, llvm::function_ref<bool(StringRef)> keep) {
    llvm::SmallVector<Attribute> out;
    for (const WeightDecl &w : c.weights)
      if (keep(w.role))
        out.push_back(FlatSymbolRefAttr::get(&context, w.name));
    return builder.getArrayAttr(out);
  }
  ArrayAttr allRefs(const ComponentDecl &c) {
    return refs(c, [](StringRef) { return true; });
  }

  Value norm(Value x, const ComponentDecl &c, StringRef role) {
    auto op = builder.create<RMSNormOp>(
        loc, x.getType(), ValueRange{x}, c.layer,
        refs(c, [&](StringRef r) { return r == role; }),
        llvm::APFloat(spec.normEps));
    // Qwen3-Next's RMSNorms scale by 1 + weight (zero-centred weights).
    if (spec.family == "qwen3_next")
      op.setZeroCentred(true);
    return op.getResult();
  }

  const LayerSpec *layerSpec(int64_t index) {
    if (index < 0 || index >= (int64_t)spec.layers.size())
      return nullptr;
    return &spec.layers[index];
  }

  Value mixer(Value x, const ComponentDecl &c) {
    const MixerSpec &m = layerSpec(c.layer)->mixer;
    auto flag = [](bool b) { return b; };
    if (c.kind == "attention" || (c.kind == "mla" && m.indexTopK == 0)) {
      bool mla = c.kind == "mla";
      AttentionKind kind = mla                         ? AttentionKind::Mla
                           : m.numKvHeads == m.numHeads ? AttentionKind::Mha
                                                        : AttentionKind::Gqa;
      const RopeSpec &r = m.rope;
      NamedAttrList attributes = component(c);
      attributes.append("kind", AttentionKindAttr::get(&context, kind));
      attributes.append("num_heads", i64(m.numHeads));
      attributes.append("num_kv_heads", i64(m.numKvHeads));
      attributes.append("head_dim", i64(m.headDim));
      attributes.append("v_head_dim", i64(m.vHeadDim));
      attributes.append("q_lora_rank", i64(m.qLoraRank));
      attributes.append("kv_lora_rank", i64(m.kvLoraRank));
      attributes.append("qk_rope_head_dim", i64(m.qkRopeDim));
      attributes.append("rope", rope(r));
      attributes.append("rope_partial", builder.getF64FloatAttr(r.partialFactor));
      attributes.append("window", WindowKindAttr::get(
                                      &context, knownSpelling(symbolizeWindowKind(m.window), "window")));
      attributes.append("window_size", i64(m.windowSize));
      if (m.qkNorm)
        attributes.append("qk_norm", builder.getUnitAttr());
      attributes.append("qk_norm_kind",
                        QkNormKindAttr::get(&context, knownSpelling(symbolizeQkNormKind(m.qkNormKind),
                                                                    "qkNormKind")));
      if (!r.mropeSection.empty())
        attributes.append("mrope_section", builder.getDenseI64ArrayAttr(r.mropeSection));
      if (m.outBias)
        attributes.append("out_bias", builder.getUnitAttr());
      appendSettings(attributes, static_cast<const rt::AttentionSettings &>(m));
      return builder.create<AttentionOp>(loc, TypeRange{x.getType()}, ValueRange{x}, attributes);
    }
    if (c.kind == "mla")
      return sparseAttention(x, c, m);
    LinearAttentionKind kind = m.kind == MixerKind::GatedDeltaNet ? LinearAttentionKind::GatedDeltaRule
                               : m.kind == MixerKind::KimiDelta   ? LinearAttentionKind::KimiDelta
                                                                  : LinearAttentionKind::Lightning;
    int64_t keyHeads = m.linearKeyHeads ? m.linearKeyHeads : m.numHeads;
    int64_t valueHeads = m.linearValueHeads ? m.linearValueHeads : m.numHeads;
    int64_t keyDim = m.linearKeyDim ? m.linearKeyDim : m.headDim;
    int64_t valueDim = m.linearValueDim ? m.linearValueDim : m.headDim;
    bool split = std::any_of(c.weights.begin(), c.weights.end(),
                             [](const WeightDecl &w) { return w.role == "in_proj_qkv"; });
    return builder.create<LinearAttentionOp>(
        loc, x.getType(), ValueRange{x}, c.layer, allRefs(c), kind, keyHeads,
        valueHeads, keyDim, valueDim, m.convKernel, flag(m.outputGate),
        m.kind == MixerKind::Lightning ? m.blockSize : 0, split);
  }

  /// An i64 attribute of \p value.
  IntegerAttr i64(int64_t value) { return builder.getI64IntegerAttr(value); }

  /// The attributes every component op has: its layer and its weights.
  NamedAttrList component(const ComponentDecl &c) {
    NamedAttrList attributes;
    attributes.append("layer", i64(c.layer));
    attributes.append("weights", allRefs(c));
    return attributes;
  }

  /// \p attributes with \p settings (rt::AttentionSettings or FfnSettings,
  /// runtime/ModelDef.h) under the attribute names visitSettings gives them:
  /// a true flag as a unit attribute (a false one left out), numbers as
  /// i64/f64, text as a string. The op's verifier checks each against its
  /// ODS declaration.
  template <typename Settings> void appendSettings(NamedAttrList &attributes, const Settings &settings) {
    rt::visitSettings(settings, [&](const char *name, const char *, const auto &value) {
      using T = std::decay_t<decltype(value)>;
      if constexpr (std::is_same_v<T, bool>) {
        if (value)
          attributes.append(name, builder.getUnitAttr());
      } else if constexpr (std::is_same_v<T, double>) {
        attributes.append(name, builder.getF64FloatAttr(value));
      } else if constexpr (std::is_same_v<T, int64_t>) {
        attributes.append(name, i64(value));
      } else {
        static_assert(std::is_same_v<T, std::string>, "a setting is a flag, a number or text");
        attributes.append(name, builder.getStringAttr(value));
      }
    });
  }

  /// \p v's op carries the unseen enumerated values that decide it as its
  /// "unseen" attribute, for the gap analysis. Returns \p v.
  Value marked(Value v, const std::vector<std::string> &unseen) {
    if (!unseen.empty()) {
      llvm::SmallVector<Attribute> values;
      for (const std::string &u : unseen)
        values.push_back(builder.getStringAttr(u));
      v.getDefiningOp()->setAttr("unseen", builder.getArrayAttr(values));
    }
    return v;
  }

  /// The #adapt.rope of \p r, shared by both attention ops.
  RopeAttr rope(const RopeSpec &r) {
    auto f64 = [](double v) { return llvm::APFloat(v); };
    return RopeAttr::get(&context, r.type, f64(r.theta), r.interleaved, f64(r.factor),
                         r.originalMaxPositions, f64(r.betaFast), f64(r.betaSlow), f64(r.mscale),
                         f64(r.mscaleAllDim), r.truncate, f64(r.lowFreqFactor),
                         f64(r.highFreqFactor));
  }

  /// DeepSeek sparse attention: MLA's shape and RoPE plus the indexer's.
  Value sparseAttention(Value x, const ComponentDecl &c, const MixerSpec &m) {
    return builder.create<SparseAttentionOp>(
        loc, x.getType(), ValueRange{x}, c.layer, allRefs(c), m.numHeads,
        m.headDim, m.vHeadDim, m.qLoraRank, m.kvLoraRank, m.qkRopeDim,
        rope(m.rope), m.indexHeads, m.indexHeadDim, m.indexTopK,
        llvm::APFloat(m.softmaxScale), m.outBias, m.indexRopeInterleaved, m.reusesIndexer);
  }

  Value ffn(Value x, const ComponentDecl &c) {
    const FfnSpec &f = layerSpec(c.layer)->ffn;
    if (c.kind == "mlp")
      return builder.create<MLPOp>(loc, x.getType(), ValueRange{x}, c.layer,
                                   allRefs(c), f.intermediate, f.activation);
    NamedAttrList attributes = component(c);
    attributes.append("num_experts", i64(f.numExperts));
    attributes.append("top_k", i64(f.topK));
    attributes.append("expert_intermediate", i64(f.expertIntermediate));
    attributes.append("num_shared", i64(f.numShared));
    attributes.append("shared_intermediate", i64(f.sharedIntermediate));
    attributes.append("scoring", builder.getStringAttr(f.scoring));
    attributes.append("activation", builder.getStringAttr(f.activation));
    attributes.append("routing",
                      RoutingAttr::get(&context, knownSpelling(symbolizeRouting(f.routing), "routing")));
    attributes.append("fused_layout",
                      FusedLayoutAttr::get(&context, f.fusedLayout.empty()
                                                         ? FusedLayout::None
                                                         : knownSpelling(symbolizeFusedLayout(f.fusedLayout),
                                                                         "fusedLayout")));
    if (f.sharedGate)
      attributes.append("shared_gate", builder.getUnitAttr());
    attributes.append("swiglu_limit", builder.getF64FloatAttr(f.swigluLimit));
    attributes.append("swiglu_alpha", builder.getF64FloatAttr(f.swigluAlpha));
    appendSettings(attributes, static_cast<const rt::FfnSettings &>(f));
    return builder.create<MoEOp>(loc, TypeRange{x.getType()}, ValueRange{x}, attributes);
  }

  /// The residual add after a sublayer: x + update, or MiniMax's
  /// alpha * r + beta * update with r = the normalised input \p normed under
  /// postnorm (alpha/beta attributes only where they are not 1).
  Value residual(Value x, Value normed, Value update, int64_t layer,
                 bool attention) {
    const LayerSpec *l = layerSpec(layer);
    double alpha = l ? (attention ? l->attentionAlpha : l->ffnAlpha) : 1.0;
    double beta = l ? (attention ? l->attentionBeta : l->ffnBeta) : 1.0;
    llvm::SmallVector<NamedAttribute, 2> scales;
    if (alpha != 1.0)
      scales.push_back(builder.getNamedAttr("residual_alpha",
                                            builder.getF64FloatAttr(alpha)));
    if (beta != 1.0)
      scales.push_back(builder.getNamedAttr("residual_beta",
                                            builder.getF64FloatAttr(beta)));
    Value kept = l && l->postNorm ? normed : x;
    return builder.create<AddOp>(loc, ValueRange{kept, update}, scales);
  }

  /// The dataflow: embedding, per layer pre-norm mixer and FFN with
  /// residual adds, final norm, LM head, then MTP and encoders.
  void buildGraph(const std::vector<ComponentDecl> &components, Value tokens) {
    Value x, logits;
    llvm::SmallVector<Value> outputs;
    const ComponentDecl *pendingNorm = nullptr;
    for (const ComponentDecl &c : components) {
      if (c.kind == "embedding") {
        x = builder.create<EmbeddingOp>(loc, activation(spec.hidden),
                                        ValueRange{tokens}, c.layer,
                                        allRefs(c));
      } else if (c.kind == "norm" && c.layer >= 0) {
        pendingNorm = &c;
      } else if (c.kind == "norm") {
        x = norm(x, c, "norm");
      } else if (c.kind == "attention" || c.kind == "mla" ||
                 c.kind == "gated_delta_net" || c.kind == "kimi_delta" ||
                 c.kind == "lightning") {
        Value h = norm(x, *pendingNorm, "input_layernorm");
        x = residual(x, h, marked(mixer(h, c), layerSpec(c.layer)->mixer.unseen), c.layer, /*attention=*/true);
      } else if (c.kind == "moe" || c.kind == "mlp") {
        Value h = norm(x, *pendingNorm, "post_attention_layernorm");
        x = residual(x, h, marked(ffn(h, c), layerSpec(c.layer)->ffn.unseen), c.layer, /*attention=*/false);
      } else if (c.kind == "lm_head") {
        logits = builder.create<LMHeadOp>(loc, activation(spec.vocab),
                                          ValueRange{x}, c.layer, allRefs(c),
                                          false);
      } else if (c.kind == "mtp") {
        outputs.push_back(builder.create<MTPOp>(
            loc, activation(spec.vocab), ValueRange{x}, c.layer, allRefs(c),
            c.layer - (int64_t)spec.layers.size() + 1));
      } else if (c.kind == "vision_encoder" || c.kind == "audio_encoder") {
        const EncoderSpec *e = nullptr;
        for (const EncoderSpec &candidate : spec.encoders)
          if (c.kind == candidate.modality + "_encoder")
            e = &candidate;
        auto encoder = builder.create<EncoderOp>(
            loc, activation(e->outHidden), ValueRange{}, c.layer, allRefs(c),
            e->modality, e->type, e->depth, e->hidden, e->numHeads,
            e->intermediate, e->patchSize, e->temporalPatch, e->inChannels,
            e->spatialMerge, e->numPositions, e->outHidden,
            e->deepstackLayers.empty()
                ? DenseI64ArrayAttr()
                : builder.getDenseI64ArrayAttr(e->deepstackLayers),
            e->activation, e->imageTokenId, llvm::APFloat(e->ropeTheta));
        outputs.push_back(encoder);
      }
    }
    if (!logits) {
      // Tied embeddings: the head reads the embedding table.
      llvm::SmallVector<Attribute> table;
      for (const ComponentDecl &c : components)
        if (c.kind == "embedding")
          table.push_back(FlatSymbolRefAttr::get(&context, c.weights[0].name));
      logits = builder.create<LMHeadOp>(loc, activation(spec.vocab),
                                        ValueRange{x}, -1,
                                        builder.getArrayAttr(table),
                                        true);
    }
    outputs.insert(outputs.begin(), logits);
    builder.create<OutputOp>(loc, outputs);
  }

  MLIRContext &context;
  const ModelSpec &spec;
  OpBuilder builder;
  Location loc;
  Type elementType;
};

} // namespace

OwningOpRef<ModuleOp> importModel(MLIRContext &context, const ModelSpec &spec,
                                  const std::vector<ComponentDecl> &components) {
  context.getOrLoadDialect<AdaptDialect>();
  return ModelImporter(context, spec).run(components);
}

} // namespace adapt
