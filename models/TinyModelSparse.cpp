//===- TinyModelSparse.cpp - tiny configs of the sparse-attention families ===//

#include "models/TinyModelSparse.h"

namespace adapt {

namespace {

using ojson = nlohmann::ordered_json;

/// The keys DeepSeek-V3.2 and GLM-5 share (MLA, DeepSeek MoE, the indexer).
void sharedKeys(ojson &c, int64_t layers, const TinySizes &s) {
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["ep_size"] = 1;
  c["first_k_dense_replace"] = 1;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden;
  // index_head_dim must exceed qk_rope_head_dim (the indexer's RoPE part).
  c["index_head_dim"] = 16;
  c["index_n_heads"] = 4;
  c["index_topk"] = kTinyIndexTopK;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = 128;
  c["kv_lora_rank"] = 32;
  c["max_position_embeddings"] = s.maxPositions;
  c["moe_intermediate_size"] = s.expertWidth;
  c["moe_layer_freq"] = 1;
  c["n_routed_experts"] = s.experts;
  c["n_shared_experts"] = 1;
  c["norm_topk_prob"] = true;
  c["num_attention_heads"] = s.heads;
  c["num_experts_per_tok"] = s.topK;
  c["num_hidden_layers"] = layers;
  c["num_key_value_heads"] = s.heads;
  // The released models have one MTP layer; transformers loads the main
  // model without it, so the tiny models have none.
  c["num_nextn_predict_layers"] = 0;
  c["q_lora_rank"] = 32;
  c["qk_nope_head_dim"] = 16;
  c["qk_rope_head_dim"] = 8;
  c["routed_scaling_factor"] = 2.5;
  c["scoring_func"] = "sigmoid";
  c["tie_word_embeddings"] = false;
  c["topk_method"] = "noaux_tc";
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab;
}

} // namespace

ojson tinyDeepseekV32Config(int64_t layers, const TinySizes &s) {
  ojson c;
  c["architectures"] = {"DeepseekV32ForCausalLM"};
  c["bos_token_id"] = 0;
  c["eos_token_id"] = 1;
  c["model_type"] = "deepseek_v32";
  c["n_group"] = 4;
  c["topk_group"] = 2;
  c["rms_norm_eps"] = 1e-06;
  ojson rope;
  rope["beta_fast"] = 32;
  rope["beta_slow"] = 1;
  rope["factor"] = 8;
  rope["mscale"] = 1.0;
  rope["mscale_all_dim"] = 1.0;
  rope["original_max_position_embeddings"] = s.maxPositions / 8;
  rope["type"] = "yarn";
  c["rope_scaling"] = rope;
  c["rope_theta"] = 10000;
  c["torch_dtype"] = "bfloat16";
  c["v_head_dim"] = 16;
  sharedKeys(c, layers, s);
  return c;
}

ojson tinyGlmMoeDsaConfig(int64_t layers, const TinySizes &s) {
  ojson c;
  c["architectures"] = {"GlmMoeDsaForCausalLM"};
  c["dtype"] = "bfloat16";
  c["eos_token_id"] = {1, 2};
  c["head_dim"] = 8; // = qk_rope_head_dim, as GLM-5's config has it
  c["indexer_rope_interleave"] = true;
  c["model_type"] = "glm_moe_dsa";
  c["n_group"] = 1;
  c["topk_group"] = 1;
  c["pad_token_id"] = 1;
  c["pretraining_tp"] = 1;
  c["qk_head_dim"] = 24;
  c["rms_norm_eps"] = 1e-05;
  c["rope_interleave"] = true;
  ojson rope;
  rope["rope_theta"] = 1000000;
  rope["rope_type"] = "default";
  c["rope_parameters"] = rope;
  c["v_head_dim"] = 24; // GLM-5's v_head_dim differs from qk_nope_head_dim
  sharedKeys(c, layers, s);
  return c;
}

} // namespace adapt
