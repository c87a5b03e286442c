//===- KernelLedgerTest.cpp - the tally of guarded kernel sites -----------===//
//
// The GPU benchmarks read OUT/kernels.json to tell whether a layer ran its
// CUDA kernels or silently fell back to the composition (session 42's
// finding). Here the ledger's contract, with meta tensors standing for the
// GPU's: off-CPU calls are counted as kernel, off or refused, CPU calls are
// not, and the line and JSON say what was counted.
//
//===----------------------------------------------------------------------===//

#include "runtime/KernelLedger.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/RunReport.h"
#include "runtime/tests/TempDir.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>

using namespace adapt::rt;

TEST(KernelLedger, CountsEachChoiceOfOffCpuCallsAndNotCpuOnes) {
  resetKernelLedger();
  const torch::Tensor gpu = torch::empty({4, 128}, torch::TensorOptions().device(torch::kMeta));
  const torch::Tensor cpu = torch::empty({4, 128});
  EXPECT_TRUE(chooseKernel("test.delta", gpu, true, true));
  EXPECT_TRUE(chooseKernel("test.delta", gpu, true, true));
  EXPECT_FALSE(chooseKernel("test.delta", gpu, false, true)); // switched off
  EXPECT_FALSE(chooseKernel("test.delta", gpu, true, false)); // refused: the fallback the ledger exists for
  const torch::Tensor later = torch::empty({2, 64}, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
  EXPECT_FALSE(chooseKernel("test.delta", later, true, false)); // a second refusal keeps the first one's input
  EXPECT_FALSE(chooseKernel("test.conv", gpu, false, false)); // off wins over refused: the switch decided
  EXPECT_TRUE(chooseKernel("test.cpu", cpu, true, true));     // the answer still holds, uncounted

  const std::vector<KernelTally> tallies = kernelTallies();
  ASSERT_EQ(tallies.size(), 2u);
  EXPECT_EQ(tallies[0].site, "test.conv");
  EXPECT_EQ(tallies[0].switchedOff, 1);
  EXPECT_EQ(tallies[0].refused, 0);
  EXPECT_EQ(tallies[1].site, "test.delta");
  EXPECT_EQ(tallies[1].kernel, 2);
  EXPECT_EQ(tallies[1].switchedOff, 1);
  EXPECT_EQ(tallies[1].refused, 2);
  EXPECT_EQ(tallies[1].firstRefused, "Float [4, 128] strides [128, 1]");
  EXPECT_EQ(kernelLedgerLine(tallies), "test.conv: 0 kernel, 1 off; test.delta: 2 kernel, 1 off, 2 refused "
                                       "(first: Float [4, 128] strides [128, 1])");

  const JsonValue json = parseJson(kernelLedgerJson(tallies), "kernels.json");
  ASSERT_NE(json.find("built_in"), nullptr);
  EXPECT_EQ(json.find("built_in")->asBool(), cudaKernelsBuiltIn());
  const JsonValue *delta = json.find("sites")->find("test.delta");
  ASSERT_NE(delta, nullptr);
  EXPECT_EQ(delta->find("kernel")->asInt(), 2);
  EXPECT_EQ(delta->find("refused")->asInt(), 2);
  EXPECT_EQ(delta->find("first_refused")->asString(), "Float [4, 128] strides [128, 1]");
  EXPECT_EQ(json.find("sites")->find("test.conv")->find("first_refused"), nullptr);

  resetKernelLedger();
  EXPECT_TRUE(kernelTallies().empty());
  EXPECT_EQ(kernelLedgerLine(kernelTallies()), "no guarded kernel site was called");
}

TEST(KernelLedger, TheRunReportShowsTheTallyRefusalsFirst) {
  // What a GPU run leaves: metrics.jsonl and kernels.json; report.html ends
  // with the table, the site whose kernel refused calls on top.
  resetKernelLedger();
  const torch::Tensor gpu = torch::empty({2, 16, 200, 64}, torch::TensorOptions().device(torch::kMeta));
  chooseKernel("a.fine", gpu, true, true);
  chooseKernel("z.refused", gpu, true, false);
  adapt::rt::testing::TempDir dir;
  dir.write("metrics.jsonl", "{\"step\": 1, \"loss\": 2.5, \"lr\": 0.001, \"tokens_per_s\": 100.0}\n");
  dir.write("kernels.json", kernelLedgerJson(kernelTallies()));
  resetKernelLedger();
  writeRunReport(dir.path);
  std::ifstream in(dir / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t table = html.find("<h2>CUDA kernels</h2>");
  ASSERT_NE(table, std::string::npos);
  const size_t refused = html.find("<th>z.refused</th>", table), fine = html.find("<th>a.fine</th>", table);
  ASSERT_NE(refused, std::string::npos);
  ASSERT_NE(fine, std::string::npos);
  EXPECT_LT(refused, fine);
  EXPECT_NE(html.find("Float [2, 16, 200, 64] strides [204800, 12800, 64, 1]", refused), std::string::npos);

  // A run without the file (the CPU) has no table; a broken file is skipped.
  dir.write("kernels.json", "{not json");
  writeRunReport(dir.path);
  std::ifstream again(dir / "report.html");
  const std::string plain((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(plain.find("CUDA kernels"), std::string::npos);
  EXPECT_NE(plain.find("Training run"), std::string::npos);
}
