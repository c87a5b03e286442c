//===- TinyModelSparse.h - tiny configs of the sparse-attention families -*- C++ -*-===//
//
// DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa) configs for `adapt
// tiny`: the released configs' keys with the sizes shrunk, and an indexer
// top-k small enough that a few dozen tokens really are sparse.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_MODELS_TINYMODELSPARSE_H
#define ADAPT_MODELS_TINYMODELSPARSE_H

#include <nlohmann/json.hpp>

#include <cstdint>

namespace adapt {

/// The sizes every tiny model shares (TinyModel.cpp's constants).
struct TinySizes {
  int64_t hidden, heads, vocab, experts, topK, expertWidth, maxPositions;
};

/// Indexer top-k of the tiny sparse-attention models: sequences longer than
/// this drop keys.
constexpr int64_t kTinyIndexTopK = 8;

/// DeepSeek-V3.2 with \p layers layers (the first dense): YaRN RoPE, an
/// indexer rotating halves.
nlohmann::ordered_json tinyDeepseekV32Config(int64_t layers, const TinySizes &sizes);
/// GLM-5 with \p layers layers (the first dense): default RoPE, an indexer
/// rotating adjacent pairs, every layer running its own indexer.
nlohmann::ordered_json tinyGlmMoeDsaConfig(int64_t layers, const TinySizes &sizes);

} // namespace adapt

#endif // ADAPT_MODELS_TINYMODELSPARSE_H
