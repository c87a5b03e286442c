//===- OpRegistry.cpp - the operator library's registry -------------------===//

#include "passes/OpRegistry.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace adapt {

const RegistryEntry *
OpRegistry::match(const std::string &op,
                  const std::map<std::string, std::string> &features,
                  std::string &nearMiss) const {
  nearMiss.clear();
  for (const RegistryEntry &entry : entries) {
    if (entry.op != op)
      continue;
    std::string failing;
    for (const auto &[feature, value] : features) {
      auto it = entry.match.find(feature);
      if (it == entry.match.end())
        continue;
      bool allowed = false;
      for (const std::string &v : it->second)
        allowed |= v == value;
      if (!allowed) {
        failing = feature + "=" + value + " (" + entry.id + " has ";
        for (size_t i = 0; i < it->second.size(); ++i)
          failing += (i ? "|" : "") + it->second[i];
        failing += ")";
        break;
      }
    }
    if (failing.empty())
      return &entry;
    if (nearMiss.empty())
      nearMiss = failing;
  }
  return nullptr;
}

Result<OpRegistry> parseOpRegistry(const std::string &text,
                                   const std::string &file) {
  using nlohmann::json;
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return InputError{file, "", "expected a registry JSON object"};
  if (!root.contains("ops") || !root["ops"].is_array())
    return InputError{file, "ops", "expected an array of op variants"};
  OpRegistry registry;
  auto strings = [](const json &value) {
    std::vector<std::string> out;
    if (value.is_array())
      for (const json &item : value)
        if (item.is_string())
          out.push_back(item.get<std::string>());
    return out;
  };
  size_t index = 0;
  for (const json &item : root["ops"]) {
    std::string field = "ops[" + std::to_string(index++) + "]";
    if (!item.is_object() || !item.contains("id") || !item["id"].is_string() ||
        !item.contains("op") || !item["op"].is_string())
      return InputError{file, field, "expected an object with string id and op"};
    RegistryEntry entry;
    entry.id = item["id"].get<std::string>();
    entry.op = item["op"].get<std::string>();
    if (item.contains("match") && item["match"].is_object())
      for (auto &[key, value] : item["match"].items())
        entry.match[key] = strings(value);
    entry.forward = item.value("forward", false);
    entry.backward = item.value("backward", false);
    entry.dtypes = strings(item.value("dtypes", json::array()));
    entry.devices = strings(item.value("devices", json::array()));
    entry.loraTargets = strings(item.value("lora_targets", json::array()));
    entry.parallel = strings(item.value("parallel", json::array()));
    entry.status = item.value("status", "planned");
    entry.tracking = item.value("tracking", "");
    entry.note = item.value("note", "");
    if (item.contains("implementation")) {
      const json &impl = item["implementation"];
      if (!impl.is_object() || impl.value("kind", "") != "generated" ||
          !impl.contains("source") || !impl["source"].is_string() ||
          !impl.contains("sha256") || !impl["sha256"].is_string())
        return InputError{file, field + ".implementation",
                          "expected {\"kind\": \"generated\", \"source\": PATH, "
                          "\"sha256\": HEX, ...} as `adapt review --export` writes it"};
      entry.generated.candidate = impl.value("candidate", "");
      entry.generated.task = impl.value("task", "");
      entry.generated.source = impl["source"].get<std::string>();
      entry.generated.sha256 = impl["sha256"].get<std::string>();
      if (impl.contains("approved") && impl["approved"].is_object()) {
        entry.generated.approvedBy = impl["approved"].value("by", "");
        entry.generated.mac = impl["approved"].value("mac", "");
      }
    }
    registry.entries.push_back(std::move(entry));
  }
  return registry;
}

const char *builtinOpRegistryText() {
  static const char *text =
#include "RegistryData.inc"
      ;
  return text;
}

const OpRegistry &builtinOpRegistry() {
  static const OpRegistry registry = [] {
    Result<OpRegistry> parsed =
        parseOpRegistry(builtinOpRegistryText(), "runtime/registry/ops.json");
    return parsed ? parsed.value() : OpRegistry{};
  }();
  return registry;
}

Result<OpRegistry> readOpRegistry(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return InputError{path, "", "expected a readable registry JSON file"};
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parseOpRegistry(buffer.str(), path);
}

} // namespace adapt
