//===- GeneratedOps.cpp - the registry of approved generated operators ----===//

#include "runtime/GeneratedOps.h"

#include "runtime/Errors.h"

namespace adapt::rt {

namespace {
/// Function-local so registration from other translation units' static
/// initialisers never runs before it exists.
std::map<std::string, GeneratedOp> &table() {
  static std::map<std::string, GeneratedOp> ops;
  return ops;
}
} // namespace

bool registerGeneratedOp(const GeneratedOp &op) {
  table()[op.component] = op;
  return true;
}

const GeneratedOp &generatedOp(const std::string &component) {
  auto it = table().find(component);
  if (it == table().end() || !it->second.fn)
    throw RuntimeError("", component,
                       "the model names a generated operator this trainer was not built "
                       "with; rebuild with `adapt build --registry` and the exported registry");
  return it->second;
}

std::vector<GeneratedOp> generatedOps() {
  std::vector<GeneratedOp> out;
  for (const auto &[component, op] : table())
    out.push_back(op);
  return out;
}

} // namespace adapt::rt
