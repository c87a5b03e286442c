//===- LoraTargetsTest.cpp - PEFT-style LoRA target patterns --------------===//

#include "models/LoraTargets.h"

#include <gtest/gtest.h>

using namespace adapt;

namespace {
LoraModule moduleOf(const std::string &component, const std::string &role,
                    const std::string &name, const std::string &family = "qwen3_moe") {
  std::optional<LoraModule> m = loraModuleOf(component, role, name, family);
  EXPECT_TRUE(m.has_value()) << name;
  return m.value_or(LoraModule{});
}

/// A DeepSeek-like layer: MLA, router, per-expert and shared experts.
std::vector<LoraModule> deepseekLayer() {
  return {
      moduleOf("attention", "q_a_proj", "model.layers.3.self_attn.q_a_proj.weight"),
      moduleOf("attention", "kv_b_proj", "model.layers.3.self_attn.kv_b_proj.weight"),
      moduleOf("attention", "o_proj", "model.layers.3.self_attn.o_proj.weight"),
      moduleOf("moe", "gate", "model.layers.3.mlp.gate.weight"),
      moduleOf("moe", "experts.gate_proj", "model.layers.3.mlp.experts.{e}.gate_proj.weight"),
      moduleOf("moe", "experts.down_proj", "model.layers.3.mlp.experts.{e}.down_proj.weight"),
      moduleOf("moe", "shared_experts.up_proj", "model.layers.3.mlp.shared_experts.up_proj.weight"),
      moduleOf("mlp", "gate_proj", "model.layers.0.mlp.gate_proj.weight"),
  };
}

int64_t count(const LoraSelection &s) {
  int64_t n = 0;
  for (bool b : s.selected)
    n += b;
  return n;
}
} // namespace

TEST(LoraTargets, PatternsMatchWholeTrailingComponents) {
  EXPECT_TRUE(matchesModulePattern("q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(matchesModulePattern("self_attn.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(matchesModulePattern("layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(matchesModulePattern("self_attn.*", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(matchesModulePattern("*_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(matchesModulePattern("proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(matchesModulePattern("gate", "model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(matchesModulePattern("mlp.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(matchesModulePattern("", "model.layers.0.self_attn.q_proj"));
}

TEST(LoraTargets, CheckpointNamesMapToTransformersModules) {
  LoraModule w1 = moduleOf("moe", "experts.w1",
                           "model.layers.2.block_sparse_moe.experts.{e}.w1.weight",
                           "mixtral");
  EXPECT_EQ(w1.path, "model.layers.2.mlp.experts.gate_up_proj");
  EXPECT_EQ(w1.container, "model.layers.2.mlp.experts");
  EXPECT_EQ(w1.kind, LoraModuleKind::Experts);
  LoraModule w2 = moduleOf("moe", "experts.w2",
                           "model.layers.2.block_sparse_moe.experts.{e}.w2.weight",
                           "mixtral");
  EXPECT_EQ(w2.path, "model.layers.2.mlp.experts.down_proj");
  LoraModule router = moduleOf("moe", "gate", "model.layers.2.block_sparse_moe.gate.weight",
                               "mixtral");
  EXPECT_EQ(router.path, "model.layers.2.mlp.gate");
  EXPECT_EQ(router.kind, LoraModuleKind::Router);
  EXPECT_EQ(router.container, "");
  LoraModule llama = moduleOf("moe", "shared_expert.up_proj",
                              "language_model.model.layers.1.feed_forward.shared_expert.up_proj.weight",
                              "llama4");
  EXPECT_EQ(llama.path, "language_model.model.layers.1.feed_forward.shared_expert.up_proj");
  EXPECT_EQ(llama.local, "feed_forward.shared_expert.up_proj");
  EXPECT_EQ(layerPrefixOf("model.language_model.layers.12.mlp.gate.weight"),
            "model.language_model.layers.12.");
  EXPECT_EQ(layerPrefixOf("lm_head.weight"), "");
  EXPECT_FALSE(loraModuleOf("lm_head", "lm_head", "lm_head.weight", "qwen3_moe"));
}

TEST(LoraTargets, AllLinearIsEveryProjectionButTheRouter) {
  std::vector<LoraModule> modules = deepseekLayer();
  LoraSelection s = selectLoraTargets(modules, {}, false);
  ASSERT_EQ(s.error, "");
  EXPECT_EQ(count(s), 7);
  EXPECT_FALSE(s.selected[3]); // router
  EXPECT_EQ(s.routers, 0);
}

TEST(LoraTargets, ContainersNameWholeBlocks) {
  std::vector<LoraModule> modules = deepseekLayer();
  LoraSelection experts = selectLoraTargets(modules, {"experts"}, false);
  ASSERT_EQ(experts.error, "");
  EXPECT_EQ(count(experts), 2);
  EXPECT_TRUE(experts.selected[4] && experts.selected[5]);
  LoraSelection mlp = selectLoraTargets(modules, {"mlp"}, false);
  ASSERT_EQ(mlp.error, "");
  EXPECT_EQ(count(mlp), 1); // the dense MLP only, not the MoE block's router
  EXPECT_TRUE(mlp.selected[7]);
  LoraSelection one = selectLoraTargets(modules, {"experts.gate_up_proj"}, false);
  EXPECT_EQ(count(one), 1);
  EXPECT_TRUE(one.selected[4]);
}

TEST(LoraTargets, RouterNeedsTheFlag) {
  std::vector<LoraModule> modules = deepseekLayer();
  LoraSelection refused = selectLoraTargets(modules, {"gate"}, false);
  EXPECT_NE(refused.error.find("--lora-router"), std::string::npos);
  LoraSelection allowed = selectLoraTargets(modules, {"gate"}, true);
  ASSERT_EQ(allowed.error, "");
  EXPECT_EQ(allowed.routers, 1);
  LoraSelection implied = selectLoraTargets(modules, {"o_proj"}, true);
  EXPECT_EQ(count(implied), 2); // o_proj and the router
}

TEST(LoraTargets, UnmatchedPatternListsTheModules) {
  LoraSelection s = selectLoraTargets(deepseekLayer(), {"q_proj"}, false);
  EXPECT_NE(s.error.find("'q_proj' matches no linear module"), std::string::npos);
  EXPECT_NE(s.error.find("self_attn.q_a_proj"), std::string::npos);
  EXPECT_NE(s.error.find("mlp.gate (router)"), std::string::npos);
  EXPECT_NE(selectLoraTargets(deepseekLayer(), {"a..b"}, false).error, "");
}

TEST(LoraTargets, VisionProjectionsOnlyWhenNamed) {
  // Qwen3-VL: the vision tower's linears are PEFT modules under model.visual.
  std::vector<LoraModule> modules = deepseekLayer();
  modules.push_back(moduleOf("encoder", "attn.qkv", "model.visual.blocks.2.attn.qkv.weight"));
  modules.push_back(moduleOf("encoder", "mlp.linear_fc1", "model.visual.blocks.2.mlp.linear_fc1.weight"));
  modules.push_back(moduleOf("encoder", "merger.linear_fc1", "model.visual.merger.linear_fc1.weight"));
  modules.push_back(moduleOf("encoder", "deepstack_merger.linear_fc2",
                             "model.visual.deepstack_merger_list.1.linear_fc2.weight"));
  EXPECT_EQ(modules[8].local, "attn.qkv");
  EXPECT_EQ(modules[8].path, "model.visual.blocks.2.attn.qkv");
  EXPECT_EQ(modules[10].local, "merger.linear_fc1");
  EXPECT_EQ(modules[11].local, "deepstack_merger_list.1.linear_fc2");
  EXPECT_EQ(modules[11].path, "model.visual.deepstack_merger_list.1.linear_fc2");
  // Norms and embeddings of the tower are never targets.
  EXPECT_FALSE(loraModuleOf("encoder", "norm1", "model.visual.blocks.2.norm1.weight", "qwen3_moe"));
  EXPECT_FALSE(loraModuleOf("encoder", "patch_embed", "model.visual.patch_embed.proj.weight", "qwen3_moe"));
  // all-linear, "mlp" and "attn" leave the tower alone.
  for (const char *pattern : {"all-linear", "mlp"}) {
    LoraSelection s = selectLoraTargets(modules, {pattern}, false);
    for (size_t i = 8; i < modules.size(); ++i)
      EXPECT_FALSE(s.selected[i]) << pattern << " " << modules[i].path;
  }
  // Naming a projection selects it (and only it).
  LoraSelection qkv = selectLoraTargets(modules, {"qkv"}, false);
  EXPECT_TRUE(qkv.error.empty()) << qkv.error;
  EXPECT_EQ(count(qkv), 1);
  EXPECT_TRUE(qkv.selected[8]);
  LoraSelection fc1 = selectLoraTargets(modules, {"linear_fc1"}, false);
  EXPECT_EQ(count(fc1), 2); // the block MLP's and the merger's, as PEFT's suffix match
}

TEST(LoraTargets, SparseAttentionIndexerCannotBeATarget) {
  // Issue 16: the DSA indexer runs without autograd, so its adapters would
  // never train. all-linear leaves it out; naming it is an error.
  std::vector<LoraModule> modules = deepseekLayer();
  modules.push_back(moduleOf("sparse_attention", "indexer.wq_b",
                             "model.layers.3.self_attn.indexer.wq_b.weight", "deepseek_v32"));
  EXPECT_EQ(modules.back().kind, LoraModuleKind::NoGradient);
  LoraSelection all = selectLoraTargets(modules, {}, false);
  ASSERT_EQ(all.error, "");
  EXPECT_FALSE(all.selected.back());
  for (const char *pattern : {"wq_b", "indexer", "self_attn.indexer.wq_b"}) {
    LoraSelection named = selectLoraTargets(modules, {pattern}, false);
    EXPECT_NE(named.error.find("no gradient"), std::string::npos) << pattern;
    EXPECT_NE(named.error.find("self_attn.indexer.wq_b"), std::string::npos) << pattern;
  }
}
