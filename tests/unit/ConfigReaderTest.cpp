//===- ConfigReaderTest.cpp - config recognition and weight schema --------===//

#include "models/WeightSchema.h"
#include "parser/ConfigKeys.h"
#include "parser/ConfigReader.h"
#include "tests/unit/SharedModels.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

using namespace adapt;

namespace {
/// Reads a shared model's config; a failure aborts the test process with
/// the reader's message rather than letting a test index an empty spec.
ModelSpec read(const std::string &model) {
  Result<ModelSpec> spec = readModelConfig(sharedModelsDir() + "/" + model + "/config.json");
  if (!spec.ok()) {
    std::fprintf(stderr, "cannot read %s: %s\n", model.c_str(),
                 spec.error().message().c_str());
    std::abort();
  }
  return spec.value();
}
} // namespace

TEST(ConfigReader, DeepSeekV32HasMlaSparseAttentionAndDenseLead) {
  ModelSpec s = read("DeepSeek-V3.2");
  ASSERT_EQ(s.layers.size(), 61u);
  EXPECT_EQ(s.family, "deepseek_v3");
  EXPECT_FALSE(s.layers[2].ffn.isMoe);
  EXPECT_TRUE(s.layers[3].ffn.isMoe);
  EXPECT_EQ(s.layers[3].mixer.kind, MixerKind::MLA);
  EXPECT_EQ(s.layers[3].mixer.indexTopK, 2048);
  EXPECT_EQ(s.layers[3].ffn.groups, 8);
  EXPECT_TRUE(s.layers[3].ffn.correctionBias);
  EXPECT_EQ(s.layers[3].mixer.rope.type, "yarn");
  EXPECT_EQ(s.quant.method, "fp8");
  EXPECT_EQ(s.numMtpLayers, 1);
}

TEST(ConfigReader, SparseAttentionIndexerRopeAndSharedLayers) {
  // transformers fixes the indexer's RoPE per class: halves for DeepSeek-V3.2,
  // adjacent pairs for GLM-5.
  EXPECT_FALSE(read("DeepSeek-V3.2").layers[3].mixer.indexRopeInterleaved);
  ModelSpec glm = read("GLM-5");
  ASSERT_EQ(glm.layers.size(), 78u);
  EXPECT_EQ(glm.layers[0].mixer.indexTopK, 2048);
  EXPECT_TRUE(glm.layers[0].mixer.indexRopeInterleaved);
  EXPECT_TRUE(glm.layers[0].mixer.rope.interleaved);
  // Layers reusing an earlier layer's top-k ("shared") are read per layer,
  // as transformers derives them: a gap, never a refusal.
  std::string text = R"({"model_type": "glm_moe_dsa", "hidden_size": 64,
    "num_hidden_layers": 2, "vocab_size": 100, "num_attention_heads": 4,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "intermediate_size": 128, "scoring_func": "sigmoid", "index_topk": 4,
    "index_n_heads": 2, "index_head_dim": 16,
    "indexer_types": ["full", "shared"]})";
  Result<ModelSpec> r = parseModelConfig(text, "glm/config.json");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_FALSE(r->layers[0].mixer.reusesIndexer);
  EXPECT_TRUE(r->layers[1].mixer.reusesIndexer);
  EXPECT_TRUE(r->unknownKeys.empty());
  // The pattern and frequency forms, and transformers' default offset 2.
  auto types = [&](const std::string &keys) {
    std::string mutated = text;
    mutated.replace(mutated.find("\"indexer_types\": [\"full\", \"shared\"]"),
                    std::string("\"indexer_types\": [\"full\", \"shared\"]").size(), keys);
    mutated.replace(mutated.find("\"num_hidden_layers\": 2"), std::string("\"num_hidden_layers\": 2").size(),
                    "\"num_hidden_layers\": 6");
    Result<ModelSpec> spec = parseModelConfig(mutated, "glm/config.json");
    EXPECT_TRUE(spec.ok()) << keys;
    std::string out;
    for (const LayerSpec &l : spec->layers)
      out += l.mixer.reusesIndexer ? 'S' : l.mixer.unseen.empty() ? 'F' : '?';
    return out;
  };
  EXPECT_EQ(types("\"index_topk_pattern\": \"FSSFSS\""), "FSSFSS");
  EXPECT_EQ(types("\"index_topk_freq\": 2"), "FFSFSF");
  EXPECT_EQ(types("\"index_topk_freq\": 3, \"index_skip_topk_offset\": 1"), "FSSFSS");
  EXPECT_EQ(types("\"indexer_types\": [\"full\", \"full\", \"sliding\", \"full\", \"full\", \"full\"]"), "FF?FFF");
  // A first layer with nothing to reuse is malformed.
  std::string first = text;
  first.replace(first.find("[\"full\", \"shared\"]"), 18, "[\"shared\", \"full\"]");
  Result<ModelSpec> bad = parseModelConfig(first, "glm/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("indexer_types"), std::string::npos);
}

TEST(ConfigReader, LayerPatternKeysAllResolve) {
  // full_attention_interval (Qwen3-Next), attn_type_list (MiniMax-M1),
  // linear_attn_config with 1-based layers (Kimi-Linear), layer_types.
  ModelSpec next = read("Qwen3-Next-80B-A3B-Thinking");
  EXPECT_EQ(next.layers[3].mixer.kind, MixerKind::Attention);
  EXPECT_EQ(next.layers[0].mixer.kind, MixerKind::GatedDeltaNet);
  ModelSpec m1 = read("MiniMax-M1");
  EXPECT_EQ(m1.layers[7].mixer.kind, MixerKind::Attention);
  EXPECT_EQ(m1.layers[6].mixer.kind, MixerKind::Lightning);
  ModelSpec kimi = read("Kimi-Linear-48B-A3B");
  EXPECT_EQ(kimi.layers[3].mixer.kind, MixerKind::MLA);  // layer 4, 1-based
  EXPECT_EQ(kimi.layers[0].mixer.kind, MixerKind::KimiDelta);
  ModelSpec oss = read("gpt-oss-20b");
  EXPECT_EQ(oss.layers[0].mixer.window, "sliding");
  EXPECT_EQ(oss.layers[1].mixer.window, "none");
  EXPECT_TRUE(oss.layers[0].mixer.sinks);
  ModelSpec maverick = read("Llama-4-Maverick-17B-128E-Instruct");
  EXPECT_FALSE(maverick.layers[0].ffn.isMoe);
  EXPECT_TRUE(maverick.layers[1].ffn.isMoe);
  EXPECT_EQ(maverick.layers[0].mixer.window, "chunked");
}

TEST(ConfigReader, MiniMaxResidualScalingPostnormAndBlocks) {
  // MiniMax-M1: layernorm_*_alpha/beta by the layer's mixer, postnorm, and
  // lightning's block_size (256 when absent).
  ModelSpec m1 = read("MiniMax-M1");
  EXPECT_TRUE(m1.layers[0].postNorm);
  EXPECT_DOUBLE_EQ(m1.layers[0].attentionAlpha, 3.5565588200778455);
  EXPECT_DOUBLE_EQ(m1.layers[7].attentionAlpha, 3.5565588200778455);
  EXPECT_DOUBLE_EQ(m1.layers[7].ffnAlpha, 3.5565588200778455);
  EXPECT_DOUBLE_EQ(m1.layers[0].attentionBeta, 1.0);
  EXPECT_EQ(m1.layers[0].mixer.blockSize, 256);
  EXPECT_EQ(m1.layers[7].mixer.blockSize, 0);
  // transformers' minimax form: *_alpha/beta_factor keys, layer_types, and
  // postnorm implied (MiniMaxDecoderLayer always takes the normed residual).
  Result<ModelSpec> hf = parseModelConfig(
      R"({"model_type": "minimax", "hidden_size": 64, "vocab_size": 256,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
          "num_experts_per_tok": 2, "block_size": 8,
          "layer_types": ["linear_attention", "full_attention"],
          "linear_attn_alpha_factor": 1.7, "linear_attn_beta_factor": 0.8,
          "full_attn_alpha_factor": 1.5, "full_attn_beta_factor": 0.9,
          "mlp_alpha_factor": 1.3, "mlp_beta_factor": 0.7})",
      "minimax/config.json");
  ASSERT_TRUE(hf.ok()) << hf.error().message();
  const ModelSpec &t = hf.value();
  EXPECT_EQ(t.family, "minimax_m1");
  EXPECT_EQ(t.layers[0].mixer.kind, MixerKind::Lightning);
  EXPECT_EQ(t.layers[0].mixer.blockSize, 8);
  EXPECT_TRUE(t.layers[0].postNorm);
  EXPECT_DOUBLE_EQ(t.layers[0].attentionAlpha, 1.7);
  EXPECT_DOUBLE_EQ(t.layers[0].attentionBeta, 0.8);
  EXPECT_DOUBLE_EQ(t.layers[1].attentionAlpha, 1.5);
  EXPECT_DOUBLE_EQ(t.layers[1].attentionBeta, 0.9);
  EXPECT_DOUBLE_EQ(t.layers[1].ffnAlpha, 1.3);
  EXPECT_DOUBLE_EQ(t.layers[1].ffnBeta, 0.7);
}

TEST(ConfigReader, HunyuanPerLayerListsAndNtkAlpha) {
  ModelSpec s = read("Hunyuan-A13B");
  EXPECT_EQ(s.layers[5].ffn.topK, 8);
  EXPECT_EQ(s.layers[5].ffn.numShared, 1);
  EXPECT_EQ(s.layers[0].mixer.rope.type, "ntk_alpha");
  // Its vit_* keys describe a tower adapt does not model: reported.
  bool sawVit = false;
  for (const UnknownKey &k : s.unknownKeys)
    sawVit |= k.path.rfind("vit_", 0) == 0;
  EXPECT_TRUE(sawVit);
}

TEST(ConfigReader, UnseenModelTypeIsRecognisedByItsKeys) {
  std::string text = R"({"model_type": "brand_new_moe", "hidden_size": 64,
    "num_hidden_layers": 2, "vocab_size": 100, "num_attention_heads": 4,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "intermediate_size": 128, "scoring_func": "sigmoid", "mystery_knob": 3})";
  Result<ModelSpec> spec = parseModelConfig(text, "new/config.json");
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  EXPECT_EQ(spec->family, "deepseek_v3");
  ASSERT_EQ(spec->unknownKeys.size(), 1u);
  EXPECT_EQ(spec->unknownKeys[0].path, "mystery_knob");
}

TEST(ConfigReader, BadValuesNameFileAndField) {
  Result<ModelSpec> r = parseModelConfig(
      R"({"hidden_size": "big", "num_hidden_layers": 2})", "x/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("x/config.json"), std::string::npos);
  EXPECT_NE(r.error().message().find("hidden_size"), std::string::npos);
  r = parseModelConfig("{\"hidden_size\": 4,", "y/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("valid JSON"), std::string::npos);
  r = parseModelConfig(R"({"hidden_size": 64, "num_hidden_layers": 2,
    "vocab_size": 10, "num_attention_heads": 4, "num_key_value_heads": 3,
    "intermediate_size": 8})", "z/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().field.find("num_key_value_heads"), std::string::npos);
}

/// The message a getter of \p object's key throws, "" when it reads.
template <typename Get> std::string configErrorOf(Get get) {
  try {
    get();
  } catch (const ConfigError &e) {
    return e.error.message();
  }
  return "";
}

TEST(ConfigKeys, TypedGettersNameTheKeyTheItemAndTheExpectation) {
  const nlohmann::json config = nlohmann::json::parse(R"({"layers": [1, "two", 3], "names": ["a", 7],
    "flag": "yes", "width": 4.5, "scale": "x", "kind": 3, "ratio": 2, "window": 8, "alias": null})");
  ConfigObject o(config, "text_config.", "m/config.json");
  EXPECT_EQ(configErrorOf([&] { o.getIntList({"layers"}); }),
            "m/config.json: text_config.layers[1]: expected an integer, found string");
  EXPECT_EQ(configErrorOf([&] { o.getStringList({"names"}); }),
            "m/config.json: text_config.names[1]: expected a string, found number");
  EXPECT_EQ(configErrorOf([&] { o.getStringList({"kind"}); }),
            "m/config.json: text_config.kind: expected a list of strings, found number");
  EXPECT_EQ(configErrorOf([&] { o.getBool({"flag"}); }), "m/config.json: text_config.flag: expected true or false, found string");
  EXPECT_EQ(configErrorOf([&] { o.getInt({"width"}); }), "m/config.json: text_config.width: expected an integer, found number 4.5");
  EXPECT_EQ(configErrorOf([&] { o.getDouble({"scale"}); }), "m/config.json: text_config.scale: expected a number, found string");
  EXPECT_EQ(configErrorOf([&] { o.getString({"kind"}); }), "m/config.json: text_config.kind: expected a string, found number");
  // What reads: an integer stands for a list of `count`, the first non-null
  // spelling wins, an absent key is nullopt.
  EXPECT_EQ(o.getIntList({"window"}, 3), (std::vector<int64_t>{8, 8, 8}));
  EXPECT_EQ(o.getInt({"alias", "ratio"}), 2);
  EXPECT_EQ(o.getDouble({"missing"}), std::nullopt);
}

TEST(WeightSchema, Qwen35ManifestParameterTotalMatchesItsMetadataExactly) {
  // The REAP index states metadata.total_parameters = 25,091,371,648.
  ModelSpec s = read("Qwen3.5-25B-REAP-A3B");
  int64_t decoder = 0;
  for (const ComponentDecl &c : declareModel(s))
    if (c.kind != "mtp")
      for (const WeightDecl &w : c.weights)
        decoder += weightElements(w);
  EXPECT_EQ(decoder, 25091371648);
}

TEST(WeightSchema, Fp8BlockScalesAndMxfp4BlocksExpand) {
  QuantSpec fp8;
  fp8.method = "fp8";
  fp8.blockRows = fp8.blockCols = 128;
  WeightDecl w{"q_b_proj", "l.q_b_proj.weight", {24576, 1536}, 0, true, false};
  std::vector<DiskTensor> disk;
  expandToDisk(w, 0, fp8, "BF16", disk);
  ASSERT_EQ(disk.size(), 2u);
  EXPECT_EQ(disk[0].dtype, "F8_E4M3");
  EXPECT_EQ(disk[1].name, "l.q_b_proj.weight_scale_inv");
  EXPECT_EQ(disk[1].shape, (std::vector<int64_t>{192, 12}));
  QuantSpec mx;
  mx.method = "mxfp4";
  WeightDecl e{"experts.gate_up_proj", "l.experts.gate_up_proj", {32, 5760, 2880}, 0, true, true};
  disk.clear();
  expandToDisk(e, 0, mx, "BF16", disk);
  ASSERT_EQ(disk.size(), 2u);
  EXPECT_EQ(disk[0].name, "l.experts.gate_up_proj_blocks");
  EXPECT_EQ(disk[0].shape, (std::vector<int64_t>{32, 5760, 90, 16}));
}

TEST(ConfigReader, RopeRouterAndNormDetailsForCodeGeneration) {
  ModelSpec oss = read("gpt-oss-20b");
  EXPECT_EQ(oss.layers[0].mixer.rope.type, "yarn");
  EXPECT_FALSE(oss.layers[0].mixer.rope.truncate); // "truncate": false
  EXPECT_EQ(oss.layers[0].mixer.rope.betaFast, 32.0);
  EXPECT_EQ(oss.layers[0].ffn.routing, "topk_score");
  EXPECT_EQ(oss.layers[0].ffn.fusedLayout, "interleaved_in_out");
  ModelSpec ds = read("DeepSeek-V3-Base");
  EXPECT_TRUE(ds.layers[0].mixer.rope.interleaved);
  EXPECT_EQ(ds.layers[0].mixer.rope.mscaleAllDim, 1.0);
  // 192^-0.5 * (0.1 * ln 40 + 1)^2
  EXPECT_NEAR(ds.layers[0].mixer.softmaxScale, 0.13523377886, 1e-10);
  ModelSpec scout = read("Llama-4-Scout-17B-16E-Instruct");
  EXPECT_EQ(scout.layers[0].mixer.qkNormKind, "l2");
  EXPECT_TRUE(scout.layers[0].mixer.qkNorm);
  EXPECT_FALSE(scout.layers[0].mixer.temperatureTuning);
  EXPECT_FALSE(scout.layers[3].mixer.qkNorm); // NoPE layer
  EXPECT_TRUE(scout.layers[3].mixer.temperatureTuning);
  EXPECT_EQ(scout.layers[3].mixer.floorScale, 8192.0);
  EXPECT_EQ(scout.layers[0].mixer.rope.highFreqFactor, 1.0);
  EXPECT_EQ(scout.layers[0].ffn.routing, "topk_score_input");
  EXPECT_EQ(scout.layers[0].ffn.scoring, "sigmoid");
  ModelSpec m2 = read("MiniMax-M2.5");
  EXPECT_EQ(m2.layers[0].mixer.qkNormKind, "full");
  EXPECT_TRUE(m2.layers[0].ffn.normTopK);
  ModelSpec mixtral = read("Mixtral-8x7B-v0.1");
  EXPECT_TRUE(mixtral.layers[0].ffn.normTopK);
}
