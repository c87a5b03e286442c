//===- LoraTargets.cpp - which linear weights a LoRA pattern names --------===//

#include "models/LoraTargets.h"

#include <cctype>
#include <set>

namespace adapt {

namespace {

std::vector<std::string> splitDots(const std::string &text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t dot = text.find('.', start);
    out.push_back(text.substr(start, dot == std::string::npos ? dot : dot - start));
    if (dot == std::string::npos)
      return out;
    start = dot + 1;
  }
}

/// '*' (any run) and '?' (one character) inside one component.
bool globMatch(const char *pattern, const char *text) {
  if (*pattern == '\0')
    return *text == '\0';
  if (*pattern == '*')
    return globMatch(pattern + 1, text) || (*text && globMatch(pattern, text + 1));
  if (*text == '\0')
    return false;
  return (*pattern == '?' || *pattern == *text) && globMatch(pattern + 1, text + 1);
}

bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string stripWeightSuffix(std::string name) {
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    name.resize(name.size() - suffix.size());
  return name;
}

std::string parentOf(const std::string &path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

/// The modules "all-linear" adapts.
bool isAllLinear(LoraModuleKind kind) {
  return kind == LoraModuleKind::Attention || kind == LoraModuleKind::Mlp ||
         kind == LoraModuleKind::Experts ||
         kind == LoraModuleKind::SharedExperts;
}

/// A short, deduplicated list of the layer-relative module names.
std::string availableModules(const std::vector<LoraModule> &modules) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  auto add = [&](const std::string &name) {
    if (!name.empty() && seen.insert(name).second)
      names.push_back(name);
  };
  for (const LoraModule &m : modules) {
    if (m.kind == LoraModuleKind::Experts ||
        m.kind == LoraModuleKind::SharedExperts)
      add(parentOf(m.local));
    add(m.local + (m.kind == LoraModuleKind::Router ? " (router)" : ""));
  }
  std::string out;
  size_t shown = 0;
  for (const std::string &name : names) {
    if (shown == 24) {
      out += ", ... (" + std::to_string(names.size() - shown) + " more)";
      break;
    }
    out += (shown++ ? ", " : "") + name;
  }
  return out.empty() ? "none" : out;
}

} // namespace

std::string layerPrefixOf(const std::string &name) {
  size_t pos = 0;
  while ((pos = name.find("layers.", pos)) != std::string::npos) {
    if (pos == 0 || name[pos - 1] == '.') {
      size_t digits = pos + 7, end = digits;
      while (end < name.size() && std::isdigit((unsigned char)name[end]))
        ++end;
      if (end > digits && end < name.size() && name[end] == '.')
        return name.substr(0, end + 1);
    }
    pos += 7;
  }
  return "";
}

/// A vision tower's linear: a block's projection
/// ("model.visual.blocks.3.attn.qkv.weight": local "attn.qkv", "attn.proj",
/// "mlp.linear_fc1", "mlp.linear_fc2") or a merger's ("merger.linear_fc1",
/// "deepstack_merger_list.0.linear_fc2"). No container, so "attn"/"mlp"
/// never pull the tower in: a pattern must name the projection (qkv,
/// attn.proj, linear_fc1, merger.linear_fc2, ...), and all-linear skips it.
static std::optional<LoraModule> visionModuleOf(const std::string &name) {
  for (const char *merger : {"merger.", "deepstack_merger_list."}) {
    size_t m = name.rfind(merger);
    if (m == std::string::npos || (m > 0 && name[m - 1] != '.'))
      continue;
    std::string local = stripWeightSuffix(name.substr(m));
    size_t leaf = local.rfind('.');
    std::string fc = leaf == std::string::npos ? "" : local.substr(leaf + 1);
    if (fc != "linear_fc1" && fc != "linear_fc2")
      return std::nullopt;
    LoraModule out;
    out.local = local;
    out.path = name.substr(0, m) + local;
    out.kind = LoraModuleKind::Vision;
    return out;
  }
  size_t at = name.rfind("blocks.");
  if (at == std::string::npos || (at > 0 && name[at - 1] != '.'))
    return std::nullopt;
  size_t digits = at + 7, end = digits;
  while (end < name.size() && std::isdigit((unsigned char)name[end]))
    ++end;
  if (end == digits || end >= name.size() || name[end] != '.')
    return std::nullopt;
  std::string local = stripWeightSuffix(name.substr(end + 1));
  if (local != "attn.qkv" && local != "attn.proj" && local != "mlp.linear_fc1" &&
      local != "mlp.linear_fc2")
    return std::nullopt;
  LoraModule m;
  m.local = local;
  m.path = name.substr(0, end + 1) + local;
  m.kind = LoraModuleKind::Vision;
  return m;
}

std::string hfFfnModule(const std::string &family) {
  return family == "llama4" ? "feed_forward." : "mlp.";
}

std::optional<LoraModule> loraModuleOf(const std::string &component,
                                       const std::string &role,
                                       const std::string &name,
                                       const std::string &family) {
  if (component == "encoder")
    return visionModuleOf(name);
  std::string prefix = layerPrefixOf(name);
  if (prefix.empty())
    return std::nullopt;
  std::string inLayer = stripWeightSuffix(name.substr(prefix.size()));
  LoraModule m;
  if (component == "attention" || component == "mla" ||
      component == "sparse_attention" || component == "linear_attention") {
    m.local = inLayer;
    // transformers moves Kimi-Linear's f_a/f_b_proj into a forget_gate module.
    if (family == "kimi_linear" && (role == "f_a_proj" || role == "f_b_proj"))
      m.local.insert(m.local.size() - role.size(), "forget_gate.");
    m.kind = startsWith(role, "indexer.") ? LoraModuleKind::NoGradient
                                          : LoraModuleKind::Attention;
  } else if (component == "mlp") {
    m.local = hfFfnModule(family) + role;
    m.kind = LoraModuleKind::Mlp;
  } else if (component == "moe") {
    std::string ffn = hfFfnModule(family);
    // The checkpoint's own FFN module name (mlp, block_sparse_moe,
    // feed_forward) becomes transformers'.
    size_t dot = inLayer.find('.');
    std::string inFfn = dot == std::string::npos ? inLayer : inLayer.substr(dot + 1);
    if (role == "gate" || role == "router" || role == "shared_expert_gate") {
      m.local = ffn + inFfn;
      m.kind = LoraModuleKind::Router;
    } else if (role == "experts.w1" || role == "experts.w3" ||
               role == "experts.gate_proj" || role == "experts.up_proj" ||
               role == "experts.gate_up_proj") {
      m.local = ffn + "experts.gate_up_proj";
      m.kind = LoraModuleKind::Experts;
    } else if (role == "experts.w2" || role == "experts.down_proj") {
      m.local = ffn + "experts.down_proj";
      m.kind = LoraModuleKind::Experts;
    } else if (startsWith(role, "shared_experts.") ||
               startsWith(role, "shared_expert.") ||
               startsWith(role, "shared_mlp.")) {
      m.local = ffn + role;
      m.kind = LoraModuleKind::SharedExperts;
    } else {
      m.local = ffn + inFfn;
      m.kind = LoraModuleKind::Other;
    }
  } else {
    return std::nullopt;
  }
  m.path = prefix + m.local;
  // A router matches through its parent only when that parent is the router
  // itself (Hunyuan's mlp.gate.wg), never the FFN block.
  if (m.kind != LoraModuleKind::Router ||
      m.local.find('.', hfFfnModule(family).size()) != std::string::npos)
    m.container = parentOf(m.path);
  return m;
}

bool matchesModulePattern(const std::string &pattern, const std::string &path) {
  if (pattern.empty() || path.empty())
    return false;
  std::vector<std::string> want = splitDots(pattern), have = splitDots(path);
  if (want.size() > have.size())
    return false;
  size_t offset = have.size() - want.size();
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i].empty() || !globMatch(want[i].c_str(), have[offset + i].c_str()))
      return false;
  return true;
}

bool patternSelects(const std::string &pattern, const LoraModule &module) {
  return matchesModulePattern(pattern, module.path) ||
         (!module.container.empty() &&
          matchesModulePattern(pattern, module.container));
}

LoraSelection selectLoraTargets(const std::vector<LoraModule> &modules,
                                const std::vector<std::string> &patterns,
                                bool router) {
  LoraSelection out;
  out.selected.assign(modules.size(), false);
  std::vector<std::string> targets = patterns;
  if (targets.empty())
    targets.push_back("all-linear");
  for (const std::string &pattern : targets) {
    bool valid = !pattern.empty() && pattern.front() != '.' &&
                 pattern.back() != '.' &&
                 pattern.find("..") == std::string::npos;
    if (!valid) {
      out.error = "LoRA target '" + pattern +
                  "' is not a module name: expected dotted components such "
                  "as q_proj, self_attn.o_proj, experts or all-linear";
      return out;
    }
    int64_t matched = 0;
    for (size_t i = 0; i < modules.size(); ++i) {
      const LoraModule &m = modules[i];
      bool hit = pattern == "all-linear" ? isAllLinear(m.kind)
                                          : patternSelects(pattern, m);
      if (!hit)
        continue;
      if (m.kind == LoraModuleKind::NoGradient) {
        out.error = "LoRA target '" + pattern + "' matches the sparse-attention indexer (" +
                    m.path + "), whose projections get no gradient: the indexer only "
                    "selects keys and runs without autograd (as in transformers), so an "
                    "adapter there would never train; target the attention projections "
                    "(q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj) instead";
        return out;
      }
      if (m.kind == LoraModuleKind::Router && !router) {
        out.error = "LoRA target '" + pattern + "' matches the MoE router (" +
                    m.path + "); adapting the router disturbs the pretrained "
                    "load balance, pass --lora-router (pass option "
                    "router=true) to do it anyway";
        return out;
      }
      ++matched;
      out.selected[i] = true;
    }
    if (matched == 0) {
      out.error = "LoRA target '" + pattern +
                  "' matches no linear module of this model; available: " +
                  availableModules(modules);
      return out;
    }
  }
  if (router)
    for (size_t i = 0; i < modules.size(); ++i)
      if (modules[i].kind == LoraModuleKind::Router)
        out.selected[i] = true;
  for (size_t i = 0; i < modules.size(); ++i)
    out.routers += out.selected[i] && modules[i].kind == LoraModuleKind::Router;
  return out;
}

} // namespace adapt
