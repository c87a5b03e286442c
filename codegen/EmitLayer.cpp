//===- EmitLayer.cpp - one decoder layer of a generated trainer ----------===//
//
// LayerWriter turns one decoder layer's mixer and FFN ops into the runtime's
// LayerDef assignments (runtime/ModelDef.h), and fails on what ModelDef
// cannot express; plus the text helpers codegen/ shares (EmitLayer.h).
//
//===----------------------------------------------------------------------===//

#include "codegen/EmitLayer.h"
#include "codegen/EmitTrainer.h"
#include "ir/AdaptDialect.h"
#include "models/LoraTargets.h"
#include "runtime/ModelDef.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

using namespace mlir;

namespace adapt::codegen {

std::string quote(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if ((unsigned char)c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\%03o", (unsigned char)c);
        out += buf;
      } else {
        out += c;
      }
    }
  }
  return out + "\"";
}

std::string formatInt(int64_t value) { return std::to_string(value); }

/// "0-2, 5, 7-9"; a stride as "1, 5, ..., 45".
std::string formatRanges(const std::vector<int64_t> &layers) {
  if (layers.size() >= 4 && layers[1] - layers[0] > 1) {
    bool strided = true;
    for (size_t i = 2; i < layers.size(); ++i)
      strided &= layers[i] - layers[i - 1] == layers[1] - layers[0];
    if (strided)
      return std::to_string(layers[0]) + ", " + std::to_string(layers[1]) +
             ", ..., " + std::to_string(layers.back());
  }
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1)
      ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(layers[i]);
    if (j > i)
      out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}


std::vector<RoleName> weightsOf(mlir::Operation *op, mlir::SymbolTable &symbols) {
  std::vector<RoleName> out;
  if (auto refs = op->getAttrOfType<ArrayAttr>("weights"))
    for (Attribute a : refs)
      if (auto w = symbols.lookup<WeightOp>(
              llvm::cast<FlatSymbolRefAttr>(a).getValue()))
        out.push_back({w.getRole().str(), w.getSymName().str()});
  return out;
}


namespace {

/// The ModelDef role of an attention weight (they share the IR's names).
std::optional<std::string> attentionRole(const std::string &role) {
  static const std::set<std::string> known = {
      "q_proj",   "k_proj",        "v_proj",    "o_proj",
      "q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias",
      "q_norm",   "k_norm",        "sinks",     "q_a_proj",
      "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
      "kv_b_proj"};
  if (known.count(role))
    return role;
  return std::nullopt;
}

/// The ModelDef role of an FFN weight.
std::optional<std::string> ffnRole(const std::string &role) {
  static const std::map<std::string, std::string> renamed = {
      {"gate", "router"},
      {"router", "router"},
      {"router.bias", "router.bias"},
      {"e_score_correction_bias", "correction_bias"},
      {"experts.w1", "gate_proj"},
      {"experts.gate_proj", "gate_proj"},
      {"experts.w3", "up_proj"},
      {"experts.up_proj", "up_proj"},
      {"experts.w2", "down_proj"},
      {"experts.down_proj", "down_proj"},
      {"experts.gate_up_proj", "gate_up_proj"},
      {"experts.gate_up_proj_bias", "gate_up_proj_bias"},
      {"experts.down_proj_bias", "down_proj_bias"},
      {"shared_expert_gate", "shared_gate"},
      {"gate_proj", "gate_proj"},
      {"up_proj", "up_proj"},
      {"down_proj", "down_proj"}};
  auto it = renamed.find(role);
  if (it != renamed.end())
    return it->second;
  for (const char *shared : {"shared_experts.", "shared_expert.", "shared_mlp."}) {
    std::string prefix = shared;
    if (role.compare(0, prefix.size(), prefix) == 0) {
      std::string proj = role.substr(prefix.size());
      if (proj == "gate_proj" || proj == "up_proj" || proj == "down_proj")
        return "shared." + proj;
    }
  }
  return std::nullopt;
}

/// Writes the statements of one layer's helper; fails on what ModelDef
/// cannot express.
class LayerWriter {
public:
  LayerWriter(const LayerOps &layer, SymbolTable &symbols,
              const std::string &family)
      : layer(layer), symbols(symbols), family(family) {}

  bool write(std::string &error) {
    // The layer prefix from any of its weights.
    for (Operation *op : {layer.mixer, layer.ffn})
      for (const RoleName &w : weightsOf(op, symbols))
        if (prefix.empty())
          prefix = layerPrefixOf(w.second);
    if (prefix.empty())
      prefix = layerPrefixOf(layer.inputNorm);
    if (!prefix.empty()) {
      // "model.layers.3." -> "model.layers." + std::to_string(i) + "."
      std::string head = prefix.substr(0, prefix.size() - 1);
      head = head.substr(0, head.find_last_not_of("0123456789") + 1);
      line("const std::string p = " + quote(head) + " + std::to_string(i) + \".\";");
    }
    line("rt::LayerDef d;");
    line("d.index = i;");
    line(prefix.empty() ? "d.hfPrefix = \"\";" : "d.hfPrefix = p;");
    line("d.inputNorm = " + name(layer.inputNorm) + ";");
    line("d.postAttentionNorm = " + name(layer.postAttentionNorm) + ";");
    if (!writeAttention(error) || !writeFfn(error))
      return false;
    writeResiduals();
    line("return d;");
    return true;
  }

  /// The statements, with the layer number abstracted.
  std::string body() const { return text; }
  /// "slidingMoe" etc., for the helper's name.
  std::string shape() const { return shapeName; }
  std::string summary() const { return summaryText; }

private:
  void line(const std::string &s) { text += "  " + s + "\n"; }
  void set(const std::string &field, const std::string &value) {
    line(field + " = " + value + ";");
  }
  void setInt(const std::string &field, int64_t value) {
    set(field, formatInt(value));
  }
  void setDouble(const std::string &field, double value) {
    set(field, formatDouble(value));
  }
  void setTrue(const std::string &field, bool value) {
    if (value)
      set(field, "true");
  }

  /// The settings (runtime/ModelDef.h, visitSettings) of \p Settings that
  /// \p op carries with a value other than the field's default, as
  /// "VAR.field = value;" in the runtime's order. An attribute the op does
  /// not carry keeps the field's default.
  template <typename Settings> void writeSettings(Operation *op, const std::string &var) {
    const Settings defaults;
    rt::visitSettings(defaults, [&](const char *attribute, const char *field, const auto &fallback) {
      using T = std::decay_t<decltype(fallback)>;
      const std::string target = var + "." + field;
      Attribute attr = op->getAttr(attribute);
      if constexpr (std::is_same_v<T, bool>) {
        // A unit attribute: present means true.
        if ((attr != nullptr) != fallback)
          set(target, attr ? "true" : "false");
      } else if constexpr (std::is_same_v<T, int64_t>) {
        if (auto value = llvm::dyn_cast_or_null<IntegerAttr>(attr); value && value.getInt() != fallback)
          setInt(target, value.getInt());
      } else if constexpr (std::is_same_v<T, double>) {
        if (auto value = llvm::dyn_cast_or_null<FloatAttr>(attr);
            value && value.getValueAsDouble() != fallback)
          setDouble(target, value.getValueAsDouble());
      } else {
        static_assert(std::is_same_v<T, std::string>, "a setting is a flag, a number or text");
        if (auto value = llvm::dyn_cast_or_null<StringAttr>(attr); value && value.str() != fallback)
          set(target, quote(value.str()));
      }
    });
  }

  /// The YaRN fields of a.rope with scaling \p factor, from \p rope (the
  /// #adapt.rope that AttentionOp and SparseAttentionOp share).
  void setYarn(RopeAttr rope, double factor) {
    set("a.rope.scaling", "\"yarn\"");
    setDouble("a.rope.factor", factor);
    setInt("a.rope.originalMaxPositions", rope.getOriginalMaxPositions());
    setDouble("a.rope.betaFast", rope.getBetaFast().convertToDouble());
    setDouble("a.rope.betaSlow", rope.getBetaSlow().convertToDouble());
    setDouble("a.rope.mscale", rope.getMscale().convertToDouble());
    setDouble("a.rope.mscaleAllDim", rope.getMscaleAllDim().convertToDouble());
    set("a.rope.truncate", rope.getTruncate() ? "true" : "false");
  }

  /// (ModelDef role, tensor name) of each weight a section writes.
  using Weights = std::vector<std::pair<std::string, std::string>>;

  /// Appends each weight of \p op to \p weights under the ModelDef role
  /// \p roleOf gives it. A weight without one is an error naming \p where
  /// ("layer 3: attention") and the weight, with \p hint after it.
  bool collectWeights(Operation *op, const std::string &where,
                      llvm::function_ref<std::optional<std::string>(const std::string &)> roleOf,
                      Weights &weights, std::string &error, const std::string &hint = "") {
    for (const RoleName &w : weightsOf(op, symbols)) {
      std::optional<std::string> role = roleOf(w.first);
      if (!role) {
        error = where + " weight " + w.second + " (role " + w.first + ") has no ModelDef role" + hint;
        return false;
      }
      weights.push_back({*role, w.second});
    }
    return true;
  }

  /// A roleOf for collectWeights where ModelDef uses the IR's role names:
  /// those in \p roles, as they are.
  static auto sameRoleIf(const std::set<std::string> &roles) {
    return [&roles](const std::string &role) -> std::optional<std::string> {
      if (roles.count(role))
        return role;
      return std::nullopt;
    };
  }

  /// Whether \p weights hold one with ModelDef role \p role.
  static bool hasRole(const Weights &weights, const std::string &role) {
    return std::any_of(weights.begin(), weights.end(),
                       [&](const auto &weight) { return weight.first == role; });
  }

  /// Sets hfAttention, unless already set, to the module of the first of
  /// \p weights below the layer prefix ("self_attn.").
  void noteHfAttention(const Weights &weights) {
    if (!hfAttention.empty() || weights.empty())
      return;
    std::string local = weights.front().second.substr(prefix.size());
    hfAttention = local.substr(0, local.find('.') + 1);
  }

  /// A tensor name, relative to the layer prefix where it is under it.
  std::string name(const std::string &checkpointName) const {
    if (!prefix.empty() && checkpointName.compare(0, prefix.size(), prefix) == 0)
      return "p + " + quote(checkpointName.substr(prefix.size()));
    return quote(checkpointName);
  }

  void writeWeights(const std::string &field,
                    const std::vector<std::pair<std::string, std::string>> &map) {
    line(field + " = {");
    for (const auto &[role, tensor] : map)
      line("    {" + quote(role) + ", " + name(tensor) + "},");
    line("};");
  }

  /// Linear attention: Qwen3-Next's Gated DeltaNet.
  bool writeLinearAttention(LinearAttentionOp l, std::string &error) {
    const bool kimi = l.getKind() == LinearAttentionKind::KimiDelta;
    if (!kimi && l.getKind() != LinearAttentionKind::GatedDeltaRule) {
      error = "layer " + std::to_string(layer.index) + " uses linear attention (" +
              stringifyLinearAttentionKind(l.getKind()).str() +
              "), which the runtime's ModelDef cannot express yet";
      return false;
    }
    if (l.getValueHeads() % l.getKeyHeads() != 0 || l.getConvKernel() <= 0 ||
        (kimi && (l.getKeyHeads() != l.getValueHeads() || l.getKeyHeadDim() != l.getValueHeadDim()))) {
      error = "layer " + std::to_string(layer.index) +
              ": gated delta rule needs value heads a multiple of key heads (Kimi delta: equal) and a "
              "convolution width";
      return false;
    }
    static const std::set<std::string> gdnRoles = {"in_proj_qkvz", "in_proj_ba", "conv1d", "dt_bias",
                                                    "A_log",        "norm",       "out_proj"};
    static const std::set<std::string> kimiRoles = {
        "q_proj",   "k_proj",   "v_proj", "q_conv1d", "k_conv1d", "v_conv1d", "f_a_proj", "f_b_proj",
        "b_proj",   "g_a_proj", "g_b_proj", "A_log",  "dt_bias",  "o_norm",   "o_proj"};
    const std::set<std::string> &roles = kimi ? kimiRoles : gdnRoles;
    line("rt::AttentionDef &a = d.attention;");
    set("a.kind", kimi ? "rt::AttentionKind::KimiDelta" : "rt::AttentionKind::GatedDeltaNet");
    setInt("a.linear.keyHeads", l.getKeyHeads());
    setInt("a.linear.valueHeads", l.getValueHeads());
    setInt("a.linear.keyHeadDim", l.getKeyHeadDim());
    setInt("a.linear.valueHeadDim", l.getValueHeadDim());
    setInt("a.linear.convKernel", l.getConvKernel());
    Weights weights;
    if (!collectWeights(l, "layer " + std::to_string(layer.index) + ": linear attention",
                        sameRoleIf(roles), weights, error,
                        " (Qwen3.5's split in_proj_qkv/z/b/a is not supported yet)"))
      return false;
    noteHfAttention(weights);
    writeWeights("a.weights", weights);
    if (hfAttention != "self_attn." && !hfAttention.empty())
      set("d.hfAttention", quote(hfAttention));
    summaryText = kimi ? "Kimi delta attention " + std::to_string(l.getKeyHeads()) + " heads"
                       : "gated delta rule " + std::to_string(l.getKeyHeads()) + " key / " +
                             std::to_string(l.getValueHeads()) + " value heads";
    shapeName = kimi ? "kimiDelta" : "deltaNet";
    return true;
  }

  /// Linear attention: MiniMax's lightning attention (AttentionKind::Lightning).
  bool writeLightning(LinearAttentionOp l, std::string &error) {
    const std::string where = "layer " + std::to_string(layer.index) + ": lightning attention";
    if (l.getKeyHeads() != l.getValueHeads() || l.getKeyHeadDim() != l.getValueHeadDim()) {
      error = where + " needs equal key and value heads and head dims";
      return false;
    }
    static const std::set<std::string> roles = {"qkv_proj", "output_gate", "norm", "out_proj"};
    Weights weights;
    if (!collectWeights(l, where, sameRoleIf(roles), weights, error))
      return false;
    // The decay slopes scale with layer / (num_hidden_layers - 1).
    int64_t decoderLayers = 0;
    if (auto model = l->getParentOfType<ModelOp>())
      for (Operation &op : model.getBody().front())
        if (isa<AttentionOp, SparseAttentionOp, LinearAttentionOp>(op))
          ++decoderLayers;
    const int64_t heads = l.getKeyHeads(), dim = l.getKeyHeadDim();
    const int64_t block = l.getBlockSize() > 0 ? l.getBlockSize() : 256;
    line("rt::AttentionDef &a = d.attention;");
    set("a.kind", "rt::AttentionKind::Lightning");
    setInt("a.heads", heads);
    setInt("a.kvHeads", heads);
    setInt("a.headDim", dim);
    setInt("a.vHeadDim", dim);
    set("a.rope.enabled", "false");
    setTrue("a.outputGate", l.getOutputGate());
    setInt("a.linear.keyHeads", heads);
    setInt("a.linear.valueHeads", heads);
    setInt("a.linear.keyHeadDim", dim);
    setInt("a.linear.valueHeadDim", dim);
    setInt("a.linear.chunkSize", block);
    setInt("a.linear.decayLayers", decoderLayers);
    writeWeights("a.weights", weights);
    summaryText = "lightning attention " + std::to_string(heads) + " heads, block " + std::to_string(block);
    shapeName = "lightning";
    return true;
  }

  /// MiniMax's scaled residuals (alpha * residual + beta * sublayer) and
  /// postnorm (the residual is the normalised input), read off the
  /// residual adds that consume this layer's mixer and FFN.
  void writeResiduals() {
    bool normed = false;
    auto scan = [&](Operation *op, const char *alphaField, const char *betaField) {
      if (!op || op->getNumResults() != 1)
        return;
      for (Operation *user : op->getResult(0).getUsers()) {
        auto add = llvm::dyn_cast<AddOp>(user);
        if (!add || add.getRhs() != op->getResult(0))
          continue;
        double alpha = add.getResidualAlpha().convertToDouble();
        double beta = add.getResidualBeta().convertToDouble();
        if (alpha != 1.0)
          setDouble(alphaField, alpha);
        if (beta != 1.0)
          setDouble(betaField, beta);
        normed |= llvm::isa_and_nonnull<RMSNormOp>(add.getLhs().getDefiningOp());
      }
    };
    scan(layer.mixer, "d.attentionResidualAlpha", "d.attentionResidualBeta");
    scan(layer.ffn, "d.ffnResidualAlpha", "d.ffnResidualBeta");
    setTrue("d.normedResidual", normed);
  }

  /// DeepSeek sparse attention (AttentionKind::SparseMla): MLA with its
  /// projections and RoPE, plus the lightning indexer.
  bool writeSparseAttention(SparseAttentionOp s, std::string &error) {
    const std::string where = "layer " + std::to_string(layer.index) + ": sparse attention";
    if (s.getReusesIndexer()) {
      error = where + " reuses an earlier layer's top-k (indexer_types \"shared\"), which the runtime does "
                      "not run yet: every layer runs its own indexer there";
      return false;
    }
    if (s.getQLoraRank() <= 0) {
      error = where + " needs q_lora_rank > 0 (its indexer reads the query latent)";
      return false;
    }
    if (s.getIndexHeadDim() <= s.getQkRopeHeadDim()) {
      error = where + " needs index_head_dim > qk_rope_head_dim";
      return false;
    }
    static const std::set<std::string> roles = {
        "q_a_proj",     "q_a_layernorm", "q_b_proj",      "kv_a_proj_with_mqa", "kv_a_layernorm",
        "kv_b_proj",    "o_proj",        "o_proj.bias",   "indexer.wq_b",       "indexer.wk",
        "indexer.k_norm", "indexer.k_norm.bias", "indexer.weights_proj"};
    Weights weights;
    if (!collectWeights(s, where, sameRoleIf(roles), weights, error))
      return false;
    bool oBias = s.getOutBias() || hasRole(weights, "o_proj.bias");
    noteHfAttention(weights);
    RopeAttr ropeAttr = s.getRope();
    std::string rope = ropeAttr.getScaling().str();
    if (rope != "default" && rope != "yarn") {
      error = where + ": RoPE '" + rope + "' has no ModelDef form here (default or yarn)";
      return false;
    }
    line("rt::AttentionDef &a = d.attention;");
    set("a.kind", "rt::AttentionKind::SparseMla");
    setInt("a.heads", s.getNumHeads());
    setInt("a.kvHeads", s.getNumHeads());
    setInt("a.headDim", s.getHeadDim());
    setInt("a.vHeadDim", s.getVHeadDim());
    setInt("a.qLoraRank", s.getQLoraRank());
    setInt("a.kvLoraRank", s.getKvLoraRank());
    setInt("a.qkNopeDim", s.getHeadDim() - s.getQkRopeHeadDim());
    setInt("a.qkRopeDim", s.getQkRopeHeadDim());
    setTrue("a.outBias", oBias);
    double scale = s.getSoftmaxScale().convertToDouble();
    if (scale != 0)
      setDouble("a.softmaxScale", scale);
    setInt("a.rope.rotaryDim", s.getQkRopeHeadDim());
    setDouble("a.rope.theta", ropeAttr.getTheta().convertToDouble());
    setTrue("a.rope.interleaved", ropeAttr.getInterleaved());
    if (rope == "yarn")
      setYarn(ropeAttr, ropeAttr.getFactor().convertToDouble());
    setInt("a.indexer.heads", s.getIndexHeads());
    setInt("a.indexer.headDim", s.getIndexHeadDim());
    setInt("a.indexer.topK", s.getTopK());
    setTrue("a.indexer.ropeInterleaved", s.getIndexRopeInterleaved());
    writeWeights("a.weights", weights);
    if (hfAttention != "self_attn." && !hfAttention.empty())
      set("d.hfAttention", quote(hfAttention));
    summaryText = "sparse MLA " + std::to_string(s.getNumHeads()) + " heads, indexer " +
                  std::to_string(s.getIndexHeads()) + " heads top-" + std::to_string(s.getTopK());
    shapeName = "sparse";
    return true;
  }

  bool writeAttention(std::string &error) {
    if (auto l = llvm::dyn_cast_or_null<LinearAttentionOp>(layer.mixer))
      return l.getKind() == LinearAttentionKind::Lightning ? writeLightning(l, error) : writeLinearAttention(l, error);
    if (auto s = llvm::dyn_cast_or_null<SparseAttentionOp>(layer.mixer))
      return writeSparseAttention(s, error);
    auto a = llvm::dyn_cast_or_null<AttentionOp>(layer.mixer);
    if (!a) {
      std::string what = layer.mixer ? layer.mixer->getName().getStringRef().str()
                                     : std::string("no token mixer");
      if (auto l = llvm::dyn_cast_or_null<LinearAttentionOp>(layer.mixer))
        what += " (" + stringifyLinearAttentionKind(l.getKind()).str() + ")";
      error = "layer " + std::to_string(layer.index) + " uses " + what +
              ", which the runtime's ModelDef cannot express (it has GQA/MHA "
              "and MLA attention only)";
      return false;
    }
    if (a.getOutputGate() && a.getKind() == AttentionKind::Mla) {
      error = "layer " + std::to_string(layer.index) +
              " has a gated MLA output (output_gate), which the "
              "runtime's ModelDef cannot express";
      return false;
    }
    bool mla = a.getKind() == AttentionKind::Mla;
    line("rt::AttentionDef &a = d.attention;");
    if (mla)
      set("a.kind", "rt::AttentionKind::Mla");
    setInt("a.heads", a.getNumHeads());
    setInt("a.kvHeads", a.getNumKvHeads());
    setInt("a.headDim", a.getHeadDim());
    setInt("a.vHeadDim", a.getVHeadDim());
    if (a.getQkNorm())
      set("a.qkNorm", quote(stringifyQkNormKind(a.getQkNormKind()).str()));
    Weights weights;
    if (!collectWeights(a, "layer " + std::to_string(layer.index) + ": attention", attentionRole,
                        weights, error))
      return false;
    bool oBias = a.getOutBias() || hasRole(weights, "o_proj.bias");
    noteHfAttention(weights);
    setTrue("a.outBias", oBias);
    writeSettings<rt::AttentionSettings>(a, "a");
    WindowKind window = a.getWindow();
    if (window == WindowKind::Sliding)
      setInt("a.slidingWindow", a.getWindowSize());
    else if (window == WindowKind::Chunked)
      setInt("a.chunkSize", a.getWindowSize());
    if (mla) {
      setInt("a.qLoraRank", a.getQLoraRank());
      setInt("a.kvLoraRank", a.getKvLoraRank());
      setInt("a.qkNopeDim", a.getHeadDim() - a.getQkRopeHeadDim());
      setInt("a.qkRopeDim", a.getQkRopeHeadDim());
    }
    RopeAttr ropeAttr = a.getRope();
    std::string rope = ropeAttr.getScaling().str();
    if (rope == "none") {
      set("a.rope.enabled", "false");
    } else {
      int64_t rotaryDim =
          mla ? a.getQkRopeHeadDim()
              : std::llround(a.getHeadDim() * a.getRopePartial().convertToDouble());
      double theta = ropeAttr.getTheta().convertToDouble();
      double factor = ropeAttr.getFactor().convertToDouble();
      if (rope == "ntk_alpha" && rotaryDim > 2) {
        // NTK-alpha (Hunyuan): a larger base, theta * alpha^(d / (d - 2)).
        theta *= std::pow(factor, double(rotaryDim) / double(rotaryDim - 2));
      }
      setInt("a.rope.rotaryDim", rotaryDim);
      setDouble("a.rope.theta", theta);
      setTrue("a.rope.interleaved", ropeAttr.getInterleaved());
      if (rope == "yarn") {
        setYarn(ropeAttr, factor);
      } else if (rope == "llama3") {
        set("a.rope.scaling", "\"llama3\"");
        setDouble("a.rope.factor", factor);
        setInt("a.rope.originalMaxPositions", ropeAttr.getOriginalMaxPositions());
        setDouble("a.rope.lowFreqFactor", ropeAttr.getLowFreqFactor().convertToDouble());
        setDouble("a.rope.highFreqFactor", ropeAttr.getHighFreqFactor().convertToDouble());
      } else if (rope == "mrope") {
        // Interleaved M-RoPE: image tokens rotate by (t, h, w) positions;
        // text-only batches give all three the same, which is plain RoPE.
        if (auto section = a.getMropeSection()) {
          std::string list;
          for (int64_t s : *section)
            list += (list.empty() ? "" : ", ") + std::to_string(s);
          set("a.rope.mropeSection", "{" + list + "}");
        }
      } else if (rope != "default" && rope != "ntk_alpha") {
        // No ModelDef form (dynamic NTK, mrope, ...): named, so the runtime
        // refuses it rather than silently using plain RoPE.
        set("a.rope.scaling", quote(rope));
        setDouble("a.rope.factor", factor);
      }
    }
    writeWeights("a.weights", weights);
    if (hfAttention != "self_attn." && !hfAttention.empty())
      set("d.hfAttention", quote(hfAttention));
    std::string kind = mla ? "MLA" : a.getKind() == AttentionKind::Mha ? "MHA" : "GQA";
    summaryText = kind + " " + std::to_string(a.getNumHeads()) + " heads";
    if (!mla && a.getNumKvHeads() != a.getNumHeads())
      summaryText += " (" + std::to_string(a.getNumKvHeads()) + " KV)";
    if (window != WindowKind::None)
      summaryText += ", " + stringifyWindowKind(window).str() + " " + std::to_string(a.getWindowSize());
    if (rope == "none")
      summaryText += ", no RoPE";
    shapeName = window == WindowKind::Sliding   ? "sliding"
                : window == WindowKind::Chunked ? "chunked"
                : rope == "none"                ? "nope"
                : a.getOutputGate()             ? "gated"
                                                : "";
    if (a.getOutputGate())
      summaryText += ", gated output";
    return true;
  }

  bool writeFfn(std::string &error) {
    std::string ffnModule = hfFfnModule(family);
    if (ffnModule != "mlp.")
      set("d.hfFfn", quote(ffnModule));
    line("rt::FfnDef &f = d.ffn;");
    Weights weights;
    auto collect = [&](Operation *op) {
      return collectWeights(op, "layer " + std::to_string(layer.index) + ": FFN", ffnRole,
                            weights, error);
    };
    auto checkActivation = [&](StringRef act) {
      if (act == "silu")
        return true;
      error = "layer " + std::to_string(layer.index) + ": activation '" +
              act.str() + "' has no ModelDef form (SwiGLU only)";
      return false;
    };
    if (auto m = llvm::dyn_cast_or_null<MLPOp>(layer.ffn)) {
      if (!checkActivation(m.getActivation()))
        return false;
      setInt("f.intermediate", m.getIntermediate());
      if (!collect(m))
        return false;
      writeWeights("f.weights", weights);
      summaryText += "; dense MLP " + std::to_string(m.getIntermediate());
      shapeName += "dense";
      return true;
    }
    auto m = llvm::dyn_cast_or_null<MoEOp>(layer.ffn);
    if (!m) {
      error = "layer " + std::to_string(layer.index) +
              " has no MLP or MoE the runtime's ModelDef can express";
      return false;
    }
    if (!checkActivation(m.getActivation()))
      return false;
    std::string scoring = m.getScoring().str();
    Routing routing = m.getRouting();
    if (scoring != "softmax" && scoring != "sigmoid") {
      error = "layer " + std::to_string(layer.index) + ": router scoring '" + scoring +
              "' has no ModelDef form (softmax or sigmoid)";
      return false;
    }
    std::string router;
    if (routing == Routing::ScoreTopK)
      router = scoring == "softmax" ? "SoftmaxTopK" : "SigmoidTopK";
    else if (routing == Routing::TopKScore && scoring == "softmax")
      router = "TopKSoftmax";
    else if (routing == Routing::TopKScoreInput && scoring == "sigmoid")
      router = "TopKSigmoidInput";
    else {
      error = "layer " + std::to_string(layer.index) + ": router '" + stringifyRouting(routing).str() +
              "' with " + scoring + " scoring has no ModelDef form";
      return false;
    }
    setInt("f.experts", m.getNumExperts());
    setInt("f.topK", m.getTopK());
    setInt("f.intermediate", m.getExpertIntermediate());
    set("f.router", "rt::RouterKind::" + router);
    writeSettings<rt::FfnSettings>(m, "f");
    double limit = m.getSwigluLimit().convertToDouble();
    if (limit > 0) {
      set("f.act", "rt::ExpertAct::ClampedSwiGLU");
      setDouble("f.swigluAlpha", m.getSwigluAlpha().convertToDouble());
      setDouble("f.swigluLimit", limit);
    }
    if (m.getFusedLayout() != FusedLayout::None)
      set("f.fusedLayout", quote(stringifyFusedLayout(m.getFusedLayout()).str()));
    if (!collect(m))
      return false;
    bool hasShared = false;
    for (const auto &w : weights)
      hasShared |= w.first.compare(0, 7, "shared.") == 0;
    if (m.getNumShared() > 0 && hasShared) {
      setInt("f.sharedIntermediate", m.getNumShared() * m.getSharedIntermediate());
      setTrue("f.sharedGate", m.getSharedGate());
    }
    writeWeights("f.weights", weights);
    summaryText += "; MoE " + std::to_string(m.getNumExperts()) + " experts top-" +
                   std::to_string(m.getTopK());
    if (m.getNumShared() > 0 && hasShared)
      summaryText += " + " + std::to_string(m.getNumShared()) + " shared";
    shapeName += "moe";
    return true;
  }

  const LayerOps &layer;
  SymbolTable &symbols;
  std::string family;
  std::string prefix, hfAttention;
  std::string text, shapeName, summaryText;
};

} // namespace

bool emitLayer(const LayerOps &layer, SymbolTable &symbols, const std::string &family, LayerText &out,
               std::string &error) {
  LayerWriter writer(layer, symbols, family);
  if (!writer.write(error))
    return false;
  out = {writer.body(), writer.shape(), writer.summary()};
  return true;
}

} // namespace adapt::codegen
