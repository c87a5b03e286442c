//===- ReuseRules.cpp - close gaps with what the library already has -----===//
//
// Each rule looks at one gaps.json component and the registry and, when it
// applies, proposes a registry entry plus the adapter that maps the model
// onto an existing op. Rules, in the order tried:
//   renamed_weight          a weight role is a known op's role under another
//                           name (shared_mlp.* is shared_experts.*)
//   split_projection_layout a fused projection of a known op appears split
//                           (in_proj_qkv + in_proj_z = in_proj_qkvz)
//   parameter_remap         the op is a known op with other parameters
//                           (rope=ntk_alpha is default rope with a new base)
//   composition             the op is a composition of implemented ops
//                           (Kimi delta attention = gated delta rule with
//                           per-channel gates)
// Also the record helpers (hashes, files) shared by generate and review.
//
//===----------------------------------------------------------------------===//

#include "agent/Agent.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace adapt::agent {

bool isCriticalOp(const std::string &op) {
  static const std::set<std::string> critical = {
      "adapt.attention", "adapt.sparse_attention", "adapt.linear_attention",
      "adapt.moe",       "adapt.mlp",              "adapt.rms_norm",
      "adapt.lm_head",   "adapt.embedding",        "adapt.encoder"};
  return critical.count(op) > 0;
}

bool isCriticalCandidate(const std::string &op, const std::string &rule) {
  // A renamed weight changes no arithmetic: the same op reads its tensor
  // under another name, and the manifest check verifies names and shapes.
  if (rule == "renamed_weight")
    return false;
  return isCriticalOp(op);
}

bool writeText(const std::string &path, const std::string &text, std::string &error) {
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (!dir.empty())
    if (std::error_code ec = llvm::sys::fs::create_directories(dir)) {
      error = std::string(dir) + ": " + ec.message();
      return false;
    }
  std::ofstream os(path, std::ios::binary);
  os << text;
  os.close();
  if (!os) {
    error = path + ": cannot write";
    return false;
  }
  return true;
}

bool readText(const std::string &path, std::string &text) {
  std::ifstream is(path, std::ios::binary);
  if (!is)
    return false;
  std::ostringstream ss;
  ss << is.rdbuf();
  text = ss.str();
  return true;
}

std::string sha256Hex(const std::string &data) {
  std::array<uint8_t, 32> digest = llvm::SHA256::hash(
      llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(data.data()), data.size()));
  static const char *hex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest)
    out += hex[b >> 4], out += hex[b & 15];
  return out;
}

std::string candidateContentHash(const std::string &candidateDir, const Json &candidate) {
  std::vector<std::string> files;
  if (candidate.contains("files") && candidate["files"].is_array())
    for (const Json &f : candidate["files"])
      if (f.is_string())
        files.push_back(f.get<std::string>());
  std::sort(files.begin(), files.end());
  // What the reviewer is told about the files is covered too: a candidate
  // whose status or evidence is edited after approval is void like an edited file.
  Json claims = Json::object();
  for (const char *key : {"id", "op", "kind", "rule", "status", "critical", "validation"})
    if (candidate.contains(key))
      claims[key] = candidate[key];
  std::string all = "candidate.json claims\n" + claims.dump() + "\n";
  for (const std::string &f : files) {
    std::string text;
    if (!readText(candidateDir + "/" + f, text))
      text = "<missing>";
    all += f + "\n" + std::to_string(text.size()) + "\n" + text;
  }
  return sha256Hex(all);
}

namespace {

/// The registry entry called \p id, or null.
const Json *findEntry(const Json &registry, const std::string &id) {
  if (!registry.contains("ops"))
    return nullptr;
  for (const Json &e : registry["ops"])
    if (e.value("id", "") == id)
      return &e;
  return nullptr;
}

/// Implemented entries of \p op whose match accepts every feature of
/// \p features except those named in \p except.
std::vector<const Json *> entriesCovering(const Json &registry, const std::string &op,
                                          const Json &features,
                                          const std::set<std::string> &except = {}) {
  std::vector<const Json *> out;
  if (!registry.contains("ops"))
    return out;
  for (const Json &e : registry["ops"]) {
    if (e.value("op", "") != op || !e.value("forward", false) || !e.value("backward", false))
      continue;
    bool ok = true;
    const Json match = e.value("match", Json::object());
    for (auto it = features.begin(); it != features.end() && ok; ++it) {
      if (except.count(it.key()) || !match.contains(it.key()))
        continue;
      const Json &allowed = match[it.key()];
      ok = std::find(allowed.begin(), allowed.end(), it.value()) != allowed.end();
    }
    if (ok)
      out.push_back(&e);
  }
  return out;
}

/// The weight role a "LoRA not available on ROLE" reason names, or "".
std::string uncoveredLoraRole(const Json &component) {
  const std::string prefix = "LoRA not available on ";
  for (const Json &r : component.value("reasons", Json::array())) {
    std::string s = r.get<std::string>();
    if (s.rfind(prefix, 0) == 0)
      return s.substr(prefix.size());
  }
  return "";
}

/// Known renamings of weight-role prefixes between model families.
const std::vector<std::pair<std::string, std::string>> kRoleAliases = {
    {"shared_mlp.", "shared_experts."}, {"shared_expert.", "shared_experts."},
    {"block_sparse_moe.experts.", "experts."}, {"feed_forward.experts.", "experts."},
    {"self_attn.qkv_proj", "qkv_proj"}, {"attention.wqkv", "qkv_proj"}};

bool ruleRenamedWeight(const Json &component, const Json &registry, ReuseMatch &m) {
  std::string role = uncoveredLoraRole(component);
  const Json *entry = findEntry(registry, component.value("registry_entry", ""));
  if (role.empty() || !entry)
    return false;
  const Json targets = entry->value("lora_targets", Json::array());
  for (const auto &[from, to] : kRoleAliases) {
    if (role.rfind(from, 0) != 0)
      continue;
    std::string known = to + role.substr(from.size());
    if (std::find(targets.begin(), targets.end(), known) == targets.end())
      continue;
    m.rule = "renamed_weight";
    m.explanation = "'" + role + "' is '" + known + "' of library op " +
                    entry->value("id", "") + " under another name (prefix '" + from +
                    "' -> '" + to + "'); the op itself is unchanged.";
    m.registryEntry = *entry;
    Json aliases = m.registryEntry.value("weight_aliases", Json::object());
    aliases[role] = known;
    m.registryEntry["weight_aliases"] = aliases;
    m.registryEntry["lora_targets"].push_back(role);
    m.adapter = "// Weight-name adapter: load '" + role + "' where " + entry->value("id", "") +
                " expects '" + known + "'.\n{\"" + role + "\", \"" + known + "\"}\n";
    return true;
  }
  return false;
}

/// Letters of a fused projection suffix ("qkvz") as a set.
std::set<char> letters(const std::string &s) { return std::set<char>(s.begin(), s.end()); }

/// The first role a "stored split (ROLE, ...)" reason names, or "".
std::string firstSplitRole(const Json &component) {
  const std::string marker = "stored split (";
  for (const Json &r : component.value("reasons", Json::array())) {
    std::string s = r.get<std::string>();
    size_t at = s.find(marker);
    if (at != std::string::npos)
      return s.substr(at + marker.size(), s.find_first_of(",)", at + marker.size()) - at - marker.size());
  }
  return "";
}

bool ruleSplitProjection(const Json &component, const Json &registry, ReuseMatch &m) {
  std::string role = uncoveredLoraRole(component);
  const Json *entry = findEntry(registry, component.value("registry_entry", ""));
  if (!entry && component.value("features", Json::object()).value("split_projections", "") == "yes") {
    // Missing because its projections are stored split: the same op with
    // the fused layout is the candidate to reuse.
    std::vector<const Json *> near = entriesCovering(registry, component.value("op", ""),
                                                     component["features"], {"split_projections"});
    entry = near.empty() ? nullptr : near.front();
    role = firstSplitRole(component);
  }
  if (role.empty() || !entry)
    return false;
  size_t cut = role.rfind('_');
  if (cut == std::string::npos)
    return false;
  std::string prefix = role.substr(0, cut + 1), parts = role.substr(cut + 1);
  for (const Json &t : entry->value("lora_targets", Json::array())) {
    std::string fused = t.get<std::string>();
    if (fused.rfind(prefix, 0) != 0 || fused == role)
      continue;
    std::string fusedParts = fused.substr(prefix.size());
    std::set<char> a = letters(parts), b = letters(fusedParts);
    if (parts.size() >= fusedParts.size() ||
        !std::includes(b.begin(), b.end(), a.begin(), a.end()))
      continue;
    std::string rest;
    for (char c : fusedParts)
      if (!a.count(c))
        rest += c;
    m.rule = "split_projection_layout";
    m.explanation = "'" + role + "' is the first part of library op " + entry->value("id", "") +
                    "'s fused '" + fused + "' (parts " + fusedParts + " = " + parts + " + " +
                    rest + "): the same op with its projection stored split. The adapter "
                    "concatenates the per-head slices of " + role + " and " + prefix + rest +
                    " into the fused per-key-head-group layout at load time.";
    m.registryEntry = *entry;
    m.registryEntry["lora_targets"].push_back(role);
    m.registryEntry["lora_targets"].push_back(prefix + rest);
    Json layouts = m.registryEntry.value("split_layouts", Json::object());
    layouts[fused] = Json::array({role, prefix + rest});
    m.registryEntry["split_layouts"] = layouts;
    m.adapter =
        "// Layout adapter: " + fused + " from split " + role + " + " + prefix + rest + ".\n"
        "// Each of q,k,v,... is [heads * head_dim, hidden]; the fused layout groups them per\n"
        "// key head: view each part as [key_heads, rows_per_key_head, hidden], cat on dim 1,\n"
        "// flatten back. LoRA on the split roles maps to row blocks of the fused weight.\n"
        "torch::Tensor fuse_" + fusedParts + "(const std::vector<torch::Tensor> &parts,\n"
        "                          int64_t keyHeads) {\n"
        "  std::vector<torch::Tensor> grouped;\n"
        "  for (const torch::Tensor &p : parts)\n"
        "    grouped.push_back(p.view({keyHeads, -1, p.size(-1)}));\n"
        "  return torch::cat(grouped, 1).flatten(0, 1);\n"
        "}\n";
    return true;
  }
  return false;
}

/// Parameter remaps: (feature, value) -> (supported value, adapter, why).
struct Remap {
  std::string feature, from, to, adapter, why;
};
const std::vector<Remap> kRemaps = {
    {"rope", "ntk_alpha", "default",
     "// NTK-alpha RoPE is default RoPE with a larger base:\n"
     "//   base' = rope_theta * alpha ^ (head_dim / (head_dim - 2))\n"
     "double ntkAlphaBase(double theta, double alpha, int64_t headDim) {\n"
     "  return theta * std::pow(alpha, double(headDim) / double(headDim - 2));\n"
     "}\n",
     "NTK-aware alpha scaling only changes the rotary base; the frequencies are then "
     "those of default RoPE"},
    {"rope", "dynamic", "default", "", "dynamic NTK at training lengths below the original "
                                       "context is default RoPE"},
    {"scoring", "softmax_topk", "softmax", "", "softmax-then-top-k under another name"}};

bool ruleParameterRemap(const Json &component, const Json &registry, ReuseMatch &m) {
  if (component.value("status", "") != "missing" || !component.contains("features"))
    return false;
  const Json &features = component["features"];
  for (const Remap &r : kRemaps) {
    if (!features.contains(r.feature) || features[r.feature] != r.from)
      continue;
    Json mapped = features;
    mapped[r.feature] = r.to;
    std::vector<const Json *> entries =
        entriesCovering(registry, component.value("op", ""), mapped);
    if (entries.empty())
      continue;
    const Json &entry = *entries.front();
    m.rule = "parameter_remap";
    m.explanation = component.value("op", "") + " with " + r.feature + "=" + r.from +
                    " is library op " + entry.value("id", "") + " with other parameters: " +
                    r.why + ".";
    m.registryEntry = entry;
    m.registryEntry["match"][r.feature].push_back(r.from);
    Json remaps = m.registryEntry.value("parameter_remaps", Json::object());
    remaps[r.feature + "=" + r.from] = r.feature + "=" + r.to;
    m.registryEntry["parameter_remaps"] = remaps;
    m.adapter = r.adapter.empty() ? "// no code: " + r.why + "\n" : r.adapter;
    return true;
  }
  return false;
}

/// Compositions: (op, kind) = base kind + extra pieces.
struct Composition {
  std::string op, kind, baseKind, pieces, adapter;
};
const std::vector<Composition> kCompositions = {
    {"adapt.linear_attention", "kimi_delta", "gated_delta_rule",
     "per-channel forget gate g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias) in place of "
     "the scalar per-head decay, low-rank output gate sigmoid(g_b(g_a(x))) on the gated RMSNorm",
     "// Kimi delta attention from the gated delta rule:\n"
     "//   q,k,v = silu(conv(q_proj x)), ...; q,k L2-normalised (as gated delta rule)\n"
     "//   g     = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias)   // [T, H, Dk]\n"
     "//   beta  = sigmoid(b_proj(x))\n"
     "//   o     = chunkedGatedDeltaRule(q, k, v, g /*per channel*/, beta)\n"
     "//   out   = o_proj(rmsNorm(o) * sigmoid(g_b_proj(g_a_proj(x))))\n"
     "torch::Tensor kimiDeltaDecay(const torch::Tensor &fa, const torch::Tensor &aLog,\n"
     "                             const torch::Tensor &dtBias) {\n"
     "  return -aLog.exp() * torch::softplus(fa + dtBias);\n"
     "}\n"},
    {"adapt.linear_attention", "gated_delta_rule", "kimi_delta",
     "scalar per-head decay broadcast over the key channels (a special case of per-channel "
     "gates)",
     "// Gated delta rule as Kimi delta attention with the decay broadcast per channel:\n"
     "//   g[T, H, Dk] = g_head[T, H, 1].expand(..., Dk)\n"}};

bool ruleComposition(const Json &component, const Json &registry, ReuseMatch &m) {
  const Json features = component.value("features", Json::object());
  std::string kind = features.value("kind", "");
  for (const Composition &c : kCompositions) {
    if (c.op != component.value("op", "") || c.kind != kind)
      continue;
    Json baseFeatures = features;
    baseFeatures["kind"] = c.baseKind;
    std::vector<const Json *> bases = entriesCovering(registry, c.op, baseFeatures);
    if (bases.empty())
      continue;
    const Json &base = *bases.front();
    m.rule = "composition";
    m.explanation = c.op + " kind=" + kind + " is library op " + base.value("id", "") +
                    " (kind=" + c.baseKind + ") composed with: " + c.pieces + ".";
    const Json *own = findEntry(registry, component.value("registry_entry", ""));
    m.registryEntry = own ? *own : base;
    if (!own) {
      m.registryEntry["id"] = c.op.substr(6) + "." + kind;
      m.registryEntry["match"] = Json{{"kind", Json::array({kind})}};
    }
    m.registryEntry["forward"] = true;
    m.registryEntry["backward"] = true;
    m.registryEntry["status"] = "implemented";
    m.registryEntry["composed_of"] = Json::array({base.value("id", ""), c.pieces});
    m.adapter = c.adapter;
    return true;
  }
  return false;
}

} // namespace

bool matchReuseRules(const Json &component, const Json &registry, ReuseMatch &match) {
  using Rule = bool (*)(const Json &, const Json &, ReuseMatch &);
  for (Rule rule : {ruleRenamedWeight, ruleSplitProjection, ruleParameterRemap, ruleComposition})
    if (rule(component, registry, match))
      return true;
  return false;
}

} // namespace adapt::agent
