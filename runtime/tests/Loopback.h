//===- Loopback.h - a process group whose ranks are threads -----*- C++ -*-===//
//
// Context parallelism in the runtime-unit tests: two or more ranks run as
// threads of one process and exchange tensors through a mailbox, so a
// context-parallel layer can be compared with one process over the whole
// sequence without launching processes. It carries what context
// parallelism uses: point-to-point sends and receives (the delta rule's
// state, the convolution's tail) and all-gather / all-reduce (the keys a
// softmax or sparse attention layer's queries see, and their gradients).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TESTS_LOOPBACK_H
#define ADAPT_RUNTIME_TESTS_LOOPBACK_H

#include "runtime/Distributed.h"

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

namespace adapt::rt::test {

/// Messages between ranks, first in first out per (sender, receiver, tag).
/// A put returns at once; a take waits for its message (60 s at most).
class LoopbackMailbox {
public:
  void put(int from, int to, int tag, torch::Tensor x) {
    std::lock_guard<std::mutex> lock(mutex);
    box[{from, to, tag}].push_back(std::move(x));
    ready.notify_all();
  }
  torch::Tensor take(int from, int to, int tag) {
    std::unique_lock<std::mutex> lock(mutex);
    auto &queue = box[{from, to, tag}];
    if (!ready.wait_for(lock, std::chrono::seconds(60), [&] { return !queue.empty(); }))
      throw std::runtime_error("loopback receive timed out: a rank never sent");
    torch::Tensor x = queue.front();
    queue.pop_front();
    return x;
  }

private:
  std::mutex mutex;
  std::condition_variable ready;
  std::map<std::tuple<int, int, int>, std::deque<torch::Tensor>> box;
};

/// One rank's view of the group. The collectives are built from the
/// mailbox: every rank calls them in the same order (as with NCCL or gloo),
/// so a reserved tag per kind of collective keeps their messages apart.
class LoopbackCollectives : public Collectives {
public:
  LoopbackCollectives(LoopbackMailbox &mailbox, int rank, int size) : mailbox(mailbox), me(rank), members(size) {}
  int rank() const override { return me; }
  int size() const override { return members; }
  void send(const torch::Tensor &x, int peer, int tag) override { mailbox.put(me, peer, tag, x.clone()); }
  void waitSends() override {}
  torch::Tensor recv(const std::vector<int64_t> &shape, const torch::TensorOptions &options, int peer,
                     int tag) override {
    torch::Tensor x = mailbox.take(peer, me, tag);
    if (x.sizes() != torch::IntArrayRef(shape))
      throw std::runtime_error("loopback receive: unexpected shape");
    return x.to(options);
  }
  std::vector<torch::Tensor> allGather(const torch::Tensor &x) override { return exchange(x, kGatherTag); }
  /// Sums in rank order on every rank, so all ranks hold the same bits.
  void allReduceSum(std::vector<torch::Tensor> &tensors) override {
    for (torch::Tensor &t : tensors) {
      std::vector<torch::Tensor> all = exchange(t, kReduceTag);
      torch::Tensor sum = all[0].clone();
      for (int r = 1; r < members; ++r)
        sum += all[r];
      t.copy_(sum);
    }
  }
  torch::Tensor allToAll(const torch::Tensor &, const std::vector<int64_t> &, const std::vector<int64_t> &) override {
    unused();
    return {};
  }
  void barrier() override { unused(); }

private:
  static constexpr int kGatherTag = 1 << 29, kReduceTag = kGatherTag + 1;
  [[noreturn]] static void unused() { throw std::runtime_error("not used by context parallelism"); }
  /// Every rank's \p x in rank order.
  std::vector<torch::Tensor> exchange(const torch::Tensor &x, int tag) {
    for (int r = 0; r < members; ++r)
      if (r != me)
        mailbox.put(me, r, tag, x.clone());
    std::vector<torch::Tensor> all(members);
    for (int r = 0; r < members; ++r)
      all[r] = r == me ? x.clone() : mailbox.take(r, me, tag);
    return all;
  }
  LoopbackMailbox &mailbox;
  int me, members;
};

} // namespace adapt::rt::test

#endif // ADAPT_RUNTIME_TESTS_LOOPBACK_H
