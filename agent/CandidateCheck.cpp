//===- CandidateCheck.cpp - the op stage for LLM-written candidates ------===//
//
//   adapt-candidate-check --compile-flags
//   adapt-candidate-check --task moe_routing --library CAND.so --out RESULT.json
//                         [--param key=value ...] [--seed N]
//
// `adapt generate` runs this program as a child process (with time and
// memory limits) for every candidate an LLM wrote: it dlopens the candidate's
// shared object, calls its `adapt_candidate` entry on random inputs of several
// shapes (including shapes the prompt never showed), and compares forward and
// backward against a float64 reference that lives only in this executable (no
// exported symbols: the candidate can neither see nor call it). Inputs are
// poisoned views (NaN around them in memory), so a candidate that reads past
// its inputs or assumes contiguity produces NaN. The result is JSON.
//
// Exit codes: 0 every check passed, 4 a check failed, 2 bad usage or the
// library could not be loaded.
//
//===----------------------------------------------------------------------===//

#include <torch/torch.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

/// The signature every candidate defines (see docs/agent.md).
using CandidateFn = torch::Tensor (*)(const std::vector<torch::Tensor> &,
                                      const std::map<std::string, double> &);

/// One test shape of the routing task.
struct RoutingShape {
  int64_t tokens, experts, topK, groups, topkGroups;
  bool shownInPrompt;
};

/// The float64 reference: MoE router weights, written as the plain per-token
/// definition (loops, no shared code with any candidate or the runtime).
torch::Tensor routingReference(const torch::Tensor &logits, const torch::Tensor &bias,
                               const std::map<std::string, double> &p) {
  int64_t T = logits.size(0), E = logits.size(1);
  int64_t topK = int64_t(p.at("top_k")), groups = int64_t(p.at("n_group"));
  int64_t topkGroups = int64_t(p.at("topk_group"));
  bool sigmoid = p.at("scoring") != 0, useBias = p.at("use_bias") != 0;
  torch::Tensor scores = sigmoid ? torch::sigmoid(logits) : torch::softmax(logits, -1);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> choice(E);
    for (int64_t e = 0; e < E; ++e)
      choice[e] = scores[t][e].item<double>() + (useBias ? bias[e].item<double>() : 0.0);
    int64_t perGroup = E / groups;
    std::vector<std::pair<double, int64_t>> groupScores;
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> members(choice.begin() + g * perGroup,
                                  choice.begin() + (g + 1) * perGroup);
      std::sort(members.rbegin(), members.rend());
      double s = members[0] + (members.size() > 1 ? members[1] : 0.0);
      groupScores.push_back({s, g});
    }
    std::sort(groupScores.begin(), groupScores.end(),
              [](auto a, auto b) { return a.first > b.first; });
    std::vector<bool> allowed(E, groups <= 1);
    for (int64_t i = 0; i < topkGroups && groups > 1; ++i)
      for (int64_t e = 0; e < perGroup; ++e)
        allowed[groupScores[i].second * perGroup + e] = true;
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t e = 0; e < E; ++e)
      if (allowed[e])
        ranked.push_back({choice[e], e});
    std::sort(ranked.begin(), ranked.end(),
              [](auto a, auto b) { return a.first > b.first; });
    torch::Tensor mask = torch::zeros({E}, logits.options());
    for (int64_t i = 0; i < topK; ++i)
      mask[ranked[i].second] = 1.0;
    torch::Tensor w = scores[t] * mask;
    if (p.at("norm_topk_prob") != 0)
      w = w / (w.sum() + 1e-20);
    rows.push_back(w * p.at("routed_scaling_factor"));
  }
  return torch::stack(rows);
}

/// A view of \p values inside a NaN-filled buffer with a non-unit stride.
torch::Tensor poisoned(const torch::Tensor &values) {
  std::vector<int64_t> big(values.sizes().begin(), values.sizes().end());
  big.back() = big.back() * 2 + 3;
  torch::Tensor buffer = torch::full(big, std::nan(""), values.options());
  torch::Tensor view = buffer.narrow(-1, 1, values.size(-1) * 2).slice(-1, 0, c10::nullopt, 2);
  view.copy_(values);
  return view;
}

std::string jsonEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out;
}

/// Runs the routing task; appends one JSON object per check to \p checks.
bool runRouting(CandidateFn candidate, std::map<std::string, double> params,
                uint64_t seed, std::vector<std::string> &checks, double &speedup) {
  std::vector<RoutingShape> shapes = {{5, 8, 2, 4, 2, true},   {7, 16, 4, 4, 2, false},
                                      {3, 12, 3, 3, 1, false}, {11, 6, 2, 1, 1, false},
                                      {2, 32, 8, 8, 4, false}};
  bool allPassed = true;
  double candidateSeconds = 0, baselineSeconds = 0;
  for (const RoutingShape &s : shapes) {
    torch::manual_seed(seed + s.tokens * 131 + s.experts);
    params["top_k"] = double(s.topK);
    params["n_group"] = double(s.groups);
    params["topk_group"] = double(s.topkGroups);
    // Distinct logits (a permutation plus small noise): no near-ties in top-k.
    torch::Tensor logits64 = torch::empty({s.tokens, s.experts}, torch::kFloat64);
    for (int64_t t = 0; t < s.tokens; ++t)
      logits64[t] = (torch::randperm(s.experts, torch::kFloat64) +
                     0.3 * torch::rand({s.experts}, torch::kFloat64)) * (3.0 / s.experts);
    torch::Tensor bias64 = 0.05 * torch::randn({s.experts}, torch::kFloat64);
    torch::Tensor upstream = torch::randn({s.tokens, s.experts}, torch::kFloat64);
    std::string name = "T=" + std::to_string(s.tokens) + " E=" + std::to_string(s.experts) +
                       " top_k=" + std::to_string(s.topK) + " n_group=" +
                       std::to_string(s.groups) + " topk_group=" + std::to_string(s.topkGroups) +
                       (s.shownInPrompt ? "" : " (unseen shape)");
    std::string status = "passed", detail;
    double fwdErr = 0, bwdErr = 0;
    try {
      torch::Tensor ref64In = logits64.clone().requires_grad_(true);
      torch::Tensor ref = routingReference(ref64In, bias64, params);
      (ref * upstream).sum().backward();
      torch::Tensor leaf = logits64.to(torch::kFloat32).requires_grad_(true);
      torch::Tensor in = poisoned(leaf);
      auto start = std::chrono::steady_clock::now();
      torch::Tensor out = candidate({in, poisoned(bias64.to(torch::kFloat32))}, params);
      candidateSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      start = std::chrono::steady_clock::now();
      {
        torch::NoGradGuard noGrad;
        routingReference(logits64.to(torch::kFloat32), bias64.to(torch::kFloat32), params);
      }
      baselineSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!out.defined() || out.sizes() != ref.sizes()) {
        status = "failed";
        detail = "output shape " + (out.defined() ? c10::str(out.sizes()) : std::string("undefined")) +
                 ", expected " + c10::str(ref.sizes());
      } else if (!torch::isfinite(out).all().item<bool>()) {
        status = "failed";
        detail = "output has NaN/Inf (poisoned inputs read out of bounds?)";
      } else {
        torch::Tensor diff = (out.to(torch::kFloat64) - ref.detach()).abs();
        fwdErr = (diff / (ref.detach().abs() + 1.0)).max().item<double>();
        if (fwdErr > 1e-5) {
          status = "failed";
          detail = "forward differs from the reference (max rel error " + std::to_string(fwdErr) + ")";
        } else if (!out.requires_grad()) {
          status = "failed";
          detail = "output does not depend differentiably on the logits (no backward)";
        } else {
          (out * upstream.to(torch::kFloat32)).sum().backward();
          torch::Tensor g = leaf.grad();
          if (!g.defined()) {
            status = "failed";
            detail = "no gradient reached the logits";
          } else {
            bwdErr = ((g.to(torch::kFloat64) - ref64In.grad()).abs() /
                      (ref64In.grad().abs() + 1.0)).max().item<double>();
            if (!(bwdErr <= 1e-5)) {
              status = "failed";
              detail = "backward differs from the reference (max rel error " + std::to_string(bwdErr) + ")";
            }
          }
        }
      }
    } catch (const std::exception &e) {
      status = "failed";
      detail = std::string("threw: ") + e.what();
      detail = detail.substr(0, 600);
    }
    allPassed &= status == "passed";
    std::ostringstream os;
    os << "{\"shape\": \"" << jsonEscape(name) << "\", \"status\": \"" << status
       << "\", \"forward_max_rel_error\": " << fwdErr << ", \"backward_max_rel_error\": " << bwdErr
       << ", \"detail\": \"" << jsonEscape(detail) << "\"}";
    checks.push_back(os.str());
  }
  speedup = candidateSeconds > 0 ? baselineSeconds / candidateSeconds : 0;
  return allPassed;
}

} // namespace

int main(int argc, char **argv) {
  std::string task, library, out;
  uint64_t seed = 1234;
  std::map<std::string, double> params = {{"scoring", 0},        {"use_bias", 1},
                                          {"norm_topk_prob", 1}, {"routed_scaling_factor", 1.0}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--compile-flags") {
      std::cout << ADAPT_CANDIDATE_COMPILE_FLAGS << "\n";
      return 0;
    } else if (arg == "--task") {
      task = next();
    } else if (arg == "--library") {
      library = next();
    } else if (arg == "--out") {
      out = next();
    } else if (arg == "--seed") {
      seed = std::stoull(next());
    } else if (arg == "--param") {
      std::string kv = next();
      size_t eq = kv.find('=');
      if (eq == std::string::npos) {
        std::cerr << "adapt-candidate-check: --param expects key=value\n";
        return 2;
      }
      params[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
    } else {
      std::cerr << "adapt-candidate-check: unknown argument " << arg << "\n";
      return 2;
    }
  }
  if (task != "moe_routing" || library.empty() || out.empty()) {
    std::cerr << "usage: adapt-candidate-check --task moe_routing --library SO --out JSON\n";
    return 2;
  }
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::ofstream(out) << "{\"status\": \"failed\", \"reason\": \"cannot load the candidate: "
                       << jsonEscape(dlerror()) << "\", \"checks\": []}\n";
    return 4;
  }
  using Entry = void *(*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "adapt_candidate_entry"));
  if (!entry) {
    std::ofstream(out) << "{\"status\": \"failed\", \"reason\": \"the candidate defines no "
                          "adapt_candidate\", \"checks\": []}\n";
    return 4;
  }
  auto candidate = reinterpret_cast<CandidateFn>(entry());
  std::vector<std::string> checks;
  double speedup = 0;
  bool passed = runRouting(candidate, params, seed, checks, speedup);
  std::ofstream os(out);
  os << "{\"status\": \"" << (passed ? "passed" : "failed") << "\", \"task\": \"" << task
     << "\", \"speedup_over_composite\": " << speedup << ", \"checks\": [";
  for (size_t i = 0; i < checks.size(); ++i)
    os << (i ? ", " : "") << checks[i];
  os << "]}\n";
  return passed ? 0 : 4;
}
