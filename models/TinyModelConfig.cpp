//===- TinyModelConfig.cpp - the config.json of each tiny family ----------===//
//
// The configs themselves are data: models/tiny/configs.jsonc, compiled in,
// holds each family's released config.json with the sizes shrunk. This file
// knows the families `adapt tiny` offers, checks the options and expands the
// data's markers for the layer count and quantization asked for.
//
//===----------------------------------------------------------------------===//

#include "models/TinyModel.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace adapt {

namespace {

using ojson = nlohmann::ordered_json;

/// One family `adapt tiny` writes: its configs.jsonc entry, the decoder
/// layers it gets without --layers, and the --quant it accepts.
struct FamilyInfo {
  const char *name;
  int64_t defaultLayers;
  const char *quant; ///< The --quant it accepts besides none, or "".
};

const FamilyInfo kFamilies[] = {
    {"qwen3_moe", 2, ""},   {"mixtral", 2, ""},     {"deepseek_v3", 3, "fp8"},
    {"kimi_k2", 3, "fp8"},  {"gpt_oss", 2, "mxfp4"}, {"glm4_moe", 3, ""},
    {"minimax_m2", 2, ""},  {"llama4", 4, ""},
    {"qwen3_next", 4, ""},   {"kimi_linear", 4, ""},
    {"deepseek_v32", 3, ""},
    {"glm_moe_dsa", 3, ""},
    {"qwen3_vl_moe", 2, ""},
    {"minimax", 4, ""},
};

/// The family called \p name, or null.
const FamilyInfo *findFamily(const std::string &name) {
  for (const FamilyInfo &f : kFamilies)
    if (name == f.name)
      return &f;
  return nullptr;
}

/// models/tiny/configs.jsonc: every family's config, with markers.
constexpr const char *kTinyConfigs =
#include "TinyConfigs.inc"
    ;

/// configs.jsonc parsed (once): {"families": {...}, "quantization_configs": {...}}.
const ojson &tinyConfigs() {
  static const ojson configs = ojson::parse(kTinyConfigs, nullptr, /*allow_exceptions=*/true,
                                            /*ignore_comments=*/true);
  return configs;
}

/// For a marker {"$cycle": [...]} or {"$numbers_where": [...]}: its name,
/// else "".
std::string listMarker(const ojson &value) {
  if (!value.is_object() || value.size() != 1)
    return "";
  const std::string &key = value.begin().key();
  return key == "$cycle" || key == "$numbers_where" ? key : "";
}

/// Expands configs.jsonc's markers in \p value, as its header describes,
/// for \p layers decoder layers; \p quantization is the quantization_config
/// to put in, or null to leave the key out.
void expandMarkers(ojson &value, int64_t layers, const ojson &quantization) {
  if (value == "$layers") {
    value = layers;
    return;
  }
  if (std::string marker = listMarker(value); !marker.empty()) {
    const ojson pattern = value.begin().value();
    value = ojson::array();
    for (int64_t i = 0; i < layers; ++i) {
      const ojson &entry = pattern[size_t(i) % pattern.size()];
      if (marker == "$cycle")
        value.push_back(entry);
      else if (entry.get<bool>())
        value.push_back(i + 1);
    }
    return;
  }
  if (!value.is_object())
    return;
  if (value.contains("quantization_config") && value["quantization_config"] == "$quantization_config") {
    if (quantization.is_null())
      value.erase("quantization_config");
    else
      value["quantization_config"] = quantization;
  }
  for (ojson &item : value)
    expandMarkers(item, layers, quantization);
}

/// The family names, comma-separated, for messages.
std::string familyList() {
  std::string out;
  for (const FamilyInfo &f : kFamilies)
    out += std::string(out.empty() ? "" : ", ") + f.name;
  return out;
}

/// Checks the options; returns the layer count to use.
Result<int64_t> checkOptions(const TinyModelOptions &o) {
  const FamilyInfo *family = findFamily(o.family);
  if (!family)
    return InputError{"tiny", "FAMILY", "expected one of " + familyList() +
                                        ", found \"" + o.family + "\""};
  int64_t n = o.layers ? o.layers : family->defaultLayers;
  if (!o.configFile.empty() && !o.quant.empty())
    return InputError{"tiny", "--quant", "expected no --quant with --config (the config says its own)"};
  if (n < 2 || n > 64)
    return InputError{"tiny", "--layers",
                      "expected 2..64 layers, found " + std::to_string(n)};
  if (!o.quant.empty() && o.quant != family->quant) {
    std::string expected = *family->quant
                               ? std::string("nothing or ") + family->quant
                               : std::string("nothing (bf16 only)");
    return InputError{"tiny", "--quant",
                      "expected " + expected + " for " + o.family +
                          ", found \"" + o.quant + "\""};
  }
  return n;
}

} // namespace

const std::vector<std::string> &tinyModelFamilies() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const FamilyInfo &f : kFamilies)
      out.push_back(f.name);
    return out;
  }();
  return names;
}

namespace {

/// A released config.json (\p path) cut to \p layers decoder layers (0: its
/// own): num_hidden_layers and the per-layer lists follow.
Result<std::string> releasedConfig(const std::string &path, int64_t layers) {
  std::ifstream in(path);
  if (!in)
    return InputError{path, "", "expected a readable config.json"};
  std::stringstream text;
  text << in.rdbuf();
  ojson config = ojson::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object())
    return InputError{path, "", "expected a JSON object"};
  if (layers <= 0)
    return config.dump(2) + "\n";
  if (!config.contains("num_hidden_layers") || !config["num_hidden_layers"].is_number_integer())
    return InputError{path, "num_hidden_layers", "expected an integer"};
  config["num_hidden_layers"] = layers;
  if (config.contains("max_window_layers") && config["max_window_layers"].is_number_integer())
    config["max_window_layers"] = std::min<int64_t>(config["max_window_layers"].get<int64_t>(), layers);
  if (config.contains("layer_types") && config["layer_types"].is_array() &&
      int64_t(config["layer_types"].size()) > layers)
    config["layer_types"].erase(config["layer_types"].begin() + layers, config["layer_types"].end());
  if (config.contains("mlp_only_layers") && config["mlp_only_layers"].is_array()) {
    ojson kept = ojson::array();
    for (const ojson &i : config["mlp_only_layers"])
      if (!i.is_number_integer() || i.get<int64_t>() < layers)
        kept.push_back(i);
    config["mlp_only_layers"] = kept;
  }
  return config.dump(2) + "\n";
}

} // namespace

Result<std::string> tinyModelConfig(const TinyModelOptions &options) {
  Result<int64_t> layers = checkOptions(options);
  if (!layers)
    return layers.error();
  if (!options.configFile.empty())
    return releasedConfig(options.configFile, options.layers);
  ojson config = tinyConfigs().at("families").at(options.family);
  ojson quantization = options.quant.empty()
                           ? ojson()
                           : tinyConfigs().at("quantization_configs").at(options.quant);
  expandMarkers(config, *layers, quantization);
  return config.dump(2) + "\n";
}

} // namespace adapt
