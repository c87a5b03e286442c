//===- CandidateTasks.cpp - which op-stage task validates a gap's candidate ===//
//
// The agent side of the op-stage task table. For one gaps.json component it
// finds the feature that makes it a gap (the component's features against
// the closest registry entry of its op), maps that feature to a task of
// adapt-candidate-check (agent/checks/), and gives the task's prompt text
// (the op's exact semantics, the candidate's inputs and params) and the
// checker params derived from the component's features and its IR line.
// A feature value the task's reference does not define gives no task, with
// the reason said precisely: semantics are never guessed.
//
//===----------------------------------------------------------------------===//

#include "agent/Agent.h"

#include <optional>
#include <regex>
#include <map>
#include <set>
#include <sstream>

namespace adapt::agent {
namespace {

/// One row of the table: a feature of an op whose difference one task covers.
struct FeatureTask {
  const char *op;      ///< e.g. "adapt.attention".
  const char *feature; ///< e.g. "rope".
  const char *task;    ///< adapt-candidate-check --task name.
  std::set<std::string> definedValues; ///< Values the task's reference defines.
  const char *kindWord;                ///< For the reason: "rope kind", "window kind".
};

const std::vector<FeatureTask> &featureTasks() {
  static const std::vector<FeatureTask> table = {
      {"adapt.moe", "scoring", "moe_routing", {"softmax", "sigmoid"}, "router scoring"},
      {"adapt.moe", "grouped", "moe_routing", {"yes", "no"}, "group-limited routing"},
      {"adapt.moe", "bias_correction", "moe_routing", {"yes", "no"}, "router bias correction"},
      {"adapt.moe", "router_bias", "moe_routing", {"yes", "no"}, "router bias"},
      {"adapt.moe", "swiglu", "glu_activation", {"plain", "clamped"}, "expert activation"},
      {"adapt.mlp", "activation", "glu_activation", {"silu"}, "MLP activation"},
      {"adapt.attention", "rope", "rope", {"default", "yarn", "llama3", "mrope"}, "rope kind"},
      {"adapt.attention", "sinks", "attention_core", {"yes", "no"}, "attention sink"},
      {"adapt.attention", "window", "attention_core", {"none", "sliding"}, "window kind"},
  };
  return table;
}

std::string featureValue(const Json &features, const std::string &key) {
  if (!features.contains(key))
    return "";
  const Json &v = features[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

/// A number attribute of the IR line (`name = 1.5e+05 : f64`), or nullopt.
std::optional<double> irNumber(const std::string &ir, const std::string &name) {
  std::smatch m;
  if (std::regex_search(ir, m, std::regex("[{ ,]" + name + R"( = (-?[0-9.eE+-]+))")))
    return std::stod(m[1].str());
  return std::nullopt;
}

/// A bool attribute (`name = false`), or nullopt.
std::optional<bool> irBool(const std::string &ir, const std::string &name) {
  std::smatch m;
  if (std::regex_search(ir, m, std::regex("[{ ,]" + name + R"( = (true|false))")))
    return m[1].str() == "true";
  return std::nullopt;
}

/// A unit attribute (`{..., sinks, ...}`).
bool irFlag(const std::string &ir, const std::string &name) {
  return std::regex_search(ir, std::regex("[{,] ?" + name + "[,}]"));
}

/// An i64 array attribute (`name = array<i64: 24, 20, 20>`).
std::vector<int64_t> irArray(const std::string &ir, const std::string &name) {
  std::smatch m;
  std::vector<int64_t> out;
  if (std::regex_search(ir, m, std::regex(name + R"( = array<i64: ([0-9, ]+)>)"))) {
    std::istringstream is(m[1].str());
    for (std::string item; std::getline(is, item, ',');)
      out.push_back(std::stoll(item));
  }
  return out;
}

/// The shortest of 15 or 17 significant digits that reads back as \p v.
std::string number(double v) {
  for (int digits : {15, 17}) {
    std::ostringstream os;
    os.precision(digits);
    os << v;
    if (digits == 17 || std::stod(os.str()) == v)
      return os.str();
  }
  return "";
}

/// Model-level checker params as key -> value (before "--param" framing).
using ParamList = std::vector<std::pair<std::string, double>>;

ParamList routingParams(const Json &f, const std::string &ir) {
  ParamList p = {{"scoring", f.value("scoring", "") == "sigmoid" ? 1.0 : 0.0},
                 {"use_bias", f.value("bias_correction", "") == "yes" ? 1.0 : 0.0},
                 {"norm_topk_prob", irFlag(ir, "norm_topk") ? 1.0 : 0.0}};
  if (auto s = irNumber(ir, "routed_scaling"))
    p.push_back({"routed_scaling_factor", *s});
  return p;
}

/// Rope params, from the op's #adapt.rope parameters (those equal to their
/// defaults are not printed); \p missing names what the IR line lacks for
/// this kind.
ParamList ropeParams(const Json &f, const std::string &ir, std::string &missing) {
  std::string kind = f.value("rope", "default");
  ParamList p = {{"theta", irNumber(ir, "theta").value_or(10000.0)},
                 {"interleaved", irBool(ir, "interleaved").value_or(false) ? 1.0 : 0.0},
                 {"scaling", kind == "yarn" ? 1.0 : kind == "llama3" ? 2.0 : 0.0},
                 {"mrope", kind == "mrope" ? 1.0 : 0.0}};
  if (kind == "yarn" || kind == "llama3") {
    auto original = irNumber(ir, "original_max_positions");
    auto factor = irNumber(ir, "factor");
    if (!original || !factor)
      missing = "the rope's factor and original_max_positions";
    p.push_back({"factor", factor.value_or(1.0)});
    p.push_back({"original_max_position_embeddings", original.value_or(0)});
  }
  if (kind == "yarn") {
    p.push_back({"beta_fast", irNumber(ir, "beta_fast").value_or(32.0)});
    p.push_back({"beta_slow", irNumber(ir, "beta_slow").value_or(1.0)});
    p.push_back({"mscale", irNumber(ir, "mscale").value_or(1.0)});
    p.push_back({"mscale_all_dim", irNumber(ir, "mscale_all_dim").value_or(0.0)});
    p.push_back({"truncate", irBool(ir, "truncate").value_or(true) ? 1.0 : 0.0});
  }
  if (kind == "llama3") {
    p.push_back({"low_freq_factor", irNumber(ir, "low_freq_factor").value_or(1.0)});
    p.push_back({"high_freq_factor", irNumber(ir, "high_freq_factor").value_or(4.0)});
  }
  if (kind == "mrope") {
    std::vector<int64_t> s = irArray(ir, "mrope_section");
    if (s.size() != 3)
      missing = "mrope_section (three sections)";
    else
      p.insert(p.end(), {{"mrope_section_t", double(s[0])},
                         {"mrope_section_h", double(s[1])},
                         {"mrope_section_w", double(s[2])}});
  }
  return p;
}

ParamList attentionParams(const Json &f, const std::string &ir, std::string &missing) {
  bool sliding = f.value("window", "none") == "sliding";
  ParamList p = {{"use_sinks", f.value("sinks", "no") == "yes" ? 1.0 : 0.0}};
  if (sliding) {
    auto w = irNumber(ir, "window_size");
    if (!w)
      missing = "window_size";
    p.push_back({"window", w.value_or(0)});
  }
  return p;
}

ParamList gluParams(const Json &f, const std::string &ir, std::string &missing) {
  bool clamped = f.value("swiglu", "plain") == "clamped";
  ParamList p = {{"clamped", clamped ? 1.0 : 0.0}};
  if (clamped) {
    auto limit = irNumber(ir, "swiglu_limit");
    if (!limit)
      missing = "swiglu_limit";
    p.push_back({"limit", limit.value_or(0)});
    p.push_back({"alpha", irNumber(ir, "swiglu_alpha").value_or(1.702)});
  }
  return p;
}

ParamList modelParams(const std::string &task, const Json &component, const std::string &ir,
                      std::string &missing) {
  const Json f = component.value("features", Json::object());
  if (task == "moe_routing")
    return routingParams(f, ir);
  if (task == "rope")
    return ropeParams(f, ir, missing);
  if (task == "attention_core")
    return attentionParams(f, ir, missing);
  if (task == "glu_activation")
    return gluParams(f, ir, missing);
  return {};
}

/// The closest registry entry of the component's op: fewest features whose
/// value its "match" lists leave out. Returns the differing "key=value"s.
std::vector<std::pair<std::string, std::string>>
closestDifference(const Json &component, const Json &registry, std::string &entryId) {
  std::vector<std::pair<std::string, std::string>> best;
  bool found = false;
  const Json features = component.value("features", Json::object());
  if (!registry.contains("ops") || !registry["ops"].is_array())
    return best;
  for (const Json &entry : registry["ops"]) {
    if (!entry.is_object() || entry.value("op", "") != component.value("op", "") ||
        entry.value("status", "") == "excluded")
      continue;
    std::vector<std::pair<std::string, std::string>> diff;
    const Json match = entry.value("match", Json::object());
    for (auto it = features.begin(); it != features.end(); ++it) {
      if (!match.contains(it.key()) || !match[it.key()].is_array())
        continue;
      std::string value = featureValue(features, it.key());
      bool listed = false;
      for (const Json &v : match[it.key()])
        listed |= v.is_string() && v.get<std::string>() == value;
      if (!listed)
        diff.push_back({it.key(), value});
    }
    if (!found || diff.size() < best.size()) {
      best = diff;
      entryId = entry.value("id", "");
      found = true;
    }
  }
  return best;
}

} // namespace

CandidateTask chooseCandidateTask(const Json &component, const Json &registry,
                                  const std::string &irText) {
  CandidateTask task;
  std::string op = component.value("op", "");
  std::string entryId;
  auto diff = closestDifference(component, registry, entryId);
  if (entryId.empty()) {
    task.reason = "no op-stage task for " + op + ": the registry has no entry of this op to "
                  "compare the component with";
    return task;
  }
  std::set<std::string> tasks;
  std::string differing;
  if (diff.empty()) {
    // The variant is listed, but its entry does not run (planned, or no
    // forward/backward): the op's central numerics are what is missing.
    static const std::map<std::string, std::string> primary = {
        {"adapt.moe", "moe_routing"},
        {"adapt.attention", "attention_core"},
        {"adapt.mlp", "glu_activation"}};
    auto it = primary.find(op);
    if (it == primary.end()) {
      task.reason = "no op-stage task for " + op + ": the component's features match " +
                    entryId + ", which does not run yet (see the gap reasons)";
      return task;
    }
    tasks.insert(it->second);
    differing = "the whole op (" + entryId + " does not run yet)";
  }
  for (const auto &[key, value] : diff) {
    differing += (differing.empty() ? "" : ", ") + key + "=" + value;
    const FeatureTask *row = nullptr;
    for (const FeatureTask &r : featureTasks())
      if (op == r.op && key == r.feature)
        row = &r;
    if (!row) {
      task.reason = "no op-stage task for " + key + "=" + value + " of " + op +
                    " (closest entry " + entryId + ")";
      return task;
    }
    if (!row->definedValues.count(value)) {
      task.reason = key + "=" + value + ": no definition of this " + row->kindWord +
                    " in the op stage (task " + row->task + " defines " + key + " = ";
      std::string values;
      for (const std::string &v : row->definedValues)
        values += (values.empty() ? "" : "|") + v;
      task.reason += values + ")";
      return task;
    }
    tasks.insert(row->task);
  }
  if (tasks.size() > 1) {
    std::string names;
    for (const std::string &t : tasks)
      names += (names.empty() ? "" : ", ") + t;
    task.reason = "no single op-stage task: " + differing + " (vs " + entryId +
                  ") need different tasks (" + names + ")";
    return task;
  }
  std::string missing;
  modelParams(*tasks.begin(), component, irText, missing);
  if (!missing.empty()) {
    task.reason = "task " + *tasks.begin() + " for " + differing + " needs " + missing +
                  " from the op's IR line, which is not available (generate from the model "
                  "folder, not from a gaps.json)";
    return task;
  }
  task.name = *tasks.begin();
  task.feature = differing;
  task.closestEntry = entryId;
  return task;
}

std::vector<std::string> candidateCheckerParams(const CandidateTask &task,
                                                const Json &component,
                                                const std::string &irText) {
  std::string missing;
  std::vector<std::string> args;
  for (const auto &[key, value] : modelParams(task.name, component, irText, missing))
    args.insert(args.end(), {"--param", key + "=" + number(value)});
  return args;
}

std::string candidateTaskPrompt(const CandidateTask &task, const Json &component,
                                const std::string &irText) {
  std::string missing;
  ParamList params = modelParams(task.name, component, irText, missing);
  std::ostringstream os;
  os << "The component differs from the library's closest entry (" << task.closestEntry
     << ") in: " << task.feature << ". Write that piece, op-stage task `" << task.name
     << "`, as a LibTorch composite.\n\n";
  if (task.name == "moe_routing") {
    const Json f = component.value("features", Json::object());
    os << "MoE router weights of this variant:\n"
          "  scores = "
       << (f.value("scoring", "softmax") == "sigmoid" ? "sigmoid(logits)" : "softmax(logits, -1)")
       << "            // float32, [T, E]\n"
          "  choice = scores + bias                   // if params[\"use_bias\"] != 0\n"
          "  grouped (n_group > 1): experts split into n_group equal groups; a group's score is\n"
          "    the sum of its two largest choice values; keep the topk_group best groups, others\n"
          "    are excluded (-inf) from the choice\n"
          "  idx = top_k indices of choice per token\n"
          "  w = scores gathered at idx; if norm_topk_prob != 0: w = w / (w.sum(-1) + 1e-20)\n"
          "  w = w * routed_scaling_factor\n"
          "  return a dense [T, E] tensor: w at idx, 0 elsewhere (differentiable w.r.t. logits)\n"
          "inputs = {logits [T, E] float32, bias [E] float32};\n"
          "params: top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor, use_bias,\n"
          "scoring (0 softmax, 1 sigmoid).\n"
          "Shown shape: T=5 E=8 top_k=2 n_group=4 topk_group=2.\n";
  } else if (task.name == "rope") {
    os << "Rotary position embedding, applied to q or k as transformers 5.17 does:\n"
          "inputs = {x [T, H, D] float32, positions [A, T] int64} (A = 3 for mrope: temporal,\n"
          "height, width rows; else 1); output [T, H, D].\n"
          "params: rotary_dim (rotate x[..., :rotary_dim]; x[..., rotary_dim:] passes through\n"
          "unchanged), theta, scaling (0 default, 1 yarn, 2 llama3), interleaved, mrope, and\n"
          "the scaling's own params below.\n"
          "  inv_freq[j] = 1 / theta^(2j / rotary_dim), j = 0 .. rotary_dim/2 - 1 (default)\n"
          "  yarn (modeling_rope_utils._compute_yarn_parameters with dim = rotary_dim): params\n"
          "    factor, original_max_position_embeddings, beta_fast, beta_slow, mscale,\n"
          "    mscale_all_dim, truncate; c(r) = rotary_dim * ln(original_max_position_embeddings\n"
          "    / (2 pi r)) / (2 ln theta); low = c(beta_fast), high = c(beta_slow) (floor(low),\n"
          "    ceil(high) only when truncate != 0); low = max(low, 0), high = min(high,\n"
          "    rotary_dim - 1), high += 0.001 when equal; ramp[j] = clamp((j - low) / (high -\n"
          "    low), 0, 1); inv[j] = inv[j] / factor * ramp[j] + inv[j] * (1 - ramp[j]);\n"
          "    attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)\n"
          "    when both are non-zero, else get_mscale(factor) = 0.1 ln(factor) + 1 (1 if\n"
          "    factor <= 1); cos and sin are multiplied by attention_factor\n"
          "  llama3 (_compute_llama3_parameters): params factor, low_freq_factor,\n"
          "    high_freq_factor, original_max_position_embeddings (L); wavelen = 2 pi / inv[j];\n"
          "    wavelen < L / high_freq_factor: unchanged; wavelen > L / low_freq_factor:\n"
          "    inv / factor; else s = (L / wavelen - low_freq_factor) / (high_freq_factor -\n"
          "    low_freq_factor), inv = (1 - s) * inv / factor + s * inv\n"
          "  angle[t, j] = positions[axis(j), t] * inv_freq[j]; axis(j) = 0 unless mrope != 0:\n"
          "    Qwen3-VL's interleaved M-RoPE: axis 1 (height) when j % 3 == 1 and\n"
          "    j < 3 * mrope_section_h, axis 2 (width) when j % 3 == 2 and j < 3 * mrope_section_w,\n"
          "    else 0 (params mrope_section_t/h/w)\n"
          "  pairs: interleaved == 0: (x[j], x[j + rotary_dim/2]) as rotate_half; interleaved != 0:\n"
          "    (x[2j], x[2j+1]) as Llama 4's complex form; (a, b) -> (a cos - b sin, b cos + a sin)\n"
          "Shown shape: T=5 H=3 D=16 rotary_dim=16 (mrope: mrope_section=[4,2,2]).\n";
  } else if (task.name == "attention_core") {
    os << "Causal softmax attention after the projections and RoPE (transformers 5.17 eager\n"
          "attention; gpt-oss for the sinks):\n"
          "inputs = {q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], sinks [Hq]} float32; output\n"
          "[T, Hq, D]. Query head h reads key/value head h / (Hq / Hkv) (repeat_kv).\n"
          "params: scale (logit multiplier), window (0: every key s <= t; else the sliding\n"
          "window: query t sees keys s with t - window < s <= t), use_sinks.\n"
          "  logits[s] = scale * q[t, h] . k[s, kv]; when use_sinks != 0 the head's sinks[h] is\n"
          "  appended as one more logit: it takes probability mass in the softmax but has no\n"
          "  value; out[t, h] = sum_s softmax(logits)[s] * v[s, kv]. Differentiable w.r.t. q, k,\n"
          "  v and sinks.\n"
          "Shown shape: T=6 Hq=4 Hkv=2 D=8 (window=3 when sliding).\n";
  } else if (task.name == "glu_activation") {
    os << "The gated activation between the gate/up and down projections:\n"
          "inputs = {gate [T, I], up [T, I]} float32; output [T, I].\n"
          "params: clamped; alpha and limit when clamped.\n"
          "  clamped == 0: silu(gate) * up\n"
          "  clamped != 0 (gpt-oss, GptOssExperts): gate = gate.clamp(max=limit);\n"
          "    up = up.clamp(-limit, limit); out = (up + 1) * gate * sigmoid(gate * alpha)\n"
          "Differentiable w.r.t. gate and up. Shown shape: T=5 I=16.\n";
  }
  os << "This model's params (the checker passes them; per-shape params - top_k, n_group,\n"
        "topk_group, rotary_dim, mrope_section_*, window, scale - are set per test shape):";
  for (const auto &[key, value] : params)
    os << " " << key << "=" << number(value);
  os << "\n";
  return os.str();
}

bool hasCandidateTask(const Json &component, const Json &registry, const std::string &irText) {
  return !chooseCandidateTask(component, registry, irText).name.empty();
}

} // namespace adapt::agent
