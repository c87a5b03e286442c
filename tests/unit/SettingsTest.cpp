//===- SettingsTest.cpp - the settings lists name declared attributes ----===//
//
// A setting is a config value that reaches a runtime field unchanged. Its
// field lives once, in runtime/ModelDef.h (AttentionSettings, FfnSettings;
// the parser's MixerSpec and FfnSpec derive from them), and visitSettings
// names the op attribute that carries it through the IR; the importer and
// codegen copy settings by that list alone. These tests fail when the list
// names an attribute the op does not declare (ir/AdaptOps.td), which would
// make every import fail its verifier.
//
//===----------------------------------------------------------------------===//

#include "ir/AdaptDialect.h"
#include "parser/ModelSpec.h"
#include "runtime/ModelDef.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

using namespace adapt;

// One description: the fields the parser fills are the runtime's own, with
// one default each (a compile error, not a test failure, if that changes).
static_assert(std::is_base_of_v<rt::AttentionSettings, MixerSpec>);
static_assert(std::is_base_of_v<rt::FfnSettings, FfnSpec>);

namespace {

/// The attribute names \p Op declares in ODS.
template <typename Op> std::set<std::string> declaredAttributes() {
  std::set<std::string> out;
  for (llvm::StringRef name : Op::getAttributeNames())
    out.insert(name.str());
  return out;
}

/// Every setting of \p Settings names an attribute \p Op declares; returns
/// how many settings there are.
template <typename Op, typename Settings> size_t expectDeclared() {
  const std::set<std::string> declared = declaredAttributes<Op>();
  size_t count = 0;
  rt::visitSettings(Settings{}, [&](const char *attribute, const char *field, const auto &) {
    ++count;
    EXPECT_TRUE(declared.count(attribute))
        << field << ": its attribute " << attribute << " is not declared by "
        << Op::getOperationName().str() << " (ir/AdaptOps.td)";
  });
  return count;
}

TEST(Settings, AttentionSettingsAreDeclaredByTheOp) {
  EXPECT_GE((expectDeclared<AttentionOp, rt::AttentionSettings>()), 5u);
}

TEST(Settings, FfnSettingsAreDeclaredByTheOp) {
  EXPECT_GE((expectDeclared<MoEOp, rt::FfnSettings>()), 5u);
}

} // namespace
