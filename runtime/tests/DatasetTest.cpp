//===- DatasetTest.cpp - JSONL/ADAPTTOK reading, packing, batching --------===//
#include "runtime/Dataset.h"
#include "runtime/FileSystem.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <set>

#include <unistd.h>

#include "runtime/tests/TempDir.h"

using namespace adapt::rt;

namespace {

using adapt::rt::testing::TempDir;

/// An ADAPTTOK file with \p width-byte tokens; documents end with the marker.
std::string tokenFile(const std::vector<std::vector<uint32_t>> &docs, uint32_t width,
                      uint32_t version = 1) {
  std::string out = "ADAPTTOK";
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i)
      out += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  u32(version);
  u32(width);
  auto token = [&](uint32_t v) {
    for (uint32_t i = 0; i < width; ++i)
      out += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  for (const auto &doc : docs) {
    for (uint32_t id : doc)
      token(id);
    token(width == 2 ? 0xffffu : 0xffffffffu);
  }
  return out;
}

std::vector<int64_t> row(const torch::Tensor &t, int64_t b) {
  torch::Tensor r = t[b].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

std::vector<int64_t> windowIds(const PackedDataset &data, int64_t w, bool labels = false) {
  std::vector<int64_t> ids(data.options().seqLen), lab(data.options().seqLen);
  data.window(w, ids.data(), lab.data());
  return labels ? lab : ids;
}

template <typename Fn>
std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const RuntimeError &e) {
    EXPECT_EQ(e.exitCode, kExitBadInput);
    return e.what();
  }
  ADD_FAILURE() << "expected a RuntimeError";
  return "";
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST(Dataset, JsonlObjectsArraysBlankLinesAndEos) {
  TempDir dir;
  std::string path = dir.write("d.jsonl", "{\"input_ids\": [1, 2, 3], \"text\": \"x\"}\n"
                                          "\n   \r\n"
                                          "[4, 5]\r\n");
  PackedDataset data(path, {4, 10, /*eos=*/9, 0});
  EXPECT_EQ(data.documents(), 2);
  EXPECT_EQ(data.streamTokens(), 7); // 1 2 3 9 4 5 9
  ASSERT_EQ(data.windows(), 2);
  EXPECT_EQ(windowIds(data, 0), (std::vector<int64_t>{1, 2, 3, 9}));
  EXPECT_EQ(windowIds(data, 0, true), (std::vector<int64_t>{1, 2, 3, 9}));
  EXPECT_EQ(windowIds(data, 1), (std::vector<int64_t>{4, 5, 9, 9}));
  EXPECT_EQ(windowIds(data, 1, true), (std::vector<int64_t>{4, 5, 9, -100}));
}

TEST(Dataset, WithoutPackingEveryDocumentStartsAWindow) {
  // No token attends to another document's: each document starts a window,
  // a long one continues in the next, the rest is masked padding.
  TempDir dir;
  std::string path = dir.write("d.jsonl", "[1, 2]\n[4, 5, 6, 7, 8, 10, 11]\n[12]\n");
  PackedDataset data(path, {4, 20, /*eos=*/9, 0, /*packing=*/false});
  EXPECT_EQ(data.streamTokens(), 14); // 1 2 9 pad | 4 5 6 7 | 8 10 11 9 | 12 9 pad pad
  ASSERT_EQ(data.windows(), 4);
  EXPECT_EQ(windowIds(data, 0), (std::vector<int64_t>{1, 2, 9, 9}));
  EXPECT_EQ(windowIds(data, 0, true), (std::vector<int64_t>{1, 2, 9, -100}));
  EXPECT_EQ(windowIds(data, 1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(windowIds(data, 2), (std::vector<int64_t>{8, 10, 11, 9}));
  EXPECT_EQ(windowIds(data, 3, true), (std::vector<int64_t>{12, 9, -100, -100}));
  // Packed, the same documents share windows.
  PackedDataset packed(path, {4, 20, 9, 0});
  EXPECT_EQ(packed.streamTokens(), 13);
  EXPECT_EQ(windowIds(packed, 0), (std::vector<int64_t>{1, 2, 9, 4}));
  EXPECT_EQ(windowIds(packed, 2), (std::vector<int64_t>{10, 11, 9, 12}));
  EXPECT_EQ(packed.windows(), 3); // the last, 9 and padding, has nothing to predict
  EXPECT_NE(data.fingerprint(), packed.fingerprint());
}

TEST(Dataset, WithoutEosDocumentStartsAreMasked) {
  TempDir dir;
  std::string path = dir.write("d.jsonl", "[1, 2, 3]\n[4, 5]\n[6]\n");
  PackedDataset data(path, {4, 10, -1, 0});
  EXPECT_EQ(data.streamTokens(), 6);
  EXPECT_EQ(windowIds(data, 0), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(windowIds(data, 0, true), (std::vector<int64_t>{1, 2, 3, -100}));
  // Window 1 is 5, 6 and padding: 6 starts a document, so nothing to learn
  // there; it is not served.
  EXPECT_EQ(windowIds(data, 1, true), (std::vector<int64_t>{5, -100, -100, -100}));
  EXPECT_EQ(data.windows(), 1);
}

TEST(Dataset, JsonlLabelsMaskPositions) {
  TempDir dir;
  std::string path = dir.write("d.jsonl", "[7, 8]\n"
                                          "{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, 3]}\n");
  PackedDataset data(path, {6, 10, 0, 0});
  EXPECT_EQ(windowIds(data, 0), (std::vector<int64_t>{7, 8, 0, 1, 2, 3}));
  EXPECT_EQ(windowIds(data, 0, true), (std::vector<int64_t>{7, 8, 0, -100, -100, 3}));
}

TEST(Dataset, JsonlErrorsNameFileLineAndField) {
  TempDir dir;
  std::string bad = dir.write("bad.jsonl", "[1]\n[2]\n{\"input_ids\": [1,, 2]}\n");
  std::string e = errorOf([&] { PackedDataset d(bad, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, bad + ":3: JSON at byte 17")) << e;

  std::string big = dir.write("big.jsonl", "[1]\n\n{\"input_ids\": [1, 12, 2]}\n");
  e = errorOf([&] { PackedDataset d(big, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, big + ":3: input_ids[1]:")) << e;
  EXPECT_TRUE(contains(e, "vocabulary size is 10")) << e;
  EXPECT_TRUE(contains(e, "found 12")) << e;

  std::string neg = dir.write("neg.jsonl", "[1, -1]\n");
  e = errorOf([&] { PackedDataset d(neg, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, neg + ":1: [1]:")) << e;

  std::string lab = dir.write("lab.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n");
  e = errorOf([&] { PackedDataset d(lab, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, lab + ":1: labels: expected as many labels")) << e;

  std::string missing = dir.write("m.jsonl", "{\"ids\": [1]}\n");
  e = errorOf([&] { PackedDataset d(missing, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, missing + ":1: input_ids")) << e;

  std::string flt = dir.write("f.jsonl", "[1, 2.5]\n");
  e = errorOf([&] { PackedDataset d(flt, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "integer token id but found 2.5")) << e;

  std::string empty = dir.write("e.jsonl", "\n\n");
  e = errorOf([&] { PackedDataset d(empty, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "at least one token")) << e;

  e = errorOf([&] { PackedDataset d(dir.path + "/absent.jsonl", {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "absent.jsonl")) << e;
}

TEST(Dataset, BinaryMatchesJsonl) {
  TempDir dir;
  std::vector<std::vector<uint32_t>> docs = {{1, 2, 3}, {4, 5}, {}, {6, 7, 8, 9}};
  std::string jsonl = dir.write("d.jsonl", "[1, 2, 3]\n[4, 5]\n[]\n[6, 7, 8, 9]\n");
  for (uint32_t width : {2u, 4u}) {
    std::string bin = dir.write("d" + std::to_string(width) + ".bin", tokenFile(docs, width));
    for (int64_t eos : {-1, 0}) {
      DatasetOptions o{3, 10, eos, 5};
      PackedDataset a(jsonl, o), b(bin, o);
      EXPECT_EQ(b.documents(), 3);
      ASSERT_EQ(a.windows(), b.windows());
      Batch x = a.batch(3, 4), y = b.batch(3, 4);
      EXPECT_TRUE(torch::equal(x.ids, y.ids));
      EXPECT_TRUE(torch::equal(x.labels, y.labels));
    }
  }
}

TEST(Dataset, BinaryErrorsNameTheOffset) {
  TempDir dir;
  std::string bin = dir.write("v.bin", tokenFile({{1, 2}, {3, 10}}, 2));
  std::string e = errorOf([&] { PackedDataset d(bin, {4, 10, -1, 0}); });
  // Tokens: 1 2 M 3 10 -> the 10 is token 4 at byte 16 + 8.
  EXPECT_TRUE(contains(e, bin + ": token 4 at byte offset 24")) << e;
  EXPECT_TRUE(contains(e, "vocabulary size is 10) but found 10")) << e;

  std::string cut = tokenFile({{1, 2}}, 4);
  cut.pop_back();
  bin = dir.write("cut.bin", cut);
  e = errorOf([&] { PackedDataset d(bin, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "truncated")) << e;

  bin = dir.write("w.bin", tokenFile({{1}}, 3));
  e = errorOf([&] { PackedDataset d(bin, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "header.width")) << e;

  bin = dir.write("ver.bin", tokenFile({{1}}, 2, 2));
  e = errorOf([&] { PackedDataset d(bin, {4, 10, -1, 0}); });
  EXPECT_TRUE(contains(e, "header.version")) << e;
}

TEST(Dataset, BatchesAreAPureFunctionOfTheStep) {
  TempDir dir;
  std::string text;
  for (int d = 0; d < 40; ++d) {
    text += "[";
    for (int t = 0; t < 9; ++t)
      text += (t ? "," : "") + std::to_string((d * 9 + t) % 97 + 1);
    text += "]\n";
  }
  std::string path = dir.write("d.jsonl", text);
  DatasetOptions o{8, 100, 0, 42};
  PackedDataset a(path, o), b(path, o);
  ASSERT_EQ(a.windows(), 50); // 40 * 10 tokens / 8
  // Same step: same batch, across objects and call orders.
  Batch late = b.batch(30, 3);
  Batch early = b.batch(2, 3);
  EXPECT_TRUE(torch::equal(a.batch(2, 3).ids, early.ids));
  EXPECT_TRUE(torch::equal(a.batch(30, 3).ids, late.ids));
  EXPECT_TRUE(torch::equal(a.batch(30, 3).labels, late.labels));
  EXPECT_EQ(late.ids.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(late.ids.scalar_type(), torch::kLong);

  // Every epoch visits every window once, in a different order.
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t sample = 0; sample < 150; ++sample) {
    auto [epoch, w] = a.windowOfSample(sample);
    EXPECT_EQ(epoch, sample / 50);
    epochs[epoch].push_back(w);
  }
  for (const auto &order : epochs)
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 50u);
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);

  // A different seed shuffles differently.
  PackedDataset c(path, {8, 100, 0, 43});
  EXPECT_FALSE(torch::equal(a.batch(0, 8).ids, c.batch(0, 8).ids));
  EXPECT_NE(a.fingerprint(), c.fingerprint());
}

TEST(Dataset, ShuffleIsPinned) {
  // mt19937_64 is fully specified; so is our Fisher-Yates: the order must
  // never change, or resumed runs from older checkpoints would diverge.
  EXPECT_EQ(shuffledIndices(0, 1).size(), 0u);
  std::vector<int64_t> a = shuffledIndices(10, 7), b = shuffledIndices(10, 7);
  EXPECT_EQ(a, b);
  std::mt19937_64 rng(7);
  std::vector<int64_t> manual = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (int64_t i = 9; i > 0; --i)
    std::swap(manual[i], manual[rng() % static_cast<uint64_t>(i + 1)]);
  EXPECT_EQ(a, manual);
}

TEST(Dataset, RejectsBadOptions) {
  TempDir dir;
  std::string path = dir.write("d.jsonl", "[1, 2]\n");
  EXPECT_TRUE(contains(errorOf([&] { PackedDataset d(path, {1, 10, -1, 0}); }), "--seq-len"));
  EXPECT_TRUE(contains(errorOf([&] { PackedDataset d(path, {4, 10, 10, 0}); }), "--eos"));
}
