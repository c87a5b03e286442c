//===- ProfilerTest.cpp - which kind a kernel's time counts as ------------===//
//
// `train --profile` sorts each GPU kernel's time into a kind (issue 17's
// breakdown). A hybrid model's own attention kernels (the delta rule's,
// lightning's, Kimi's, the DSA indexer's and sparse MLA's) must count as the
// attention core, not as elementwise work or routing, or the breakdown of a
// Qwen3-Next, MiniMax, Kimi-Linear or DeepSeek-V3.2 step hides its core.
// The names are as Kineto reports them (demangled, from session 53's traces).
//
//===----------------------------------------------------------------------===//

#include "runtime/Profiler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace adapt::rt;

namespace {
const std::string kCore = "attention core";
const std::string kLightningNode = "torch::autograd::CppNode<adapt::rt::(anonymous namespace)::LightningKernelNode>";
} // namespace

TEST(ProfileKind, TheMixersOwnKernelsAreTheAttentionCore) {
  const std::vector<std::string> kernels = {
      "void adapt::rt::cuda::delta::deltaRuleStateKernel<true, false, 32, 4, false>(adapt::rt::cuda::delta::Strided, "
      "__nv_bfloat16 const*)",
      "adapt::rt::cuda::(anonymous namespace)::deltaRuleOutputKernel(adapt::rt::cuda::delta::Strided, float)",
      "void adapt::rt::cuda::(anonymous namespace)::deltaRuleChunkGradKernel<__nv_bfloat16, false>(int)",
      "void adapt::rt::cuda::(anonymous namespace)::kimiOutputKernel<true>(float const*)",
      "void adapt::rt::cuda::(anonymous namespace)::perChannelScoresSubchunkBackwardKernel<true>(float const*)",
      "adapt::rt::cuda::(anonymous namespace)::indexerScoresKernel(__nv_bfloat16 const*)",
      "adapt::rt::cuda::(anonymous namespace)::fusedIndexerKernel(__nv_bfloat16 const*)",
      "void adapt::rt::cuda::(anonymous namespace)::sparseLatentBackwardKernel<64>(__nv_bfloat16 const*)",
      "void adapt::rt::cuda::(anonymous namespace)::sparseKeyScatterKernel<c10::BFloat16>(float*, long const*)"};
  for (const std::string &kernel : kernels) {
    // Launched with no operator around it (the forward's kernels), or from
    // the autograd node's backward, which Kineto names as the operator.
    EXPECT_EQ(profileKind("", {}, kernel, 16, 151936), kCore) << kernel;
    EXPECT_EQ(profileKind(kLightningNode, {{1, 64, 8192, 128}}, kernel, 16, 151936), kCore) << kernel;
  }
  EXPECT_EQ(profileKind("aten::_flash_attention_backward", {}, "flash_bwd_kernel", 16, 151936), kCore);
}

TEST(ProfileKind, TheOtherKindsStayApart) {
  // The scatter and cumsum of routing stay routing; the fused norms stay
  // elementwise; GEMMs split by their shapes.
  EXPECT_EQ(profileKind("aten::index_add_", {{8192, 2048}}, "indexFuncLargeIndex", 16, 151936), "router, top-k, permute");
  EXPECT_EQ(profileKind("", {}, "void adapt::rt::cuda::(anonymous namespace)::rmsNormForwardKernel<8>(float)", 16,
                        151936),
            "norms, activations, elementwise");
  EXPECT_EQ(profileKind("", {}, "void adapt::rt::cuda::(anonymous namespace)::causalConvSiluKernel(float)", 16, 151936),
            "norms, activations, elementwise");
  EXPECT_EQ(profileKind("aten::mm", {{8192, 2048}, {2048, 16}}, "nvjet_tst", 16, 151936), "LoRA GEMMs");
  EXPECT_EQ(profileKind("aten::mm", {{4096, 2048}, {2048, 151936}}, "nvjet_tst", 16, 151936), "LM head + loss");
  EXPECT_EQ(profileKind("aten::mm", {{8192, 2048}, {2048, 4096}}, "nvjet_tst", 16, 151936),
            "dense GEMMs (projections, dense MLPs)");
  EXPECT_EQ(profileKind("aten::_grouped_mm", {{8192, 2048}}, "cutlass_grouped", 16, 151936), "grouped expert GEMMs");
  EXPECT_EQ(profileKind("aten::copy_", {{8192, 2048}}, "bfloat16_copy_kernel_cuda", 16, 151936), "copies, casts");
}
