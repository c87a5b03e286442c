//===- OpCheckLoss.cpp - op-stage checks: the fused LM head and loss ------===//
//
// linearCrossEntropySum (runtime/LinearCrossEntropy.h), the chunked LM head
// plus cross-entropy with the gradient computed in the forward pass, against
// the float64 composition it replaces: sum of cross_entropy(h W^T, targets)
// over the rows whose target is not -100. Forward and the gradient of h,
// with chunks that divide the rows, leave a partial last chunk, and one
// chunk for all; ignored targets; and a batch whose targets are all ignored.
//
//===----------------------------------------------------------------------===//

#include "runtime/LinearCrossEntropy.h"
#include "validation/opcheck/OpCheckHarness.h"

namespace adapt::rt::opcheck {

namespace {

struct LossCase {
  int64_t rows, hidden, vocab, chunk; ///< chunk 0: the default rows per chunk.
  int64_t ignoreEvery;                ///< every n-th target is -100 (0: none, 1: all).
};

Trial lossTrial(const Ctx &c, const LossCase &a) {
  Input h = input(c, torch::randn({a.rows, a.hidden}, f64), true);
  Input w = input(c, torch::randn({a.vocab, a.hidden}, f64) / std::sqrt(double(a.hidden)), false);
  Tensor targets = torch::randint(0, a.vocab, {a.rows}, i64);
  if (a.ignoreEvery > 0)
    for (int64_t r = 0; r < a.rows; r += a.ignoreEvery)
      targets[r] = -100;
  Tensor ours = linearCrossEntropySum(h.ours, w.ours, targets.to(c.device), a.chunk);
  Tensor ref = torch::nn::functional::cross_entropy(
      torch::mm(h.ref, w.ref.t()), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  Trial t{{"loss", ours, ref}};
  backward(t, ours, ref, {{"h", &h}});
  return t;
}

} // namespace

void addLossChecks(std::vector<Check> &all) {
  auto add = [&](LossCase a) {
    std::string shape = shapeText({{"N", a.rows}, {"H", a.hidden}, {"V", a.vocab}, {"chunk", a.chunk}}) +
                        (a.ignoreEvery == 1 ? " all ignored" : a.ignoreEvery ? " ignored 1/" +
                                                                     std::to_string(a.ignoreEvery) : "");
    addCheck(all, "linear_cross_entropy.chunked", shape, [=](const Ctx &c) { return lossTrial(c, a); });
  };
  add({12, 16, 37, 4, 0});   // chunks divide the rows
  add({13, 16, 37, 4, 3});   // a partial last chunk, ignored targets
  add({13, 8, 300, 0, 5});   // the default: one chunk
  add({6, 8, 37, 4, 1});     // nothing counts: loss and gradient zero
  add({8, 8, 16808, 0, 5});  // 16-byte packs on the GPU: two per thread in flight, then a tail
}

} // namespace adapt::rt::opcheck
