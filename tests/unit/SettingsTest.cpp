//===- SettingsTest.cpp - the settings lists agree end to end ------------===//
//
// A setting is a config value that reaches a runtime field unchanged: the
// parser lists it (parser/ModelSpec.h), the op declares it (ir/AdaptOps.td),
// the runtime lists its field (runtime/ModelDef.h), and the importer and
// code generation copy it by those lists alone. These tests fail when the
// three lists drift apart: a name the op does not declare, a runtime field
// no parser setting fills, or defaults that differ (a config without the key
// must leave the runtime's default).
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "parser/ModelSpec.h"
#include "runtime/ModelDef.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <variant>

using namespace adapt;

namespace {

using SettingValue = std::variant<bool, int64_t, double, std::string>;

/// Name -> default value of the parser's settings of \p spec.
template <typename Spec> std::map<std::string, SettingValue> parserSettings(const Spec &spec) {
  std::map<std::string, SettingValue> out;
  visitSettings(spec, [&](const char *name, const auto &value) { out[name] = SettingValue(value); });
  return out;
}

/// Attribute name -> default value of the runtime's settings of \p Def.
template <typename Def> std::map<std::string, SettingValue> runtimeSettings() {
  Def defaults;
  std::map<std::string, SettingValue> out;
  rt::visitSettings(defaults, [&](const char *attribute, const char *, const auto &value) {
    out[attribute] = SettingValue(value);
  });
  return out;
}

/// The attribute names \p Op declares in ODS.
template <typename Op> std::set<std::string> declaredAttributes() {
  std::set<std::string> out;
  for (llvm::StringRef name : Op::getAttributeNames())
    out.insert(name.str());
  return out;
}

template <typename Op, typename Spec, typename Def> void expectListsAgree() {
  const auto parser = parserSettings(Spec{});
  const auto runtime = runtimeSettings<Def>();
  const auto declared = declaredAttributes<Op>();
  for (const auto &[name, value] : parser)
    EXPECT_TRUE(declared.count(name)) << name << ": a parser setting " << Op::getOperationName().str()
                                      << " does not declare (ir/AdaptOps.td)";
  for (const auto &[name, value] : runtime) {
    auto it = parser.find(name);
    ASSERT_NE(it, parser.end()) << name << ": a runtime setting no parser setting fills";
    EXPECT_EQ(it->second.index(), value.index()) << name << ": the parser and runtime types differ";
    EXPECT_TRUE(it->second == value) << name << ": the parser's default differs from the runtime's, so a "
                                     << "config without the key would change the trainer";
  }
}

TEST(Settings, AttentionListsAgree) {
  expectListsAgree<AttentionOp, MixerSpec, rt::AttentionDef>();
}

TEST(Settings, MoeListsAgree) { expectListsAgree<MoEOp, FfnSpec, rt::FfnDef>(); }

TEST(Settings, EveryRuntimeListIsNonEmpty) {
  // An empty list would make the agreement checks above vacuous.
  EXPECT_GE(runtimeSettings<rt::AttentionDef>().size(), 5u);
  EXPECT_GE(runtimeSettings<rt::FfnDef>().size(), 5u);
}

} // namespace
