//===- CpuMemory.h - bytes of CPU tensors alive, for memory tests -*- C++ -*-===//
//
// What a layer keeps for its backward pass decides how deep a model fits on
// a GPU, and the GPU is not here. On the CPU the same autograd graph keeps
// the same tensors, so a test can count them: CountCpuAllocations puts a
// counting allocator in front of LibTorch's CPU allocator for its lifetime:
// liveBytes() is what the tensors allocated since hold now, peakBytes() the
// most they held at once (a computation's transients included).
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_TESTS_CPUMEMORY_H
#define ADAPT_RUNTIME_TESTS_CPUMEMORY_H

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace adapt::rt::test {

/// While alive, every CPU allocation goes through a counter; liveBytes() is
/// the bytes allocated since construction and not freed yet. Not
/// reentrant: one at a time.
class CountCpuAllocations {
public:
  CountCpuAllocations() : previous(c10::GetCPUAllocator()), baseline(live()) {
    {
      std::lock_guard<std::mutex> lock(blocks().mutex);
      blocks().peak = blocks().bytes;
    }
    counting.inner = previous;
    c10::SetCPUAllocator(&counting, kPriority);
  }
  ~CountCpuAllocations() { c10::SetCPUAllocator(previous, kPriority); }
  CountCpuAllocations(const CountCpuAllocations &) = delete;
  CountCpuAllocations &operator=(const CountCpuAllocations &) = delete;

  int64_t liveBytes() const { return live() - baseline; }
  int64_t peakBytes() const {
    std::lock_guard<std::mutex> lock(blocks().mutex);
    return blocks().peak - baseline;
  }

private:
  /// The highest priority, so nothing set later displaces the counter.
  static constexpr uint8_t kPriority = std::numeric_limits<uint8_t>::max();

  /// Each counted allocation's inner data pointer and size, by its address,
  /// and their total: a tensor may outlive the counter that allocated it.
  /// The data pointers handed out are simple (context == data), as
  /// Allocator::raw_allocate requires.
  struct Blocks {
    std::mutex mutex;
    std::unordered_map<void *, std::pair<c10::DataPtr, size_t>> byAddress;
    int64_t bytes = 0, peak = 0;
  };
  static Blocks &blocks() {
    static Blocks *all = new Blocks; // never destroyed: frees may come at exit
    return *all;
  }
  static int64_t live() {
    std::lock_guard<std::mutex> lock(blocks().mutex);
    return blocks().bytes;
  }

  struct Counter : c10::Allocator {
    c10::Allocator *inner = nullptr;

    c10::DataPtr allocate(size_t n) override {
      c10::DataPtr data = inner->allocate(n);
      void *ptr = data.get();
      const c10::Device device = data.device();
      if (ptr) {
        std::lock_guard<std::mutex> lock(blocks().mutex);
        blocks().bytes += static_cast<int64_t>(n);
        blocks().peak = std::max(blocks().peak, blocks().bytes);
        blocks().byAddress.emplace(ptr, std::make_pair(std::move(data), n));
      }
      return {ptr, ptr, &release, device};
    }
    static void release(void *ptr) {
      c10::DataPtr inner; // freed outside the lock
      {
        std::lock_guard<std::mutex> lock(blocks().mutex);
        auto it = blocks().byAddress.find(ptr);
        if (it == blocks().byAddress.end())
          return;
        blocks().bytes -= static_cast<int64_t>(it->second.second);
        inner = std::move(it->second.first);
        blocks().byAddress.erase(it);
      }
    }
    c10::DeleterFnPtr raw_deleter() const override { return &release; }
    void copy_data(void *dest, const void *src, std::size_t count) const override {
      inner->copy_data(dest, src, count);
    }
  };

  c10::Allocator *previous;
  int64_t baseline;
  Counter counting;
};

} // namespace adapt::rt::test

#endif // ADAPT_RUNTIME_TESTS_CPUMEMORY_H
