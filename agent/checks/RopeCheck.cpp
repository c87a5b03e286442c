//===- RopeCheck.cpp - op-stage task `rope` -------------------------------===//
//
// Rotary position embedding as transformers 5.17 applies it to q or k.
//
// Inputs: x [T, H, D] float, positions [A, T] int64 (A = 3 for M-RoPE:
// temporal, height, width; else 1). Output [T, H, D].
// Params (model): theta, scaling (0 default, 1 yarn, 2 llama3), interleaved
// (0: halves as HF's rotate_half; 1: adjacent pairs as Llama 4's complex
// form), mrope (0/1), yarn: factor, original_max_position_embeddings,
// beta_fast, beta_slow, mscale, mscale_all_dim, truncate, attention_factor
// (0 = derived); llama3: factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings. Per case: rotary_dim (the first
// rotary_dim features rotate, the rest pass through) and, for M-RoPE,
// mrope_section_t/h/w.
//
// The reference is the definition written out in float64: the inverse
// frequencies as modeling_rope_utils computes them (_compute_default /
// _compute_yarn / _compute_llama3_parameters), the M-RoPE axis of frequency
// j as Qwen3-VL's interleaved recomposition picks it (j % 3 == 1 and
// j < 3 * section_h: height; j % 3 == 2 and j < 3 * section_w: width; else
// temporal), and each rotated pair (a, b) -> (a cos - b sin, b cos + a sin)
// scaled by the attention factor.
//
//===----------------------------------------------------------------------===//

#include "agent/checks/CheckHarness.h"

#include <cmath>

namespace adapt::candidate_check {
namespace {

/// yarn's attention scaling (HF get_mscale).
double yarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

/// Inverse frequencies of the rotary dims (rotary_dim / 2 of them) and the
/// factor cos/sin are scaled by, per the model's scaling kind.
std::vector<double> inverseFrequencies(const Params &p, double &attentionFactor) {
  int64_t dim = int64_t(p.at("rotary_dim"));
  double theta = p.at("theta");
  int scaling = int(param(p, "scaling", 0));
  std::vector<double> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i)
    inv[i] = 1.0 / std::pow(theta, double(2 * i) / double(dim));
  attentionFactor = 1.0;
  if (scaling == 1) { // yarn
    double factor = p.at("factor");
    double original = p.at("original_max_position_embeddings");
    double mscale = param(p, "mscale", 0), mscaleAllDim = param(p, "mscale_all_dim", 0);
    attentionFactor = param(p, "attention_factor", 0);
    if (attentionFactor == 0)
      attentionFactor = mscale != 0 && mscaleAllDim != 0
                            ? yarnMscale(factor, mscale) / yarnMscale(factor, mscaleAllDim)
                            : yarnMscale(factor, 1.0);
    double betaFast = param(p, "beta_fast", 32), betaSlow = param(p, "beta_slow", 1);
    auto correctionDim = [&](double rotations) {
      return (double(dim) * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(theta));
    };
    double low = correctionDim(betaFast), high = correctionDim(betaSlow);
    if (param(p, "truncate", 1) != 0) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high)
      high += 0.001;
    for (int64_t i = 0; i < dim / 2; ++i) {
      double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      double extrapolation = 1.0 - ramp;
      inv[i] = inv[i] / factor * (1.0 - extrapolation) + inv[i] * extrapolation;
    }
  } else if (scaling == 2) { // llama3
    double factor = p.at("factor"), lowFactor = p.at("low_freq_factor");
    double highFactor = p.at("high_freq_factor");
    double original = p.at("original_max_position_embeddings");
    double lowWavelen = original / lowFactor, highWavelen = original / highFactor;
    for (double &f : inv) {
      double wavelen = 2 * M_PI / f;
      if (wavelen < highWavelen)
        continue;
      if (wavelen > lowWavelen) {
        f = f / factor;
        continue;
      }
      double smooth = (original / wavelen - lowFactor) / (highFactor - lowFactor);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
  return inv;
}

/// The position axis frequency \p j uses (0 temporal, 1 height, 2 width).
int64_t mropeAxis(int64_t j, const Params &p) {
  if (param(p, "mrope", 0) == 0)
    return 0;
  if (j % 3 == 1 && j < 3 * int64_t(p.at("mrope_section_h")))
    return 1;
  if (j % 3 == 2 && j < 3 * int64_t(p.at("mrope_section_w")))
    return 2;
  return 0;
}

/// The float64 reference, pair by pair.
torch::Tensor ropeReference(const std::vector<torch::Tensor> &inputs, const Params &p) {
  const torch::Tensor &x = inputs[0], &positions = inputs[1];
  int64_t T = x.size(0), D = x.size(2), rotary = int64_t(p.at("rotary_dim")), half = rotary / 2;
  bool interleaved = param(p, "interleaved", 0) != 0;
  double attentionFactor = 1;
  std::vector<double> inv = inverseFrequencies(p, attentionFactor);
  auto pos = positions.accessor<int64_t, 2>();
  std::vector<torch::Tensor> columns(D);
  for (int64_t j = 0; j < half; ++j) {
    torch::Tensor cosine = torch::empty({T, 1}, torch::kFloat64);
    torch::Tensor sine = torch::empty({T, 1}, torch::kFloat64);
    int64_t axis = mropeAxis(j, p);
    for (int64_t t = 0; t < T; ++t) {
      double angle = double(pos[axis][t]) * inv[j];
      cosine[t][0] = std::cos(angle) * attentionFactor;
      sine[t][0] = std::sin(angle) * attentionFactor;
    }
    int64_t ia = interleaved ? 2 * j : j, ib = interleaved ? 2 * j + 1 : j + half;
    torch::Tensor a = x.select(2, ia), b = x.select(2, ib);
    columns[ia] = a * cosine - b * sine;
    columns[ib] = b * cosine + a * sine;
  }
  for (int64_t d = rotary; d < D; ++d)
    columns[d] = x.select(2, d);
  return torch::stack(columns, 2);
}

/// A straightforward composite (timing only): cos/sin tables, rotate_half.
torch::Tensor ropeBaseline(const std::vector<torch::Tensor> &inputs, const Params &p) {
  torch::Tensor x = inputs[0], positions = inputs[1];
  int64_t rotary = int64_t(p.at("rotary_dim")), half = rotary / 2;
  double attentionFactor = 1;
  std::vector<double> invValues = inverseFrequencies(p, attentionFactor);
  torch::Tensor inv = torch::tensor(invValues, torch::kFloat64).to(x.device(), torch::kFloat32);
  torch::Tensor axes = torch::zeros({half}, torch::kLong);
  for (int64_t j = 0; j < half; ++j)
    axes[j] = mropeAxis(j, p);
  axes = axes.to(x.device());
  torch::Tensor pos = positions.to(torch::kFloat32).index_select(0, axes).t(); // [T, half]
  torch::Tensor freqs = pos * inv;
  torch::Tensor cosine = (freqs.cos() * attentionFactor).unsqueeze(1);
  torch::Tensor sine = (freqs.sin() * attentionFactor).unsqueeze(1);
  torch::Tensor rot = x.narrow(2, 0, rotary), pass = x.narrow(2, rotary, x.size(2) - rotary);
  torch::Tensor a, b;
  if (param(p, "interleaved", 0) != 0) {
    a = rot.slice(2, 0, rotary, 2);
    b = rot.slice(2, 1, rotary, 2);
    torch::Tensor out = torch::stack({a * cosine - b * sine, b * cosine + a * sine}, -1);
    return torch::cat({out.flatten(2), pass}, 2);
  }
  a = rot.narrow(2, 0, half);
  b = rot.narrow(2, half, half);
  return torch::cat({a * cosine - b * sine, b * cosine + a * sine, pass}, 2);
}

/// One test shape: tokens, heads, head dim, rotary dims, M-RoPE sections.
struct RopeShape {
  int64_t tokens, heads, headDim, rotaryDim;
  int64_t sectionT, sectionH, sectionW; ///< M-RoPE only; sum = rotaryDim / 2.
  bool shownInPrompt;
};

std::vector<CheckCase> ropeCases(const Params &model, uint64_t seed) {
  bool mrope = param(model, "mrope", 0) != 0;
  std::vector<RopeShape> shapes;
  if (mrope) {
    shapes = {{5, 3, 16, 16, 4, 2, 2, true},  {7, 2, 24, 24, 4, 4, 4, false},
              {9, 1, 20, 20, 4, 3, 3, false}, {4, 4, 14, 8, 2, 1, 1, false},
              {1, 5, 8, 8, 2, 1, 1, false}};
    // The model's own sections at its head size, when given.
    int64_t t = int64_t(param(model, "mrope_section_t", 0));
    int64_t h = int64_t(param(model, "mrope_section_h", 0));
    int64_t w = int64_t(param(model, "mrope_section_w", 0));
    if (t + h + w > 0)
      shapes.push_back({3, 2, 2 * (t + h + w), 2 * (t + h + w), t, h, w, false});
  } else {
    shapes = {{5, 3, 16, 16, 0, 0, 0, true},  {7, 2, 24, 12, 0, 0, 0, false},
              {1, 5, 8, 8, 0, 0, 0, false},   {13, 1, 34, 34, 0, 0, 0, false},
              {4, 4, 20, 8, 0, 0, 0, false},  {3, 2, 128, 128, 0, 0, 0, false}};
  }
  return casesOf(
      shapes, [&](const RopeShape &s) { return seed + s.tokens * 37 + s.headDim; },
      [&](const RopeShape &s, CheckCase &c) {
        c.shape = shapeText({{"T", s.tokens}, {"H", s.heads}, {"D", s.headDim},
                             {"rotary_dim", s.rotaryDim}});
        if (mrope)
          c.shape += " mrope_section=[" + std::to_string(s.sectionT) + "," +
                     std::to_string(s.sectionH) + "," + std::to_string(s.sectionW) + "]";
        // Defaults where the model says nothing.
        c.params =
            withDefaults(model, {{"theta", 10000.0}, {"scaling", 0}, {"interleaved", 0}, {"mrope", 0}});
        c.params["rotary_dim"] = double(s.rotaryDim);
        if (mrope) {
          c.params["mrope_section_t"] = double(s.sectionT);
          c.params["mrope_section_h"] = double(s.sectionH);
          c.params["mrope_section_w"] = double(s.sectionW);
        }
        // Positions stay small (< 24) so fp32 angles are exact to ~1e-6: the
        // tolerance then measures the candidate, not fp32 rounding of angles.
        torch::Tensor positions = torch::randint(0, 24, {mrope ? 3 : 1, s.tokens}, torch::kLong);
        torch::Tensor x = torch::rand({s.tokens, s.heads, s.headDim}, torch::kFloat64) * 2 - 1;
        c.inputs = {{"x", x, true}, {"positions", positions, false}};
      });
}

} // namespace

/// yarn and llama3 have no defaults worth guessing for their numbers.
std::string ropeMissingParams(const Params &p) {
  int scaling = int(param(p, "scaling", 0));
  if (scaling == 1)
    return requireParams(p, {"factor", "original_max_position_embeddings"}, "yarn");
  if (scaling == 2)
    return requireParams(p, {"factor", "low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings"},
                         "llama3");
  return "";
}

TaskSpec ropeTask() {
  TaskSpec spec{"rope", ropeCases, ropeReference, ropeBaseline};
  spec.missingParams = ropeMissingParams;
  return spec;
}

} // namespace adapt::candidate_check
