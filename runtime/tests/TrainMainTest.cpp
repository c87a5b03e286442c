//===- TrainMainTest.cpp - the trainer's command line documents itself ----===//

#include "runtime/TrainMain.h"

#include <gtest/gtest.h>

#include <regex>

using namespace adapt::rt;

/// A flag the trainer accepts but --help leaves out is one a user cannot
/// find (and one added to the parser's list but not to the text). Each
/// accepted flag must start a line of --help, or follow ", " on one
/// ("--tp N, --ep N"), and be followed by a space, comma or line end (so
/// "--recompute-experts" does not stand for "--recompute").
TEST(TrainMain, HelpDocumentsEveryAcceptedFlag) {
  const std::string help = trainUsage("train", "MODEL");
  const std::vector<std::string> flags = trainFlags();
  ASSERT_GT(flags.size(), 40u);
  for (const std::string &flag : flags) {
    const std::regex documented("((^|\\n) +|, )" + flag + "(?=[ ,\\n])");
    EXPECT_TRUE(std::regex_search(help, documented)) << flag << " is accepted but --help does not list it";
  }
}
