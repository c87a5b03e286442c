//===- OpCheckVision.cpp - op-stage checks: the Qwen3-VL vision tower ===//
//
// Checks of the Qwen3-VL vision tower against float64 references written here
// from the definitions (loops over patches, naive softmax, F.interpolate):
// the 2-D vision RoPE, the position-embedding resampling, attention inside
// each image, and the text side's M-RoPE positions and tables. Forward and
// backward, odd grids and head dims.
//
//===----------------------------------------------------------------------===//

#include "validation/opcheck/OpCheckHarness.h"

#include "runtime/Vision.h"

#include <array>

namespace adapt::rt::opcheck {

namespace {

using Grid = std::vector<std::array<int64_t, 3>>;

Tensor gridTensor(const Grid &g) {
  std::vector<int64_t> flat;
  for (const auto &thw : g)
    flat.insert(flat.end(), thw.begin(), thw.end());
  return torch::tensor(flat, i64).view({int64_t(g.size()), 3});
}

int64_t patches(const Grid &g) {
  int64_t n = 0;
  for (const auto &[t, h, w] : g)
    n += t * h * w;
  return n;
}

/// (row, col) per patch by explicit loops: frames, merge blocks, in-block.
std::vector<std::array<int64_t, 2>> refPositions(const Grid &g, int64_t m) {
  std::vector<std::array<int64_t, 2>> out;
  for (const auto &[t, h, w] : g)
    for (int64_t f = 0; f < t; ++f)
      for (int64_t br = 0; br < h / m; ++br)
        for (int64_t bc = 0; bc < w / m; ++bc)
          for (int64_t ir = 0; ir < m; ++ir)
            for (int64_t ic = 0; ic < m; ++ic)
              out.push_back({br * m + ir, bc * m + ic});
  return out;
}

/// Rotates x [N, heads, D] in double: frequency j < D/4 by the row, the next
/// D/4 by the column; pairs (i, i + D/2).
Tensor refVisionRope(const Tensor &x, const Grid &g, int64_t m, double theta) {
  const int64_t n = x.size(0), d = x.size(2), quarter = d / 4;
  auto pos = refPositions(g, m);
  Tensor angle = torch::zeros({n, d / 2}, f64);
  auto acc = angle.accessor<double, 2>();
  for (int64_t p = 0; p < n; ++p)
    for (int64_t j = 0; j < d / 2; ++j) {
      int64_t axis = j < quarter ? 0 : 1, i = j % quarter;
      acc[p][j] = double(pos[p][axis]) * std::pow(theta, -2.0 * i / double(d / 2));
    }
  Tensor cos = angle.cos().unsqueeze(1), sin = angle.sin().unsqueeze(1);
  Tensor a = x.narrow(-1, 0, d / 2), b = x.narrow(-1, d / 2, d / 2);
  return torch::cat({a * cos - b * sin, b * cos + a * sin}, -1);
}

Trial visionRopeTrial(const Ctx &c, const Grid &g, int64_t m, int64_t heads, int64_t d) {
  const int64_t n = patches(g);
  Input x = input(c, torch::randn({n, heads, d}, f64), true);
  RopeTables tables = visionRopeTables(gridTensor(g), m, d, 10000.0, c.device);
  Tensor ours = applyVisionRope(x.ours, tables);
  Tensor ref = refVisionRope(x.ref, g, m, 10000.0);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}});
  return t;
}

/// Resampling by F.interpolate (bilinear, align_corners) of the [side, side]
/// table to each image's grid, then read in merge-block order.
Tensor refInterpolate(const Tensor &table, const Grid &g, int64_t m) {
  const int64_t side = int64_t(std::llround(std::sqrt(double(table.size(0))))), hdim = table.size(1);
  Tensor grid = table.view({side, side, hdim}).permute({2, 0, 1}).unsqueeze(0);
  std::vector<Tensor> out;
  for (const auto &[t, h, w] : g) {
    Tensor r = torch::nn::functional::interpolate(
                   grid, torch::nn::functional::InterpolateFuncOptions()
                             .size(std::vector<int64_t>{h, w})
                             .mode(torch::kBilinear)
                             .align_corners(true))
                   .squeeze(0)
                   .permute({1, 2, 0}); // [h, w, H]
    for (const auto &[row, col] : refPositions({{t, h, w}}, m))
      out.push_back(r[row][col]);
  }
  return torch::stack(out);
}

Trial interpolationTrial(const Ctx &c, int64_t side, int64_t hdim, const Grid &g, int64_t m) {
  Input table = input(c, torch::randn({side * side, hdim}, f64), true);
  Tensor ours = interpolatePositionEmbeddings(table.ours, gridTensor(g), m);
  Tensor ref = refInterpolate(table.ref, g, m);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"table", &table}});
  return t;
}

/// Softmax attention inside each segment, in double by explicit products.
Tensor refSegmentAttention(const Tensor &q, const Tensor &k, const Tensor &v, const std::vector<int64_t> &lengths,
                           double scale) {
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (int64_t len : lengths) {
    Tensor qs = q.narrow(0, start, len), ks = k.narrow(0, start, len), vs = v.narrow(0, start, len);
    Tensor logits = torch::einsum("ihd,jhd->hij", {qs, ks}) * scale;
    Tensor e = torch::exp(logits - std::get<0>(logits.max(-1, true)).detach());
    Tensor p = e / e.sum(-1, true);
    outs.push_back(torch::einsum("hij,jhd->ihd", {p, vs}));
    start += len;
  }
  return torch::cat(outs, 0);
}

Trial segmentTrial(const Ctx &c, const Grid &g, int64_t heads, int64_t d) {
  const int64_t n = patches(g);
  std::vector<int64_t> lengths = visionSegmentLengths(gridTensor(g));
  Input q = input(c, torch::randn({n, heads, d}, f64), true);
  Input k = input(c, torch::randn({n, heads, d}, f64), true);
  Input v = input(c, torch::randn({n, heads, d}, f64), true);
  const double scale = 1.0 / std::sqrt(double(d));
  Tensor ours = segmentAttention(q.ours, k.ours, v.ours, lengths, scale);
  Tensor ref = refSegmentAttention(q.ref, k.ref, v.ref, lengths, scale);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"q", &q}, {"k", &k}, {"v", &v}});
  return t;
}

/// Token ids [2, T] with image runs, their grids and the expected [3, 2, T]
/// positions, written out by hand from get_rope_index's rules.
struct MropeCase {
  Tensor ids, grid, positions;
};

MropeCase mropeCase() {
  const int64_t img = 7;
  // Row 0: 3 text, image 4x6 patches (2x3 merged: 6 tokens), 2 text.
  // Row 1: 1 text, image 2x2 (1 token), 4 text, image 6x2 (3x1: 3 tokens), 1 text.
  std::vector<int64_t> r0 = {1, 2, 3, img, img, img, img, img, img, 4, 5};
  std::vector<int64_t> r1 = {1, img, 2, 3, 4, 5, img, img, img, 6, 0};
  // (t, h, w) per token.
  std::vector<std::array<int64_t, 3>> p0 = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {3, 3, 4}, {3, 3, 5},
                                            {3, 4, 3}, {3, 4, 4}, {3, 4, 5}, {6, 6, 6}, {7, 7, 7}};
  std::vector<std::array<int64_t, 3>> p1 = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4}, {5, 5, 5},
                                            {6, 6, 6}, {6, 7, 6}, {6, 8, 6}, {9, 9, 9}, {10, 10, 10}};
  MropeCase m;
  m.ids = torch::stack({torch::tensor(r0, i64), torch::tensor(r1, i64)});
  m.grid = gridTensor({{1, 4, 6}, {1, 2, 2}, {1, 6, 2}});
  m.positions = torch::empty({3, 2, 11}, i64);
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t t = 0; t < 11; ++t) {
      m.positions[a][0][t] = p0[t][a];
      m.positions[a][1][t] = p1[t][a];
    }
  return m;
}

Trial mropePositionTrial(const Ctx &) {
  MropeCase m = mropeCase();
  Tensor ours = mropePositions(m.ids, m.grid, 7, 2);
  std::string problem;
  if (!ours.sizes().equals(m.positions.sizes()) || !ours.equal(m.positions))
    problem = "positions differ from get_rope_index's";
  return {verdict("positions", problem)};
}

/// Text attention with M-RoPE: rotate q [B, H, T, D] by positions [3, B, T],
/// frequency j taking the axis of the interleaved section rule.
Tensor refMrope(const Tensor &x, const Tensor &positions, const std::vector<int64_t> &section, double theta) {
  const int64_t b = x.size(0), t = x.size(2), d = x.size(3), half = d / 2;
  Tensor angle = torch::zeros({b, 1, t, half}, f64);
  auto acc = angle.accessor<double, 4>();
  auto pos = positions.accessor<int64_t, 3>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t s = 0; s < t; ++s)
      for (int64_t j = 0; j < half; ++j) {
        int64_t axis = (j % 3 == 1 && j < 3 * section[1]) ? 1 : (j % 3 == 2 && j < 3 * section[2]) ? 2 : 0;
        acc[i][0][s][j] = double(pos[axis][i][s]) * std::pow(theta, -2.0 * j / double(d));
      }
  Tensor cos = angle.cos(), sin = angle.sin();
  Tensor a = x.narrow(-1, 0, half), c = x.narrow(-1, half, half);
  return torch::cat({a * cos - c * sin, c * cos + a * sin}, -1);
}

Trial mropeTrial(const Ctx &c, int64_t heads, int64_t d, std::vector<int64_t> section) {
  MropeCase m = mropeCase();
  RopeDef rope;
  rope.rotaryDim = d;
  rope.theta = 5000.0;
  rope.mropeSection = section;
  Input x = input(c, torch::randn({2, heads, 11, d}, f64), true);
  Tensor positions = mropePositions(m.ids, m.grid, 7, 2);
  Tensor ours = applyRope(x.ours, mropeTables(rope, positions, c.device), false);
  Tensor ref = refMrope(x.ref, positions, section, 5000.0);
  Trial t{{"out", ours, ref}};
  backward(t, ours, ref, {{"x", &x}});
  return t;
}

} // namespace

void addVisionChecks(std::vector<Check> &all) {
  auto rope = [&](Grid g, int64_t m, int64_t heads, int64_t d) {
    addCheck(all, "vision.rope_2d", shapeText({{"N", patches(g)}, {"H", heads}, {"D", d}, {"M", m}}),
             [=](const Ctx &c) { return visionRopeTrial(c, g, m, heads, d); });
  };
  rope({{1, 4, 6}, {2, 2, 4}}, 2, 3, 12);
  rope({{1, 3, 5}}, 1, 2, 20);
  rope({{1, 6, 10}}, 2, 1, 8);
  auto interp = [&](int64_t side, int64_t hdim, Grid g, int64_t m) {
    addCheck(all, "vision.pos_interp", shapeText({{"S", side}, {"C", hdim}, {"N", patches(g)}, {"M", m}}),
             [=](const Ctx &c) { return interpolationTrial(c, side, hdim, g, m); });
  };
  interp(5, 7, {{1, 4, 6}, {2, 2, 2}}, 2);
  interp(7, 3, {{1, 3, 11}}, 1);
  interp(4, 5, {{1, 1, 3}}, 1);
  interp(3, 6, {{1, 10, 8}}, 2);
  auto seg = [&](Grid g, int64_t heads, int64_t d) {
    addCheck(all, "vision.segment_attention", shapeText({{"N", patches(g)}, {"H", heads}, {"D", d}}),
             [=](const Ctx &c) { return segmentTrial(c, g, heads, d); });
  };
  seg({{1, 4, 6}, {2, 2, 2}}, 3, 16);
  seg({{1, 3, 5}, {1, 1, 7}}, 2, 12);
  seg({{1, 8, 10}}, 1, 20);
  addCheck(all, "mrope.positions", "B2 T11", mropePositionTrial);
  addCheck(all, "mrope.rope", shapeText({{"B", 2}, {"H", 3}, {"T", 11}, {"D", 24}}),
           [](const Ctx &c) { return mropeTrial(c, 3, 24, {4, 4, 4}); });
  addCheck(all, "mrope.rope", shapeText({{"B", 2}, {"H", 2}, {"T", 11}, {"D", 20}}),
           [](const Ctx &c) { return mropeTrial(c, 2, 20, {4, 3, 3}); });
}

} // namespace adapt::rt::opcheck
