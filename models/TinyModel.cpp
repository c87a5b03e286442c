//===- TinyModel.cpp - tiny random-weight models of each family -----------===//
//
// The tensors and files of a tiny model (its config is TinyModelConfig.cpp's).
// The tensors are what the front end declares for that config:
// parseModelConfig, declareModel and expandToDisk give names, shapes and
// dtypes, so a tiny model always passes `adapt gaps` without manifest issues.
//
//===----------------------------------------------------------------------===//

#include "models/TinyModel.h"

#include "models/WeightSchema.h"
#include "parser/AtomicFile.h"
#include "parser/ConfigReader.h"
#include "parser/Strings.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

namespace adapt {

namespace {

using ojson = nlohmann::ordered_json;

/// gpt-oss's expert gate/up values get this standard deviation (others 1).
constexpr double kGptOssGateUpScale = 3.0;

// ----------------------------------------------------------------------------
// Deterministic values.

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string &text) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

/// Standard normal samples, one stream per tensor name: values do not depend
/// on the order tensors are written in.
class Normal {
public:
  Normal(uint64_t seed, const std::string &name) : state(seed ^ fnv1a(name)) {
    splitmix64(state);
  }
  double next() {
    if (hasSpare) {
      hasSpare = false;
      return spare;
    }
    // Box-Muller on two uniforms in (0, 1].
    double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    double theta = 6.283185307179586 * u2;
    spare = r * std::sin(theta);
    hasSpare = true;
    return r * std::cos(theta);
  }

private:
  uint64_t state;
  double spare = 0;
  bool hasSpare = false;
};


/// The values of one tensor: normal(0, \p weightStd) for weights; norms
/// \p normMean + noise so they are not the identity (mean 0 for zero-centred
/// norms, whose scale is 1 + weight); small biases; sinks around zero at
/// logit scale.
/// The normal distribution a tensor's values come from: \p weightStd
/// around zero, but norm weights around \p normMean and a few special
/// tensors with their own spread.
struct ValueDistribution {
  double mean = 0.0, stddev = 0.02;
};

ValueDistribution valueDistribution(const std::string &name, double weightStd, double normMean) {
  if (endsWith(name, "norm.weight") || endsWith(name, "layernorm.weight") ||
      endsWith(name, "norm1.weight") || endsWith(name, "norm2.weight"))
    return {normMean, 0.05};
  if (endsWith(name, "e_score_correction_bias"))
    return {0.0, 0.01};
  if (endsWith(name, "sinks"))
    return {0.0, 0.5};
  return {0.0, weightStd};
}

std::vector<float> sampleValues(uint64_t seed, const std::string &name,
                                int64_t count, double weightStd = 0.02,
                                double normMean = 1.0) {
  Normal rng(seed, name);
  const ValueDistribution d = valueDistribution(name, weightStd, normMean);
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i)
    out[i] = float(d.mean + d.stddev * rng.next());
  return out;
}

uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return 0x7FC0; // NaN
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u); // nearest, ties to even
  return uint16_t((bits + rounding) >> 16);
}

/// The value of an FP8 E4M3FN code (bias 7, no infinities, 0x7F/0xFF NaN).
float fp8E4m3Value(uint8_t code) {
  int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 7;
  float magnitude =
      exponent == 0 ? std::ldexp(float(mantissa) / 8.0f, -6)
                    : std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

/// Nearest E4M3FN code to \p value (ties to the even code), saturating at
/// +-448.
uint8_t toFp8E4m3(float value) {
  static const std::vector<float> grid = [] {
    std::vector<float> g;
    for (int code = 0; code < 0x7F; ++code) // 0x7F is NaN
      g.push_back(fp8E4m3Value(uint8_t(code)));
    return g;
  }();
  float magnitude = std::fabs(value);
  auto it = std::lower_bound(grid.begin(), grid.end(), magnitude);
  int code;
  if (it == grid.end()) {
    code = 0x7E;
  } else if (it == grid.begin()) {
    code = 0;
  } else {
    int hi = int(it - grid.begin()), lo = hi - 1;
    float dLo = magnitude - grid[lo], dHi = grid[hi] - magnitude;
    code = dLo < dHi ? lo : dHi < dLo ? hi : (lo % 2 == 0 ? lo : hi);
  }
  return uint8_t(code | (value < 0 && code != 0 ? 0x80 : 0));
}

/// Nearest FP4 E2M1 code to \p value (ties to the even code).
uint8_t toFp4E2m1(float value) {
  static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float magnitude = std::fabs(value);
  int best = 0;
  for (int code = 1; code < 8; ++code) {
    float d = std::fabs(grid[code] - magnitude);
    float bestD = std::fabs(grid[best] - magnitude);
    if (d < bestD || (d == bestD && code % 2 == 0))
      best = code;
  }
  return uint8_t(best | (value < 0 && best != 0 ? 8 : 0));
}

// ----------------------------------------------------------------------------
// Safetensors.

struct TensorData {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

int64_t elements(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

void appendBf16(std::string &out, const std::vector<float> &values) {
  out.reserve(out.size() + 2 * values.size());
  for (float v : values) {
    uint16_t b = toBf16(v);
    out.push_back(char(b & 0xFF));
    out.push_back(char(b >> 8));
  }
}

void appendF32(std::string &out, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  for (int i = 0; i < 4; ++i)
    out.push_back(char((bits >> (8 * i)) & 0xFF));
}

/// A plain tensor in the checkpoint dtype (BF16). Values are drawn in the
/// logical order of \p weight, so a fused expert tensor stored transposed
/// ([E, in, out]) holds the same matrices its MXFP4 variant quantizes.
/// Scale of a weight's values: unit-variance outputs for matmuls (1/sqrt(in))
/// and unit embeddings, so activations and logits are O(1) and a few dozen
/// LoRA steps visibly lower the loss; other tensors keep small values.
double weightStd(const WeightDecl &weight, bool gptOss) {
  if (weight.name.find("embed_tokens") != std::string::npos)
    return 1.0;
  // gpt-oss: gate/up values of std 3, so about 2% pass the SwiGLU clamp (7)
  // and a missing clamp shows; down_proj a third, so the outputs stay O(1).
  if (gptOss && weight.routed && weight.name.find("mlp.experts.gate_up_proj") != std::string::npos &&
      !endsWith(weight.name, "_bias") && !weight.shape.empty())
    return kGptOssGateUpScale / std::sqrt(double(weight.shape.back()));
  if (gptOss && weight.routed && weight.name.find("mlp.experts.down_proj") != std::string::npos &&
      !endsWith(weight.name, "_bias") && !weight.shape.empty())
    return 1.0 / (kGptOssGateUpScale * std::sqrt(double(weight.shape.back())));
  // Short convolutions (linear attention): unit-variance outputs too.
  if (weight.name.find("conv1d.weight") != std::string::npos && !weight.shape.empty())
    return 1.0 / std::sqrt(double(weight.shape.back()));
  if (weight.linear && !weight.shape.empty())
    return 1.0 / std::sqrt(double(weight.shape.back()));
  return 0.02;
}

TensorData plainTensor(const DiskTensor &t, const WeightDecl &weight,
                       uint64_t seed, double normMean, bool gptOss) {
  TensorData d{t.name, t.dtype, t.shape, {}};
  std::vector<float> values =
      sampleValues(seed, t.name, elements(t.shape), weightStd(weight, gptOss), normMean);
  const std::vector<int64_t> &logical = weight.shape;
  // expandToDisk stores fused expert matmuls as [E, in, out].
  bool transposed = weight.linear && weight.routed && weight.experts == 0 &&
                    logical.size() == 3 && t.shape.size() == 3 &&
                    t.shape[0] == logical[0] && t.shape[1] == logical[2] &&
                    t.shape[2] == logical[1];
  if (transposed) {
    int64_t experts = logical[0], rows = logical[1], cols = logical[2];
    std::vector<float> stored(values.size());
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          stored[(e * cols + c) * rows + r] = values[(e * rows + r) * cols + c];
    values.swap(stored);
  }
  appendBf16(d.bytes, values);
  return d;
}

/// DeepSeek FP8: e4m3 weight [out, in] and F32 weight_scale_inv
/// [ceil(out/R), ceil(in/C)], w = fp8 * scale_inv blockwise.
void fp8Tensors(const DiskTensor &weight, const DiskTensor &scales,
                const QuantSpec &quant, uint64_t seed,
                std::vector<TensorData> &out) {
  int64_t rows = weight.shape[0], cols = weight.shape[1];
  int64_t br = quant.blockRows, bc = quant.blockCols;
  std::vector<float> w = sampleValues(seed, weight.name, rows * cols, 1.0 / std::sqrt(double(cols)));
  int64_t sr = scales.shape[0], sc = scales.shape[1];
  std::vector<float> scale(sr * sc);
  for (int64_t i = 0; i < sr; ++i)
    for (int64_t j = 0; j < sc; ++j) {
      float amax = 0;
      for (int64_t r = i * br; r < std::min(rows, (i + 1) * br); ++r)
        for (int64_t c = j * bc; c < std::min(cols, (j + 1) * bc); ++c)
          amax = std::max(amax, std::fabs(w[r * cols + c]));
      scale[i * sc + j] = amax > 0 ? amax / 448.0f : 1.0f;
    }
  TensorData q{weight.name, weight.dtype, weight.shape, {}};
  q.bytes.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      q.bytes[r * cols + c] =
          char(toFp8E4m3(w[r * cols + c] / scale[(r / br) * sc + c / bc]));
  TensorData s{scales.name, scales.dtype, scales.shape, {}};
  for (float v : scale)
    appendF32(s.bytes, v);
  out.push_back(std::move(q));
  out.push_back(std::move(s));
}

/// OCP MXFP4 as gpt-oss stores it: per group of 32 inputs one E8M0 scale
/// (biased by 127) and 16 bytes of E2M1 pairs, the even element in the low
/// nibble.
void mxfp4Tensors(const DiskTensor &blocks, const DiskTensor &scales,
                  const std::string &logicalName, uint64_t seed,
                  std::vector<TensorData> &out) {
  int64_t groups = elements(scales.shape);
  // Blocks are [..., out, in/32, 16]: the scale weightStd gives the plain tensor.
  double fanIn = double(blocks.shape[blocks.shape.size() - 2] * 32);
  double scale = endsWith(logicalName, "gate_up_proj") ? kGptOssGateUpScale
                 : endsWith(logicalName, "down_proj")  ? 1.0 / kGptOssGateUpScale
                                                       : 1.0;
  std::vector<float> w = sampleValues(seed, logicalName, groups * 32, scale / std::sqrt(fanIn));
  TensorData b{blocks.name, blocks.dtype, blocks.shape, {}};
  TensorData s{scales.name, scales.dtype, scales.shape, {}};
  b.bytes.resize(groups * 16);
  s.bytes.resize(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const float *x = &w[g * 32];
    float amax = 0;
    for (int i = 0; i < 32; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    // Smallest power of two that maps amax into E2M1's range (max 6);
    // ldexp and frexp are exact, so no libm rounding enters the bytes.
    int exponent = -127;
    if (amax > 0) {
      std::frexp(amax, &exponent); // amax < 2^exponent
      exponent -= 3;
      while (std::ldexp(amax, -exponent) > 6.0f)
        ++exponent;
      while (std::ldexp(amax, -(exponent - 1)) <= 6.0f)
        --exponent;
    }
    exponent = std::max(-127, std::min(127, exponent));
    s.bytes[g] = char(uint8_t(exponent + 127));
    for (int i = 0; i < 16; ++i) {
      uint8_t lo = toFp4E2m1(std::ldexp(x[2 * i], -exponent));
      uint8_t hi = toFp4E2m1(std::ldexp(x[2 * i + 1], -exponent));
      b.bytes[g * 16 + i] = char(lo | (hi << 4));
    }
  }
  out.push_back(std::move(b));
  out.push_back(std::move(s));
}

/// Bytes of one element, for ordering tensors so each stays aligned.
int dtypeAlignment(const std::string &dtype) {
  if (dtype == "F32" || dtype == "I32")
    return 4;
  if (dtype == "BF16" || dtype == "F16")
    return 2;
  return 1;
}

/// A safetensors file: 8-byte little-endian header length, the JSON header
/// padded with spaces to a multiple of 8, then the tensor bytes. Tensors are
/// laid out widest dtype first, then by name, so every one is aligned.
std::string safetensorsFile(std::vector<const TensorData *> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorData *a, const TensorData *b) {
              int wa = dtypeAlignment(a->dtype), wb = dtypeAlignment(b->dtype);
              return wa != wb ? wa > wb : a->name < b->name;
            });
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorData *t : tensors) {
    header[t->name] = {{"dtype", t->dtype},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string file;
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    file.push_back(char((n >> (8 * i)) & 0xFF));
  file += text;
  for (const TensorData *t : tensors)
    file += t->bytes;
  return file;
}

/// models/tiny/tokenizer.json (scripts/make_tiny_tokenizer.py): ids 0-4 are
/// its special tokens, the rest a BPE over the King James Genesis.
constexpr const char *kTinyTokenizer =
#include "TinyTokenizer.inc"
    ;

/// tokenizer_config.json for a tiny model whose config is \p config: the
/// tokenizer's special tokens named by the config's bos/eos ids, and a
/// ChatML chat template over its <|im_start|>/<|im_end|> tokens, so that
/// AutoTokenizer and apply_chat_template work on every tiny family.
std::string tinyTokenizerConfig(const nlohmann::json &config) {
  static const char *special[] = {"<unk>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"};
  auto tokenOf = [&](const char *key) -> std::string {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 4)
      return "";
    return special[it->get<int64_t>()];
  };
  nlohmann::ordered_json t;
  t["tokenizer_class"] = "PreTrainedTokenizerFast";
  t["unk_token"] = "<unk>";
  if (std::string bos = tokenOf("bos_token_id"); !bos.empty())
    t["bos_token"] = bos;
  if (std::string eos = tokenOf("eos_token_id"); !eos.empty())
    t["eos_token"] = t["pad_token"] = eos;
  t["model_max_length"] = 1000000;
  t["chat_template"] = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                       "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  return t.dump(2) + "\n";
}

} // namespace

Result<std::vector<std::string>>
writeTinyModel(const TinyModelOptions &options) {
  Result<std::string> config = tinyModelConfig(options);
  if (!config)
    return config.error();
  std::string dir = options.outDir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (dir.empty())
    return InputError{"tiny", "--out", "expected a directory"};
  std::string configPath = dir + "/config.json";

  // The tensors are what the front end reads out of this very config.
  Result<ModelSpec> parsed = parseModelConfig(*config, configPath);
  if (!parsed)
    return InputError{configPath, "",
                      "internal error: the tiny config does not parse: " +
                          parsed.error().message()};
  ModelSpec &spec = *parsed;
  std::string expectedFamily = options.family == "kimi_k2" || options.family == "deepseek_v32" ||
                                       options.family == "glm_moe_dsa"
                                   ? "deepseek_v3"
                               : options.family == "qwen3_vl_moe" ? "qwen3_moe"
                               : options.family == "minimax"      ? "minimax_m1"
                                                                  : options.family;
  if (spec.family != expectedFamily)
    return InputError{configPath, "",
                      "internal error: the tiny config is recognised as " +
                          spec.family};
  // Qwen3's QK-norm is not in its config; refineWithManifest finds it from
  // the tensor names, which the tiny model has like every Qwen3 release.
  if (spec.family == "qwen3_moe")
    refineWithManifest(spec, [](const std::string &name) {
      return endsWith(name, "q_norm.weight") || endsWith(name, "k_norm.weight");
    });
  std::string dtype = safetensorsDtypeFor(spec.dtype);
  std::vector<TensorData> tensors;
  ojson randomWeights = ojson::array(); // --manifest-only: what the shards would hold
  std::vector<DiskTensor> disk;
  for (const ComponentDecl &component : declareModel(spec)) {
    for (const WeightDecl &weight : component.weights) {
      for (int64_t e = 0; e < std::max<int64_t>(weight.experts, 1); ++e) {
        disk.clear();
        expandToDisk(weight, e, spec.quant, dtype, disk);
        // Qwen3-Next's RMSNorms are zero-centred (scale 1 + weight), but
        // for the gated norm of its linear attention.
        const bool zeroCentred = spec.family == "qwen3_next" &&
                                 weight.name.find("linear_attn.norm") == std::string::npos;
        const double normMean = zeroCentred ? 0.0 : 1.0;
        const bool gptOss = spec.family == "gpt_oss";
        if (options.manifestOnly) {
          if (disk.size() != 1 || disk[0].dtype != "BF16")
            return InputError{configPath, disk.empty() ? weight.name : disk[0].name,
                              "expected a bf16 checkpoint for --manifest-only, found a " +
                                  (disk.empty() ? std::string("missing") : disk[0].dtype) + " tensor"};
          const ValueDistribution d = valueDistribution(disk[0].name, weightStd(weight, gptOss), normMean);
          randomWeights.push_back({{"name", disk[0].name}, {"dtype", "BF16"}, {"shape", disk[0].shape},
                                   {"mean", d.mean}, {"std", d.stddev}});
          tensors.push_back(TensorData{disk[0].name, "BF16", disk[0].shape, {}});
          continue;
        }
        if (disk.size() == 1 && disk[0].dtype == "BF16") {
          tensors.push_back(plainTensor(disk[0], weight, options.seed, normMean, gptOss));
        } else if (disk.size() == 2 && disk[0].dtype == "F8_E4M3") {
          fp8Tensors(disk[0], disk[1], spec.quant, options.seed, tensors);
        } else if (disk.size() == 2 && endsWith(disk[0].name, "_blocks")) {
          mxfp4Tensors(disk[0], disk[1],
                       disk[0].name.substr(0, disk[0].name.size() - 7),
                       options.seed, tensors);
        } else {
          return InputError{configPath,
                            disk.empty() ? weight.name : disk[0].name,
                            "internal error: no tiny writer for this on-disk "
                            "layout"};
        }
      }
    }
  }

  // Two shards, split where half the bytes are written; a model at real
  // widths (--manifest-only) in shards of about 4 GiB, each filled in memory.
  auto sizeOf = [&](const TensorData &t) {
    return options.manifestOnly ? uint64_t(elements(t.shape)) * 2 : uint64_t(t.bytes.size());
  };
  uint64_t total = 0;
  for (const TensorData &t : tensors)
    total += sizeOf(t);
  const uint64_t shardCount = options.manifestOnly ? std::max<uint64_t>(1, (total + (4ull << 30) - 1) >> 32) : 2;
  std::vector<std::vector<const TensorData *>> shards(shardCount);
  uint64_t written = 0;
  for (const TensorData &t : tensors) {
    shards[std::min<uint64_t>(shardCount - 1, written * shardCount / std::max<uint64_t>(total, 1))].push_back(&t);
    written += sizeOf(t);
  }
  std::vector<std::string> shardNames;
  auto fiveDigits = [](uint64_t n) {
    std::string s = std::to_string(n);
    return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
  };
  for (uint64_t s = 0; s < shardCount; ++s)
    shardNames.push_back("model-" + fiveDigits(s + 1) + "-of-" + fiveDigits(shardCount) + ".safetensors");
  nlohmann::json weightMap = nlohmann::json::object();
  for (uint64_t s = 0; s < shardCount; ++s)
    for (const TensorData *t : shards[s])
      weightMap[t->name] = shardNames[s];
  for (ojson &w : randomWeights)
    w["shard"] = weightMap[w["name"].get<std::string>()];
  ojson index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weightMap;

  std::string error;
  std::vector<std::string> files;
  // One file at a time (a shard at a real model's widths is large), each
  // replaced whole or not at all.
  auto write = [&](const std::string &name, const std::string &bytes) {
    std::string path = dir + "/" + name;
    if (!writeFileAtomically(path, bytes, error))
      return false;
    files.push_back(path);
    return true;
  };
  if (!write("config.json", *config) || !write("tokenizer.json", kTinyTokenizer) ||
      !write("tokenizer_config.json", tinyTokenizerConfig(nlohmann::json::parse(*config))) ||
      !write("model.safetensors.index.json", index.dump(2) + "\n"))
    return InputError{dir, "", "cannot write the model: " + error};
  if (options.manifestOnly) {
    if (!write("random_weights.json", ojson{{"seed", options.seed}, {"tensors", randomWeights}}.dump(1) + "\n"))
      return InputError{dir, "", "cannot write the model: " + error};
    return files;
  }
  for (uint64_t s = 0; s < shardCount; ++s)
    if (!write(shardNames[s], safetensorsFile(shards[s])))
      return InputError{dir, "", "cannot write the model: " + error};
  return files;
}

} // namespace adapt
