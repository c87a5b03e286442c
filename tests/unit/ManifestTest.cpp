//===- ManifestTest.cpp - tests for the safetensors index reader ----------===//
//
// The first tests read the four real indexes under shared/models, whose
// quirks (key order, 0- or 1-based shard numbers, extra metadata, one-line
// JSON) are what the reader must cope with. The rest feed hand-written JSON
// for each rejection, and one synthesizes a 250,000-tensor index to keep the
// streaming parser honest about speed.
//
// The models directory is $ADAPT_SHARED_MODELS, or ../shared/models next to
// the repository root given by the ADAPT_SOURCE_DIR compile definition.
//
//===----------------------------------------------------------------------===//
#include "parser/Manifest.h"
#include "tests/unit/SharedModels.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

using namespace adapt;

namespace {

/// Reads the shared \p model's index into \p r (a Result<Manifest>), its path
/// into \p path; skips the test when the shared models are not there, fails
/// it when the index does not read.
#define READ_INDEX_OR_SKIP(r, path, model)                                     \
  std::string path = sharedModelsDir() + "/" model "/model.safetensors.index.json"; \
  if (!std::filesystem::exists(path))                                          \
    GTEST_SKIP() << path << " not found; set ADAPT_SHARED_MODELS";             \
  Result<Manifest> r = readManifest(path);                                     \
  ASSERT_TRUE(r.ok()) << r.error().message()

/// Parses \p json expecting failure; returns the message.
std::string errorOf(const std::string &json) {
  Result<Manifest> r = parseManifest(json, "index.json");
  EXPECT_FALSE(r.ok()) << json;
  if (r.ok())
    return "";
  std::string msg = r.error().message();
  EXPECT_EQ(msg.rfind("index.json: ", 0), 0u) << msg;
  return msg;
}

/// Whether \p haystack contains \p needle (for readable assertions).
bool has(const std::string &haystack, const std::string &needle) {
  return haystack.find(needle) != std::string::npos;
}

/// Each (index JSON, message part) of \p cases: parsing the JSON fails with
/// an error containing the part.
void expectErrors(const std::vector<std::pair<std::string, std::string>> &cases) {
  for (const auto &[json, part] : cases) {
    const std::string message = errorOf(json);
    EXPECT_TRUE(has(message, part)) << json << " -> " << message << "\n(expected: " << part << ")";
  }
}

/// The counts every real-index test checks.
struct IndexCounts {
  size_t tensors, shards;
  int shardNumberBase;
  int64_t declaredShardCount;
  uint64_t totalSize;
};

/// Expects manifest \p m to have the counts \p expected.
void expectCounts(const Manifest &m, const IndexCounts &expected) {
  EXPECT_EQ(m.tensors.size(), expected.tensors);
  EXPECT_EQ(m.shards.size(), expected.shards);
  EXPECT_EQ(m.shardNumberBase, expected.shardNumberBase);
  EXPECT_EQ(m.declaredShardCount, expected.declaredShardCount);
  EXPECT_EQ(m.totalSize, expected.totalSize);
}

TEST(ManifestReal, MiniMaxM1WeightMapFirstZeroBased) {
  READ_INDEX_OR_SKIP(r, path, "MiniMax-M1");
  EXPECT_EQ(r->file, path);
  expectCounts(*r, {8243, 413, 0, 413, 912210767872});
  EXPECT_TRUE(r->hasTotalSize);
  EXPECT_TRUE(r->metadata.empty());
  EXPECT_EQ(r->tensors.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(r->tensors.front().second, "model-00000-of-00413.safetensors");
  EXPECT_EQ(r->tensors.back().first,
            "model.layers.79.block_sparse_moe.experts.31.w2.weight");
  EXPECT_EQ(r->shards.front(), "model-00000-of-00413.safetensors");
  EXPECT_EQ(r->shards.back(), "model-00412-of-00413.safetensors");
}

TEST(ManifestReal, Qwen35ExtraMetadata) {
  READ_INDEX_OR_SKIP(r, path, "Qwen3.5-25B-REAP-A3B");
  expectCounts(*r, {22213, 10, 1, 10, 50182743296});
  using Field = std::pair<std::string, std::string>;
  EXPECT_EQ(r->metadata, (std::vector<Field>{
                             {"total_parameters", "25091371648"},
                             {"total_shards", "10"}}));
  EXPECT_EQ(r->tensors.front(),
            Field("lm_head.weight", "model-00001-of-00010.safetensors"));
}

TEST(ManifestReal, WizardLMOneBased) {
  READ_INDEX_OR_SKIP(r, path, "WizardLM-2-8x22B");
  expectCounts(*r, {1739, 59, 1, 59, 281241268224});
  EXPECT_EQ(r->tensors.front().second, "model-00059-of-00059.safetensors");
}

TEST(ManifestReal, GptOss20bOneLineZeroBased) {
  READ_INDEX_OR_SKIP(r, path, "gpt-oss-20b");
  // Numbered 00000..00002 "of 00002": three files, the count is the last.
  expectCounts(*r, {459, 3, 0, 2, 13761264768});
  EXPECT_EQ(r->tensors.front().first, "model.layers.0.input_layernorm.weight");
}

TEST(ManifestParse, KeyOrderAndLayoutDoNotMatter) {
  const std::string a =
      "{\"metadata\":{\"total_size\":10},\"weight_map\":{\"x\":"
      "\"model-00001-of-00002.safetensors\",\"y\":"
      "\"model-00002-of-00002.safetensors\"}}";
  const std::string b = "{\n  \"weight_map\": {\n    \"x\": "
                        "\"model-00001-of-00002.safetensors\",\n    \"y\": "
                        "\"model-00002-of-00002.safetensors\"\n  },\n  "
                        "\"metadata\": {\n    \"total_size\": 10\n  }\n}\n";
  Result<Manifest> ra = parseManifest(a, "a.json");
  Result<Manifest> rb = parseManifest(b, "b.json");
  ASSERT_TRUE(ra.ok()) << ra.error().message();
  ASSERT_TRUE(rb.ok()) << rb.error().message();
  EXPECT_EQ(ra->tensors, rb->tensors);
  EXPECT_EQ(ra->shards, rb->shards);
  EXPECT_EQ(ra->totalSize, 10u);
  EXPECT_EQ(rb->totalSize, 10u);
  EXPECT_EQ(ra->shardNumberBase, 1);
  EXPECT_EQ(ra->declaredShardCount, 2);
}

TEST(ManifestParse, MetadataIsOptionalAndExtraFieldsAreKeptAsJson) {
  Result<Manifest> r =
      parseManifest("{\"weight_map\":{\"w\":\"model.safetensors\"}}", "i");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_FALSE(r->hasTotalSize);
  EXPECT_EQ(r->shardNumberBase, -1);
  EXPECT_EQ(r->declaredShardCount, 0);
  EXPECT_EQ(r->shards, std::vector<std::string>{"model.safetensors"});

  r = parseManifest("{\"metadata\":{\"format\":\"pt\",\"nested\":{\"a\": "
                    "[1, 2.5, true, null], \"b\": {}},\"total_size\":1.5e3},"
                    "\"other\":{\"x\":[[]]},\"weight_map\":{\"w\":\"m."
                    "safetensors\"}}",
                    "i");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->hasTotalSize);
  EXPECT_EQ(r->totalSize, 1500u);
  using Field = std::pair<std::string, std::string>;
  const std::string nested = "{\"a\":[1,2.5,true,null],\"b\":{}}";
  EXPECT_EQ(r->metadata, (std::vector<Field>{{"format", "\"pt\""},
                                             {"nested", nested}}));
  r = parseManifest("{\"metadata\":null,\"weight_map\":{}}", "i");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->tensors.empty());
}

TEST(ManifestParse, RejectsInvalidJsonWithPosition) {
  std::string msg = errorOf("{\"weight_map\": {\"a\": \"b\",}}");
  EXPECT_TRUE(has(msg, "JSON: expected valid JSON but byte 26")) << msg;
  EXPECT_TRUE(has(msg, "line 1, column 26")) << msg;
  msg = errorOf("{\n\"weight_map\": {\n\"a\": \"b\"");
  EXPECT_TRUE(has(msg, "line 3")) << msg;
  msg = errorOf("");
  EXPECT_TRUE(has(msg, "expected valid JSON")) << msg;
  msg = errorOf("{\"weight_map\":{}} trailing");
  EXPECT_TRUE(has(msg, "expected valid JSON")) << msg;
}

TEST(ManifestParse, RejectsMissingOrMistypedWeightMap) {
  expectErrors({
      {"{\"metadata\":{}}",
       "weight_map: expected an object mapping tensor names to shard files but the key is missing"},
      {"{\"weight_map\":[]}",
       "weight_map: expected an object mapping tensor names to shard files but found an array"},
      {"{\"weight_map\":\"x\"}",
       "weight_map: expected"},
      {"{\"weight_map\":{},\"weight_map\":{}}",
       "weight_map: expected the key once"},
      {"[{\"weight_map\":{}}]",
       "JSON: expected a JSON object but found an array"},
      {"{\"metadata\":[],\"weight_map\":{}}",
       "metadata: expected an object"},
  });
}

TEST(ManifestParse, RejectsBadEntries) {
  expectErrors({
      {"{\"weight_map\":{\"w\":3}}",
       "weight_map.w: expected a shard file name string but found the number 3"},
      {"{\"weight_map\":{\"w\":null}}",
       "weight_map.w: expected a shard file name string"},
      {"{\"weight_map\":{\"w\":[\"a\"]}}",
       "weight_map.w: expected a shard file name string but found an array"},
      {"{\"weight_map\":{\"\":\"a.safetensors\"}}",
       "weight_map: expected non-empty tensor names"},
      {"{\"weight_map\":{\"w\":\"a.safetensors\",\"w\":\"a.safetensors\"}}",
       "weight_map.w: expected each tensor once"},
      {"{\"weight_map\":{\"w\":\"\"}}",
       "weight_map.w: expected a shard file name but found an empty string"},
      {"{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}",
       "metadata.total_size: expected a non-negative integer"},
      {"{\"metadata\":{\"total_size\":\"12\"},\"weight_map\":{}}",
       "metadata.total_size: expected a non-negative integer"},
  });
}

TEST(ManifestParse, RejectsShardNamesThatAreNotPlainFiles) {
  expectErrors({
      {"{\"weight_map\":{\"w\":\"../x.safetensors\"}}",
       "weight_map.w: expected a plain file name but \"../x.safetensors\" contains a path separator"},
      {"{\"weight_map\":{\"w\":\"sub\\\\x.safetensors\"}}",
       "contains a path separator"},
      {"{\"weight_map\":{\"w\":\"..\"}}",
       "contains \"..\""},
      {"{\"weight_map\":{\"v\":\"ok.safetensors\",\"w\":\"/etc/passwd\"}}",
       "weight_map.w: expected a plain file name"},
  });
}

TEST(ManifestParse, RejectsInconsistentShardNumbering) {
  std::string msg =
      errorOf("{\"weight_map\":{\"a\":\"model-00001-of-00413.safetensors\","
              "\"b\":\"model-00002-of-00059.safetensors\"}}");
  EXPECT_TRUE(has(msg, "shard names: expected numbered shards to agree on one "
                       "prefix and count"))
      << msg;
  EXPECT_TRUE(has(msg, "model-00001-of-00413.safetensors")) << msg;
  msg = errorOf("{\"weight_map\":{\"a\":\"model-00001-of-00003.safetensors\","
                "\"b\":\"model-00004-of-00003.safetensors\"}}");
  EXPECT_TRUE(has(msg, "shard names: expected shard numbers from 1 to 3 but "
                       "\"model-00004-of-00003.safetensors\" is outside"))
      << msg;
  msg = errorOf(
      "{\"weight_map\":{\"a\":\"model-00000-of-00000.safetensors\"}}");
  EXPECT_TRUE(has(msg, "expected a shard count of at least 1")) << msg;
  msg = errorOf("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                "\"b\":\"other-00002-of-00002.safetensors\"}}");
  EXPECT_TRUE(has(msg, "agree on one prefix and count")) << msg;
}

TEST(ManifestParse, DeepMetadataIsRejectedNotRecursed) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_TRUE(has(errorOf("{\"metadata\":{\"x\":" + deep +
                          "},\"weight_map\":{}}"),
                  "metadata.x: expected at most 64 levels of nesting"));
  EXPECT_TRUE(has(errorOf("{\"junk\":" + deep + ",\"weight_map\":{}}"),
                  "expected at most 64 levels of nesting"));
}

TEST(ManifestFile, MissingFileAndDirectory) {
  Result<Manifest> r =
      readManifest("/nonexistent/model.safetensors.index.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, "/nonexistent/model.safetensors.index.json");
  r = readManifest(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.error().message(), "expected a regular file"));
}

TEST(ManifestFromShard, SingleFileCheckpoint) {
  ShardHeader shard;
  shard.file = "/models/tiny/model.safetensors";
  shard.tensors = {{"b", "F32", {2}, 0, 8}, {"a", "BF16", {3}, 8, 14}};
  Result<Manifest> r = manifestFromShard(shard);
  ASSERT_TRUE(r.ok()) << r.error().message();
  using Field = std::pair<std::string, std::string>;
  EXPECT_EQ(r->tensors, (std::vector<Field>{{"b", "model.safetensors"},
                                            {"a", "model.safetensors"}}));
  EXPECT_EQ(r->shards, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(r->hasTotalSize);
  EXPECT_EQ(r->totalSize, 14u);
  EXPECT_EQ(r->shardNumberBase, -1);

  shard.file = "model-00001-of-00001.safetensors";
  r = manifestFromShard(shard);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->shardNumberBase, 1);
  EXPECT_EQ(r->declaredShardCount, 1);

  shard.tensors.push_back({"", "U8", {0}, 14, 14});
  r = manifestFromShard(shard);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has(r.error().message(), "expected non-empty tensor names"));
}

TEST(ManifestSpeed, QuarterMillionTensors) {
  constexpr int kTensors = 250000, kShards = 500;
  std::string json = "{\n  \"metadata\": {\n    \"total_size\": 1\n  },\n"
                     "  \"weight_map\": {\n";
  for (int i = 0; i < kTensors; ++i) {
    char shard[64];
    std::snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors",
                  i / (kTensors / kShards) + 1, kShards);
    json += "    \"model.layers." + std::to_string(i / 771) +
            ".mlp.experts." + std::to_string(i % 771) +
            ".down_proj.weight\": \"" + shard + "\"" +
            (i + 1 < kTensors ? ",\n" : "\n");
  }
  json += "  }\n}\n";
  auto start = std::chrono::steady_clock::now();
  Result<Manifest> r = parseManifest(json, "synthetic.json");
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(r->shards.size(), static_cast<size_t>(kShards));
  EXPECT_EQ(r->declaredShardCount, kShards);
  std::cout << "parsed " << json.size() << " bytes, " << kTensors
            << " tensors in " << seconds << " s\n";
  // Generous so that unoptimised and sanitizer builds pass; -O2 is ~0.1 s.
  EXPECT_LT(seconds, 5.0);
}

} // namespace
