//===- Vision.cpp - the Qwen3-VL vision tower and M-RoPE -------------------===//

#include "runtime/Vision.h"

#include "runtime/Errors.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace adapt::rt {

namespace {

/// gridThw as (t, h, w) triples on the host, checked.
std::vector<std::array<int64_t, 3>> gridList(const torch::Tensor &gridThw) {
  if (gridThw.dim() != 2 || gridThw.size(1) != 3)
    throw badInput("images", "image_grid_thw", "expected [images, 3] (t, h, w) patch counts");
  torch::Tensor g = gridThw.to(torch::kCPU, torch::kInt64).contiguous();
  std::vector<std::array<int64_t, 3>> out;
  const int64_t *p = g.data_ptr<int64_t>();
  for (int64_t i = 0; i < g.size(0); ++i) {
    std::array<int64_t, 3> thw = {p[3 * i], p[3 * i + 1], p[3 * i + 2]};
    if (thw[0] < 1 || thw[1] < 1 || thw[2] < 1)
      throw badInput("images", "image_grid_thw[" + std::to_string(i) + "]", "expected positive (t, h, w)");
    out.push_back(thw);
  }
  return out;
}

} // namespace

torch::Tensor visionPatchPositions(const torch::Tensor &gridThw, int64_t merge) {
  std::vector<torch::Tensor> parts;
  for (const auto &[t, h, w] : gridList(gridThw)) {
    if (h % merge != 0 || w % merge != 0)
      throw badInput("images", "image_grid_thw",
                     "expected h and w divisible by the spatial merge size " + std::to_string(merge) + ", found " +
                         std::to_string(h) + "x" + std::to_string(w));
    torch::Tensor rows = torch::arange(h, torch::kInt64).view({h, 1}).expand({h, w});
    torch::Tensor cols = torch::arange(w, torch::kInt64).view({1, w}).expand({h, w});
    auto blockOrder = [&](const torch::Tensor &x) {
      return x.reshape({h / merge, merge, w / merge, merge}).transpose(1, 2).flatten();
    };
    torch::Tensor frame = torch::stack({blockOrder(rows), blockOrder(cols)}, -1);
    parts.push_back(frame.repeat({t, 1}));
  }
  return torch::cat(parts, 0);
}

std::vector<int64_t> visionSegmentLengths(const torch::Tensor &gridThw) {
  std::vector<int64_t> out;
  for (const auto &[t, h, w] : gridList(gridThw))
    for (int64_t f = 0; f < t; ++f)
      out.push_back(h * w);
  return out;
}

RopeTables visionRopeTables(const torch::Tensor &gridThw, int64_t merge, int64_t headDim, double theta,
                            torch::Device device) {
  const int64_t spatial = headDim / 2;
  // theta^(2i/spatial) in fp32, as the reference computes its inv_freq.
  torch::Tensor exponents = torch::arange(0, spatial, 2, torch::kInt64).to(torch::kFloat32) / spatial;
  torch::Tensor inv = (1.0 / torch::pow(theta, exponents)).to(device);
  torch::Tensor pos = visionPatchPositions(gridThw, merge).to(device).to(torch::kFloat32); // [N, 2]
  torch::Tensor freqs = pos.unsqueeze(-1) * inv;                                           // [N, 2, D/4]
  torch::Tensor hw = torch::cat({freqs.select(1, 0), freqs.select(1, 1)}, -1);             // [N, D/2]
  torch::Tensor emb = torch::cat({hw, hw}, -1);
  return {emb.cos(), emb.sin()};
}

torch::Tensor applyVisionRope(const torch::Tensor &x, const RopeTables &t) {
  torch::Tensor xf = x.to(torch::kFloat32);
  const int64_t half = xf.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  torch::Tensor cos = t.cos.unsqueeze(-2), sin = t.sin.unsqueeze(-2);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

torch::Tensor interpolatePositionEmbeddings(const torch::Tensor &table, const torch::Tensor &gridThw,
                                            int64_t merge) {
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(table.size(0)))));
  if (side * side != table.size(0))
    throw badInput("vision", "pos_embed", "expected a square number of position embeddings, found " +
                                              std::to_string(table.size(0)));
  torch::Device device = table.device();
  std::vector<torch::Tensor> sizesH, sizesW;
  for (const auto &[t, h, w] : gridList(gridThw)) {
    sizesH.push_back(torch::full({t * h * w}, h, torch::kInt64));
    sizesW.push_back(torch::full({t * h * w}, w, torch::kInt64));
  }
  torch::Tensor pos = visionPatchPositions(gridThw, merge).to(device);
  torch::Tensor heights = torch::cat(sizesH).to(device), widths = torch::cat(sizesW).to(device);
  // Per axis: two taps (floor, floor + 1, clamped) with hat weights.
  auto axis = [&](const torch::Tensor &index, const torch::Tensor &size) {
    torch::Tensor src = index.to(torch::kFloat32) * static_cast<double>(side - 1) / torch::clamp_min(size - 1, 1);
    torch::Tensor floor = torch::floor(src);
    torch::Tensor offsets = torch::arange(0, 2, torch::TensorOptions().dtype(torch::kInt64).device(device));
    torch::Tensor taps = (floor.to(torch::kInt64).unsqueeze(1) + offsets).clamp(0, side - 1);
    torch::Tensor distance = (src.unsqueeze(1) - floor.unsqueeze(1) - offsets).abs();
    return std::make_pair(taps, (1 - distance).clamp_min(0));
  };
  auto [hTaps, hWeights] = axis(pos.select(1, 0), heights);
  auto [wTaps, wWeights] = axis(pos.select(1, 1), widths);
  torch::Tensor indices = (hTaps.unsqueeze(2) * side + wTaps.unsqueeze(1)).reshape({-1, 4});
  torch::Tensor weights = (hWeights.unsqueeze(2) * wWeights.unsqueeze(1)).reshape({-1, 4});
  torch::Tensor gathered = torch::embedding(table, indices); // [N, 4, H]
  // Weighted in fp32 (as the reference's fp32 weights promote), then the table's dtype.
  return (gathered * weights.unsqueeze(-1)).sum(1).to(table.scalar_type());
}

torch::Tensor segmentAttention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                               const std::vector<int64_t> &lengths, double scale) {
  int64_t total = 0;
  for (int64_t len : lengths)
    total += len;
  if (total != q.size(0))
    throw badInput("images", "pixel_values",
                   "expected " + std::to_string(total) + " patches (image_grid_thw), found " +
                       std::to_string(q.size(0)));
  // split, not narrow per segment: one backward node for all segments
  // (narrow's would write a whole-length zero gradient per image).
  const std::vector<torch::Tensor> qs = q.split_with_sizes(lengths), ks = k.split_with_sizes(lengths),
                                   vs = v.split_with_sizes(lengths);
  std::vector<torch::Tensor> outs;
  for (size_t s = 0; s < lengths.size(); ++s) {
    // [1, heads, len, D] per segment, no mask.
    auto part = [](const torch::Tensor &x) { return x.transpose(0, 1).unsqueeze(0); };
    torch::Tensor o = at::scaled_dot_product_attention(part(qs[s]), part(ks[s]), part(vs[s]), /*attn_mask=*/{}, 0.0,
                                                       /*is_causal=*/false, scale);
    outs.push_back(o.squeeze(0).transpose(0, 1));
  }
  return torch::cat(outs, 0);
}

torch::Tensor mropePositions(const torch::Tensor &ids, const torch::Tensor &gridThw, int64_t imageTokenId,
                             int64_t merge) {
  torch::Tensor tokens = ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t batch = tokens.size(0), seqLen = tokens.size(1);
  std::vector<std::array<int64_t, 3>> grids =
      gridThw.defined() ? gridList(gridThw) : std::vector<std::array<int64_t, 3>>{};
  torch::Tensor out = torch::empty({3, batch, seqLen}, torch::kInt64);
  auto acc = out.accessor<int64_t, 3>();
  const int64_t *tok = tokens.data_ptr<int64_t>();
  size_t nextImage = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t pos = 0, i = 0;
    const int64_t *row = tok + b * seqLen;
    while (i < seqLen) {
      if (row[i] != imageTokenId) {
        for (int a = 0; a < 3; ++a)
          acc[a][b][i] = pos;
        ++pos;
        ++i;
        continue;
      }
      int64_t end = i;
      while (end < seqLen && row[end] == imageTokenId)
        ++end;
      if (nextImage >= grids.size())
        throw badInput("batch", "input_ids", "expected one image (image_grid_thw row) per run of image tokens; "
                                             "found more runs than the " + std::to_string(grids.size()) + " images");
      const auto [t, h, w] = grids[nextImage++];
      const int64_t gh = h / merge, gw = w / merge;
      if (end - i != t * gh * gw)
        throw badInput("batch", "input_ids",
                       "expected " + std::to_string(t * gh * gw) + " image tokens for image " +
                           std::to_string(nextImage - 1) + ", found a run of " + std::to_string(end - i));
      for (int64_t f = 0; f < t; ++f)
        for (int64_t r = 0; r < gh; ++r)
          for (int64_t c = 0; c < gw; ++c, ++i) {
            acc[0][b][i] = pos + f;
            acc[1][b][i] = pos + r;
            acc[2][b][i] = pos + c;
          }
      pos += std::max(gh, gw);
    }
  }
  if (nextImage != grids.size())
    throw badInput("batch", "image_grid_thw",
                   "expected as many images as runs of image tokens (" + std::to_string(nextImage) + "), found " +
                       std::to_string(grids.size()));
  return out;
}

RopeTables mropeTables(const RopeDef &rope, const torch::Tensor &positions, torch::Device device) {
  torch::Tensor inv = ropeInverseFrequencies(rope).to(device); // [D/2]
  const int64_t half = inv.size(0);
  const auto &s = rope.mropeSection;
  if (s.size() != 3 || s[0] + s[1] + s[2] != half)
    throw badInput("model", "rope.mropeSection", "expected three sections summing to rotaryDim/2 = " +
                                                     std::to_string(half));
  // Which axis rotates frequency i (interleaved: t h w t h w ... then t).
  std::vector<int64_t> axisOf(half, 0);
  for (int64_t i = 0; i < half; ++i) {
    if (i % 3 == 1 && i < 3 * s[1])
      axisOf[i] = 1;
    else if (i % 3 == 2 && i < 3 * s[2])
      axisOf[i] = 2;
  }
  torch::Tensor axis = torch::tensor(axisOf, torch::kInt64).to(device);
  torch::Tensor freqs = positions.to(device).to(torch::kFloat32).unsqueeze(-1) * inv; // [3, B, T, D/2]
  torch::Tensor index = axis.view({1, 1, 1, half}).expand({1, freqs.size(1), freqs.size(2), half});
  torch::Tensor chosen = freqs.gather(0, index).squeeze(0); // [B, T, D/2]
  torch::Tensor emb = torch::cat({chosen, chosen}, -1).unsqueeze(1);
  double factor = ropeAttentionFactor(rope);
  return {emb.cos() * factor, emb.sin() * factor};
}

torch::Tensor visionLayerNorm(const torch::Tensor &x, const torch::Tensor &weight, const torch::Tensor &bias,
                              double eps) {
  return torch::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

// -- the module --------------------------------------------------------------

torch::Tensor VisionMerger::forward(const torch::Tensor &x, int64_t mergedWidth, double eps, bool training) const {
  torch::Tensor h = postShuffleNorm ? visionLayerNorm(x.reshape({-1, mergedWidth}), normWeight, normBias, eps)
                                    : visionLayerNorm(x, normWeight, normBias, eps).reshape({-1, mergedWidth});
  return fc2.forward(torch::gelu(fc1.forward(h, training)), training);
}

int64_t VisionTower::tensorCount(const VisionDef &d) {
  if (!d.enabled())
    return 0;
  return 2 + (d.numPositions > 0 ? 1 : 0) + 12 * d.depth + 6 * (1 + int64_t(d.deepstackLayers.size()));
}

VisionTower::VisionTower(const VisionDef &d, const TensorLoader &load) : vdef(d) {
  if (d.hidden % d.heads != 0 || (d.hidden / d.heads) % 4 != 0)
    throw LoadError("model", "vision",
                    "expected the vision width " + std::to_string(d.hidden) + " to split into " +
                        std::to_string(d.heads) + " heads of a multiple of 4 dims (2-D RoPE)");
  const std::string &p = d.prefix;
  const int64_t h = d.hidden, patchIn = d.inChannels * d.temporalPatch * d.patchSize * d.patchSize;
  auto linear = [&](const std::string &name, int64_t out, int64_t in) {
    LoraLinear l;
    l.checkpointName = p + name + ".weight";
    l.weight = load(l.checkpointName, {out, in});
    l.bias = load(p + name + ".bias", {out});
    l.hfPath = p + name;
    return l;
  };
  patchEmbed.checkpointName = p + "patch_embed.proj.weight";
  patchEmbed.weight =
      load(patchEmbed.checkpointName, {h, d.inChannels, d.temporalPatch, d.patchSize, d.patchSize}).reshape({h, patchIn});
  patchEmbed.bias = load(p + "patch_embed.proj.bias", {h});
  patchEmbed.hfPath = p + "patch_embed.proj";
  if (d.numPositions > 0)
    posEmbed = load(p + "pos_embed.weight", {d.numPositions, h});
  for (int64_t i = 0; i < d.depth; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    VisionBlock blk;
    blk.norm1Weight = load(p + b + "norm1.weight", {h});
    blk.norm1Bias = load(p + b + "norm1.bias", {h});
    blk.norm2Weight = load(p + b + "norm2.weight", {h});
    blk.norm2Bias = load(p + b + "norm2.bias", {h});
    blk.qkv = linear(b + "attn.qkv", 3 * h, h);
    blk.proj = linear(b + "attn.proj", h, h);
    blk.fc1 = linear(b + "mlp.linear_fc1", d.intermediate, h);
    blk.fc2 = linear(b + "mlp.linear_fc2", h, d.intermediate);
    blocks.push_back(std::move(blk));
  }
  const int64_t merged = h * d.spatialMerge * d.spatialMerge;
  auto makeMerger = [&](const std::string &m, bool post) {
    VisionMerger g;
    g.postShuffleNorm = post;
    int64_t normWidth = post ? merged : h;
    g.normWeight = load(p + m + "norm.weight", {normWidth});
    g.normBias = load(p + m + "norm.bias", {normWidth});
    g.fc1 = linear(m + "linear_fc1", merged, merged);
    g.fc2 = linear(m + "linear_fc2", d.outHidden, merged);
    return g;
  };
  merger = makeMerger("merger.", false);
  for (size_t k = 0; k < d.deepstackLayers.size(); ++k) {
    if (d.deepstackLayers[k] < 0 || d.deepstackLayers[k] >= d.depth)
      throw LoadError("model", "vision.deepstackLayers",
                      "expected block indices below the depth " + std::to_string(d.depth));
    deepstackMergers.push_back(makeMerger("deepstack_merger_list." + std::to_string(k) + ".", true));
  }
}

std::vector<std::pair<std::string, LoraLinear *>> VisionTower::adaptable() {
  std::vector<std::pair<std::string, LoraLinear *>> out;
  for (VisionBlock &b : blocks)
    for (auto [local, l] : {std::pair<const char *, LoraLinear *>{"attn.qkv", &b.qkv}, {"attn.proj", &b.proj},
                            {"mlp.linear_fc1", &b.fc1}, {"mlp.linear_fc2", &b.fc2}})
      out.push_back({local, l});
  out.push_back({"merger.linear_fc1", &merger.fc1});
  out.push_back({"merger.linear_fc2", &merger.fc2});
  for (size_t k = 0; k < deepstackMergers.size(); ++k) {
    std::string p = "deepstack_merger_list." + std::to_string(k) + ".";
    out.push_back({p + "linear_fc1", &deepstackMergers[k].fc1});
    out.push_back({p + "linear_fc2", &deepstackMergers[k].fc2});
  }
  return out;
}

std::vector<std::pair<std::string, const LoraLinear *>> VisionTower::adaptable() const {
  std::vector<std::pair<std::string, const LoraLinear *>> out;
  for (auto &[local, l] : const_cast<VisionTower *>(this)->adaptable())
    out.push_back({local, l});
  return out;
}

VisionOutput VisionTower::forward(const ImageInput &images, bool training) const {
  const VisionDef &d = vdef;
  torch::Device device = patchEmbed.weight.device();
  const int64_t patchIn = patchEmbed.weight.size(1);
  if (images.pixels.dim() != 2 || images.pixels.size(1) != patchIn)
    throw badInput("images", "pixel_values",
                   "expected [patches, " + std::to_string(patchIn) + "] (C*T*P*P), found " +
                       formatShape(images.pixels.sizes()));
  torch::Tensor x = patchEmbed.forward(images.pixels.to(device, patchEmbed.weight.scalar_type()), training);
  if (posEmbed.defined())
    x = x + interpolatePositionEmbeddings(posEmbed, images.gridThw, d.spatialMerge).to(x.scalar_type());
  const int64_t n = x.size(0), heads = d.heads, headDim = d.hidden / d.heads;
  RopeTables rope = visionRopeTables(images.gridThw, d.spatialMerge, headDim, d.ropeTheta, device);
  if (rope.cos.size(0) != n)
    throw badInput("images", "pixel_values",
                   "expected " + std::to_string(rope.cos.size(0)) + " patches (image_grid_thw), found " +
                       std::to_string(n));
  std::vector<int64_t> lengths = visionSegmentLengths(images.gridThw);
  const double scale = 1.0 / std::sqrt(static_cast<double>(headDim));
  const bool tanhGelu = d.act == "gelu_pytorch_tanh" || d.act == "gelu_new" || d.act == "gelu_fast";
  const int64_t merged = d.hidden * d.spatialMerge * d.spatialMerge;
  VisionOutput out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const VisionBlock &b = blocks[i];
    torch::Tensor qkv = b.qkv.forward(visionLayerNorm(x, b.norm1Weight, b.norm1Bias, d.normEps), training)
                            .view({n, 3, heads, headDim});
    torch::Tensor q = applyVisionRope(qkv.select(1, 0), rope);
    torch::Tensor k = applyVisionRope(qkv.select(1, 1), rope);
    torch::Tensor attn = segmentAttention(q, k, qkv.select(1, 2), lengths, scale).reshape({n, d.hidden});
    x = x + b.proj.forward(attn, training);
    torch::Tensor h = b.fc1.forward(visionLayerNorm(x, b.norm2Weight, b.norm2Bias, d.normEps), training);
    h = tanhGelu ? torch::gelu(h, "tanh") : d.act == "silu" ? torch::silu(h) : torch::gelu(h);
    x = x + b.fc2.forward(h, training);
    for (size_t k = 0; k < d.deepstackLayers.size(); ++k)
      if (d.deepstackLayers[k] == int64_t(i))
        out.deepstack.push_back(deepstackMergers[k].forward(x, merged, d.normEps, training));
  }
  out.merged = merger.forward(x, merged, d.normEps, training);
  return out;
}

} // namespace adapt::rt
