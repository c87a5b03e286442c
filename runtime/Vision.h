//===- Vision.h - the Qwen3-VL vision tower and M-RoPE ------------*- C++ -*-===//
//
// The image encoder of Qwen3-VL(-MoE), as transformers 5.17 defines it
// (models/qwen3_vl_moe/modeling_qwen3_vl_moe.py, vision_utils.py):
//
//   pixel patches [N, C*T*P*P]  (the processor's pixel_values: patches of all
//                                images, each image in 2x2 merge-block order)
//   -> patch embedding (Conv3d with kernel == stride: one linear map)
//   -> + learned position embeddings, bilinearly resampled to the grid
//   -> blocks: LayerNorm, fused qkv (+bias), 2-D rotary, attention inside
//      each image frame, proj; LayerNorm, MLP fc1 -> act -> fc2
//   -> patch merger (LayerNorm, 2x2 patches concatenated, fc1-GELU-fc2) into
//      the text width; deepstack mergers on chosen blocks' outputs.
//
// The merged features replace the image placeholder tokens' embeddings; the
// deepstack features are added to the outputs of the first text layers at
// those positions; image tokens get 3-D (t, h, w) M-RoPE positions.
//
// The stateless ops come first (each checked against float64 references in
// validation/opcheck/OpCheckVision.cpp), then the module with weights.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_VISION_H
#define ADAPT_RUNTIME_VISION_H

#include "runtime/Layers.h"
#include "runtime/ModelDef.h"
#include "runtime/Ops.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace adapt::rt {

/// Images of one batch, as the Hugging Face processor produces them.
struct ImageInput {
  torch::Tensor pixels;  ///< [patches, C*T*P*P] pixel_values (any float dtype).
  torch::Tensor gridThw; ///< [images, 3] int64: (t, h, w) in patches per image.
  bool empty() const { return !pixels.defined() || pixels.numel() == 0; }
};

// -- stateless ops -----------------------------------------------------------

/// (row, col) of every patch, [N, 2] int64, in the processor's order: per
/// image and frame, merge x merge blocks row-major, patches row-major inside
/// a block (transformers' get_vision_position_ids).
torch::Tensor visionPatchPositions(const torch::Tensor &gridThw, int64_t spatialMerge);

/// Patches per attention segment (one per frame of each image): attention
/// never crosses a segment (transformers' cu_seqlens).
std::vector<int64_t> visionSegmentLengths(const torch::Tensor &gridThw);

/// The vision tower's 2-D rotary tables for every patch: cos and sin
/// [N, headDim] in fp32. The first headDim/4 frequencies rotate by the row,
/// the next headDim/4 by the column, repeated for the second half
/// (rotate_half form over the whole head).
RopeTables visionRopeTables(const torch::Tensor &gridThw, int64_t spatialMerge, int64_t headDim,
                            double theta, torch::Device device);

/// Applies visionRopeTables to \p x [N, heads, headDim] in fp32, returning
/// \p x's dtype.
torch::Tensor applyVisionRope(const torch::Tensor &x, const RopeTables &tables);

/// The learned square position table \p table [side*side, H] resampled to
/// every patch of every image: bilinear with align_corners (grid corners map
/// to table corners), summed with fp32 weights. Returns [N, H] in the
/// table's dtype.
torch::Tensor interpolatePositionEmbeddings(const torch::Tensor &table, const torch::Tensor &gridThw,
                                            int64_t spatialMerge);

/// Bidirectional attention inside each segment: q, k, v [N, heads, D]
/// split by \p lengths (summing to N). Returns [N, heads, D]. Memory is
/// quadratic in the longest segment only.
torch::Tensor segmentAttention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                               const std::vector<int64_t> &lengths, double scale);

/// 3-D M-RoPE positions [3, B, T] int64 for token ids [B, T]
/// (transformers' get_rope_index for images): text continues one counter
/// on all three axes; a run of image tokens (one image, consumed from
/// \p gridThw in order across the batch) gets (start, start + row,
/// start + col) over its merged grid, and the counter then advances by
/// max(rows, cols). Throws BadInput when a run does not match its image.
torch::Tensor mropePositions(const torch::Tensor &ids, const torch::Tensor &gridThw, int64_t imageTokenId,
                             int64_t spatialMerge);

/// Interleaved M-RoPE tables for positions [3, B, T]: cos and sin
/// [B, 1, T, rotaryDim] (broadcast over heads by applyRope).
RopeTables mropeTables(const RopeDef &rope, const torch::Tensor &positions, torch::Device device);

/// LayerNorm over the last dim with weight and bias (transformers' nn.LayerNorm).
torch::Tensor visionLayerNorm(const torch::Tensor &x, const torch::Tensor &weight, const torch::Tensor &bias,
                              double eps);

// -- the module --------------------------------------------------------------

/// One ViT block.
struct VisionBlock {
  torch::Tensor norm1Weight, norm1Bias, norm2Weight, norm2Bias;
  LoraLinear qkv, proj, fc1, fc2;
};

/// A patch merger: LayerNorm (before or after the 2x2 concatenation), fc1,
/// exact GELU, fc2.
struct VisionMerger {
  torch::Tensor normWeight, normBias;
  LoraLinear fc1, fc2;
  bool postShuffleNorm = false;
  torch::Tensor forward(const torch::Tensor &x, int64_t mergedWidth, double eps, bool training) const;
};

/// What the tower gives the text model.
struct VisionOutput {
  torch::Tensor merged;                ///< [image tokens, outHidden]
  std::vector<torch::Tensor> deepstack; ///< One [image tokens, outHidden] per deepstack layer.
};

/// Loads one named tensor with an expected shape (the model's loader).
using TensorLoader = std::function<torch::Tensor(const std::string &, std::vector<int64_t>)>;

/// The Qwen3-VL vision tower with frozen weights and optional LoRA on the
/// blocks' projections (attn.qkv, attn.proj, mlp.linear_fc1, mlp.linear_fc2)
/// and the mergers' linears.
class VisionTower {
public:
  VisionTower(const VisionDef &def, const TensorLoader &load);

  /// Runs the tower on \p images; features in the dtype of the weights.
  VisionOutput forward(const ImageInput &images, bool training) const;

  /// Every linear that LoRA may adapt, with the module path PEFT's
  /// target_modules uses for it: inside a block ("attn.qkv",
  /// "mlp.linear_fc1") or under the tower ("merger.linear_fc1",
  /// "deepstack_merger_list.0.linear_fc2"), which is what LoraDef.modules names.
  std::vector<std::pair<std::string, LoraLinear *>> adaptable();
  std::vector<std::pair<std::string, const LoraLinear *>> adaptable() const;

  /// Tensors the tower loads, for progress reporting.
  static int64_t tensorCount(const VisionDef &def);

  const VisionDef &def() const { return vdef; }

private:
  VisionDef vdef;
  LoraLinear patchEmbed; ///< Conv3d weight viewed as [hidden, C*T*P*P].
  torch::Tensor posEmbed;
  std::vector<VisionBlock> blocks;
  VisionMerger merger;
  std::vector<VisionMerger> deepstackMergers;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_VISION_H
