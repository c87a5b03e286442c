//===- ConfigKeys.cpp - checked access to config.json keys ----------------===//

#include "parser/ConfigKeys.h"

#include <cmath>
#include <unordered_set>

using nlohmann::json;

namespace adapt {

namespace {
std::string typeName(const json &value) {
  return std::string(value.type_name());
}
} // namespace

const json *ConfigObject::find(std::initializer_list<const char *> names,
                               std::string &foundName) {
  // Every spelling present counts as read; the first non-null one wins.
  const nlohmann::json *found = nullptr;
  for (const char *name : names) {
    auto it = object->find(name);
    if (it == object->end())
      continue;
    read.insert(name);
    if (it->is_null() || found)
      continue;
    foundName = name;
    found = &*it;
  }
  return found;
}

bool ConfigObject::has(std::initializer_list<const char *> names) const {
  for (const char *name : names) {
    auto it = object->find(name);
    if (it != object->end() && !it->is_null())
      return true;
  }
  return false;
}

void ConfigObject::fail(const std::string &key,
                        const std::string &expected) const {
  throw ConfigError{InputError{file, path + key, expected}};
}

std::optional<int64_t>
ConfigObject::getInt(std::initializer_list<const char *> names) {
  return lookup(names, [&](const json &value, const std::string &name) -> int64_t {
    if (value.is_number_integer())
      return value.get<int64_t>();
    if (value.is_number_float()) {
      double d = value.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
        return static_cast<int64_t>(d);
    }
    fail(name, "expected an integer, found " + typeName(value) + " " + abbreviateJson(value));
  });
}

int64_t ConfigObject::requireInt(std::initializer_list<const char *> names,
                                 int64_t minimum) {
  std::optional<int64_t> value = getInt(names);
  std::string first = *names.begin();
  if (!value) {
    std::string all;
    for (const char *n : names)
      all += (all.empty() ? "" : " or ") + std::string(n);
    fail(first, "required key missing: expected " + all +
                    " (an integer >= " + std::to_string(minimum) + ")");
  }
  if (*value < minimum)
    fail(first, "expected an integer >= " + std::to_string(minimum) +
                    ", found " + std::to_string(*value));
  return *value;
}

std::optional<double>
ConfigObject::getDouble(std::initializer_list<const char *> names) {
  return lookup(names, [&](const json &value, const std::string &name) {
    if (!value.is_number())
      fail(name, "expected a number, found " + typeName(value));
    return value.get<double>();
  });
}

std::optional<bool>
ConfigObject::getBool(std::initializer_list<const char *> names) {
  return lookup(names, [&](const json &value, const std::string &name) {
    if (value.is_boolean())
      return value.get<bool>();
    if (value.is_number_integer())
      return value.get<int64_t>() != 0;
    fail(name, "expected true or false, found " + typeName(value));
  });
}

std::optional<std::string>
ConfigObject::getString(std::initializer_list<const char *> names) {
  return lookup(names, [&](const json &value, const std::string &name) {
    if (!value.is_string())
      fail(name, "expected a string, found " + typeName(value));
    return value.get<std::string>();
  });
}

namespace {

/// The items of the list \p value (of \p plural, each \p what: "integers",
/// "an integer"), each checked by \p isItem; \p fail names a bad item by its
/// index.
template <typename T, typename IsItem, typename Fail>
std::vector<T> listItems(const json &value, const std::string &name, const char *plural, const char *what,
                         IsItem isItem, Fail fail) {
  if (!value.is_array())
    fail(name, std::string("expected a list of ") + plural + ", found " + typeName(value));
  std::vector<T> out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (!isItem(value[i]))
      fail(name + "[" + std::to_string(i) + "]", std::string("expected ") + what + ", found " + typeName(value[i]));
    out.push_back(value[i].template get<T>());
  }
  return out;
}

} // namespace

std::optional<std::vector<int64_t>>
ConfigObject::getIntList(std::initializer_list<const char *> names,
                         int64_t count) {
  auto fail = [this](const std::string &key, const std::string &expected) { this->fail(key, expected); };
  return lookup(names, [&](const json &value, const std::string &name) {
    if (value.is_number_integer()) {
      if (count <= 0)
        fail(name, "expected a list of integers, found a single integer");
      return std::vector<int64_t>(count, value.get<int64_t>());
    }
    return listItems<int64_t>(value, name, "integers", "an integer", [](const json &v) { return v.is_number_integer(); }, fail);
  });
}

std::optional<std::vector<std::string>>
ConfigObject::getStringList(std::initializer_list<const char *> names) {
  auto fail = [this](const std::string &key, const std::string &expected) { this->fail(key, expected); };
  return lookup(names, [&](const json &value, const std::string &name) {
    return listItems<std::string>(value, name, "strings", "a string", [](const json &v) { return v.is_string(); }, fail);
  });
}

std::optional<ConfigObject> ConfigObject::getObject(const char *name) {
  std::string found;
  const json *value = find({name}, found);
  if (!value)
    return std::nullopt;
  if (!value->is_object())
    fail(name, "expected an object, found " + typeName(*value));
  return ConfigObject(*value, path + name + ".", file);
}

void ConfigObject::markRead(std::initializer_list<const char *> names) {
  for (const char *name : names)
    read.insert(name);
}

const json *ConfigObject::raw(const char *name) {
  std::string found;
  return find({name}, found);
}

void ConfigObject::collectUnknown(std::vector<UnknownKey> &out) const {
  for (auto it = object->begin(); it != object->end(); ++it) {
    if (read.count(it.key()) || isArchitectureNeutralKey(it.key(), it.value()))
      continue;
    out.push_back({path + it.key(), abbreviateJson(it.value())});
  }
}

bool isArchitectureNeutralKey(const std::string &key, const json &value) {
  // Keys that never change what must be computed or trained: tokens,
  // generation defaults, dropout and loss weights, bookkeeping.
  static const std::unordered_set<std::string> neutral = {
      "_name_or_path", "_attn_implementation", "_attn_implementation_autoset",
      "add_cross_attention", "architectures", "attention_dropout",
      "auto_map", "aux_loss_alpha", "bad_words_ids", "begin_suppress_tokens",
      "bos_token_id", "chunk_size_feed_forward", "cross_attention_hidden_size",
      "decoder_start_token_id", "diversity_penalty", "do_sample", "dtype",
      "early_stopping", "embedding_dropout", "encoder_no_repeat_ngram_size",
      "eod_token_id", "eos_token_id", "ep_size",
      "exponential_decay_length_penalty", "finetuning_task",
      "forced_bos_token_id", "forced_eos_token_id", "id2label",
      "ignore_index", "image_token_id", "initializer_range", "is_decoder",
      "is_encoder_decoder", "label2id", "length_penalty", "max_length",
      "min_length", "model_max_length", "no_repeat_ngram_size",
      "num_beam_groups", "num_beams", "num_return_sequences",
      "output_attentions", "output_dropout", "output_hidden_states",
      "output_router_logits", "output_scores", "pad_id", "pad_token_id",
      "prefix", "pretraining_tp", "problem_type", "pruned_heads",
      "remove_invalid_values", "repetition_penalty", "return_dict",
      "return_dict_in_generate", "router_aux_loss_coef", "router_jitter_noise",
      "sep_token_id", "seq_aux", "suppress_tokens", "task_specific_params",
      "temperature", "tf_legacy_loss", "tie_encoder_decoder",
      "tokenizer_class", "top_k", "top_p", "torch_dtype", "torchscript",
      "transformers_version", "typical_p", "use_bfloat16", "use_cache",
      "video_token_id", "initial_context_length", "moe_drop_tokens",
      "moe_random_routing_dropped_token", "mamba_ssm_dtype",
      "media_placeholder_token_id", "image_patch_token", "video_patch_token",
      "image_start_token", "video_start_token", "video_placeholder",
      "im_start_id", "im_end_id", "im_newline_id", "text_start_id",
      "text_end_id", "video_start_id", "video_end_id", "mask_init_id",
      "projector_ln_eps", "model_type"};
  if (neutral.count(key))
    return true;
  // Switches for features adapt does not model are harmless while off.
  static const std::unordered_set<std::string> offSwitches = {
      "use_cla", "use_mla", "position_embedding_xdrope",
      "add_classification_head", "class_num", "moe_layer_num_skipped",
      "group_limited_greedy", "anyres_vit_two_views", "vit_path", "vit_type",
      "anyres_vit_max_image_size", "xdrope_section", "use_sliding_window",
      "sliding_window", "skip_cls_token", "norm_head", "norm_softmax"};
  if (offSwitches.count(key))
    return value.is_null() || value == false || value == 0;
  return false;
}

std::string abbreviateJson(const json &value) {
  if (value.is_array() && value.size() > 6) {
    std::string out = "[";
    for (size_t i = 0; i < 3; ++i)
      out += value[i].dump() + ", ";
    return out + "... " + std::to_string(value.size()) + " items]";
  }
  std::string text = value.dump();
  if (text.size() > 120)
    text = text.substr(0, 117) + "...";
  return text;
}

} // namespace adapt
