//===- IoTest.cpp - JSON, safetensors I/O, dequantization, checkpoints ----===//
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/Trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "runtime/tests/TempDir.h"

using namespace adapt::rt;

namespace {

using adapt::rt::testing::TempDir;

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

/// Runs \p fn, expecting a RuntimeError whose message contains every one of
/// \p parts; returns it.
template <typename Fn>
RuntimeError expectError(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const RuntimeError &e) {
    for (const std::string &part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << part;
    return e;
  }
  ADD_FAILURE() << "expected a RuntimeError";
  return RuntimeError("", "", "");
}

} // namespace

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

TEST(Json, ParsesEveryKindAndKeepsKeyOrder) {
  JsonValue v = parseJson(R"( {"z": 1, "a": [true, false, null], "m": -2.5e3,
      "s": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "big": 9223372036854775807,
      "huge": 92233720368547758070, "neg": -0} )");
  const JsonObject &o = v.asObject();
  ASSERT_EQ(o.size(), 7u);
  EXPECT_EQ(o[0].first, "z");
  EXPECT_EQ(o[1].first, "a");
  EXPECT_TRUE(v.find("z")->isInt());
  EXPECT_EQ(v.find("z")->asInt(), 1);
  EXPECT_TRUE(v.find("a")->asArray()[0].asBool());
  EXPECT_TRUE(v.find("a")->asArray()[2].isNull());
  EXPECT_EQ(v.find("m")->kind(), JsonValue::Kind::Double);
  EXPECT_DOUBLE_EQ(v.find("m")->asDouble(), -2500.0);
  EXPECT_EQ(v.find("s")->asString(),
            "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("big")->asInt(), INT64_MAX);
  EXPECT_EQ(v.find("huge")->kind(), JsonValue::Kind::Double);
  EXPECT_EQ(v.find("neg")->asInt(), 0);
  EXPECT_EQ(v.find("missing"), nullptr);
}

TEST(Json, RoundTripsThroughDump) {
  JsonValue v = JsonValue::object({{"b", 1}, {"a", JsonValue::array({1.5, "t\x01\n", nullptr})},
                                   {"e", JsonValue::object()}, {"d", 0.1}, {"i", 3.0}});
  std::string text = v.dump();
  EXPECT_EQ(text, R"({"b":1,"a":[1.5,"t\u0001\n",null],"e":{},"d":0.1,"i":3.0})");
  EXPECT_EQ(parseJson(text).dump(), text);
  EXPECT_EQ(parseJson(v.dump(2)).dump(), text);
  EXPECT_EQ(jsonNumber(NAN), "null");
  EXPECT_EQ(parseJson(jsonNumber(0.1 + 0.2)).asDouble(), 0.1 + 0.2);
  // Python's spelling of doubles (json.dumps writes these the same).
  EXPECT_EQ(jsonNumber(1e-4), "0.0001");
  EXPECT_EQ(jsonNumber(1e6), "1000000.0");
  EXPECT_EQ(jsonNumber(1e20), "1e+20");
  // Names and user text that are not UTF-8 still give valid JSON.
  EXPECT_EQ(jsonQuote("a\xff"), "\"a\xef\xbf\xbd\"");
}

TEST(Json, RejectsInvalidTextWithTheByteOffset) {
  struct Case {
    const char *text;
    size_t offset; ///< Of the byte where parsing stopped (0-based).
    const char *what;
  };
  const Case cases[] = {
      {"[1,]", 3, "unexpected ']'"},
      {"{\"a\":1,}", 7, "expected string literal"},
      {"01", 1, "expected end of input"},
      {"1.", 2, "expected digit after '.'"},
      {"-", 1, "expected digit after '-'"},
      {"NaN", 0, "invalid literal"},
      {"\"a\\x\"", 3, "after backslash"},
      {"\"\\ud800\"", 7, "must be followed by U+DC00..U+DFFF"},
      {"\"\\udc00\"", 6, "must follow U+D800..U+DBFF"},
      {"\"a\nb\"", 2, "control character"},
      {"\"\xff\"", 1, "ill-formed UTF-8"},
      {"[1] x", 4, "expected end of input"},
      {"", 0, "unexpected end of input"},
      {"// c\n1", 0, "invalid literal"},
      {"1e400", 4, "number overflow"},
  };
  for (const Case &c : cases) {
    try {
      parseJson(c.text, "f.json");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const RuntimeError &e) {
      std::string what = e.what();
      EXPECT_EQ(what.rfind("f.json: JSON at byte " + std::to_string(c.offset) + ": ", 0), 0u) << c.text << ": " << what;
      EXPECT_NE(what.find(c.what), std::string::npos) << what;
      EXPECT_EQ(what.find("last read"), std::string::npos) << what; // the input is not echoed
      EXPECT_EQ(e.exitCode, kExitBadInput);
    }
  }
  try {
    parseJson("{\"k\":1,\"k\":2}", "f.json");
    ADD_FAILURE() << "accepted a duplicate key";
  } catch (const RuntimeError &e) {
    EXPECT_STREQ(e.what(), "f.json: JSON key \"k\": expected each key once in an object but it appears twice");
  }
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_THROW(parseJson(deep), RuntimeError);
  std::string deepest(kMaxJsonDepth, '[');
  deepest += std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parseJson(deepest));
}

TEST(Json, DuplicateKeysInBigObjectsAreFound) {
  std::string text = "{";
  for (int i = 0; i < 100; ++i)
    text += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  text += "\"k42\":0}";
  EXPECT_THROW(parseJson(text), RuntimeError);
}

//===----------------------------------------------------------------------===//
// Safetensors
//===----------------------------------------------------------------------===//

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  torch::manual_seed(1);
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"bf16", torch::randn({3, 5}).to(torch::kBFloat16)},
      {"f16", torch::randn({4}).to(torch::kHalf)},
      {"f32", torch::randn({2, 3, 2})},
      {"f64", torch::randn({3}, torch::kDouble)},
      {"i64", torch::arange(-3, 4, torch::kLong)},
      {"i32", torch::arange(0, 7, torch::kInt).reshape({7, 1})},
      {"i16", torch::arange(-2, 3, torch::kShort)},
      {"i8", torch::arange(-2, 3, torch::kChar)},
      {"u8", torch::arange(250, 256, torch::kInt).to(torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"f8", torch::tensor({0.5f, -1.5f, 448.0f, 0.0f}).to(torch::kFloat8_e4m3fn)},
      {"scalar", torch::tensor(7.0f)},
      {"empty", torch::zeros({0, 4})},
      {"strided", torch::arange(12, torch::kFloat).reshape({3, 4}).t()},
  };
  std::string path = dir / "t.safetensors";
  writeSafetensors(path, tensors, {{"format", "pt"}});
  EXPECT_FALSE(pathExists(path + ".tmp"));
  std::string bytes = readFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);

  SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  ASSERT_EQ(file.metadata().size(), 1u);
  EXPECT_EQ(file.metadata()[0].second, "pt");
  const char *names[] = {"BF16", "F16", "F32", "F64", "I64", "I32", "I16",
                         "I8",   "U8",  "BOOL", "F8_E4M3", "F32", "F32", "F32"};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto &[name, expected] = tensors[i];
    EXPECT_EQ(file.tensors()[i].name, name);
    EXPECT_EQ(file.tensors()[i].dtype, names[i]) << name;
    torch::Tensor got = file.view(name);
    EXPECT_EQ(got.scalar_type(), expected.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), expected.sizes()) << name;
    if (expected.scalar_type() == torch::kFloat8_e4m3fn)
      EXPECT_TRUE(torch::equal(got.to(torch::kFloat), expected.to(torch::kFloat)));
    else
      EXPECT_TRUE(torch::equal(got, expected)) << name;
  }
  // Views keep the mapping alive after the file object is gone.
  torch::Tensor survivor = SafetensorsFile(path).view("f32");
  EXPECT_TRUE(torch::equal(survivor, tensors[2].second));
}

TEST(Safetensors, TruncatedFileNamesTheFileAndTensor) {
  TempDir dir;
  std::string path = dir / "cut.safetensors";
  writeSafetensors(path, {{"a", torch::ones({16})}, {"b", torch::ones({16})}});
  std::string bytes = readFile(path);
  writeFile(path, bytes.substr(0, bytes.size() - 10));
  expectError([&] { SafetensorsFile f(path); }, {path, "b", "truncated"});
  writeFile(path, bytes.substr(0, 5));
  expectError([&] { SafetensorsFile f(path); }, {path, "header length", "truncated"});
  writeFile(path, bytes.substr(0, 40));
  expectError([&] { SafetensorsFile f(path); }, {path, "header length"});
}

TEST(Safetensors, RejectsInconsistentHeaders) {
  TempDir dir;
  auto withHeader = [&](const std::string &json, size_t dataBytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    bytes += json + std::string(dataBytes, '\0');
    std::string path = dir / "h.safetensors";
    writeFile(path, bytes);
    return path;
  };
  std::string p = withHeader(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}})", 2);
  expectError([&] { SafetensorsFile f(p); }, {"w.dtype", "Q7"});
  p = withHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8);
  expectError([&] { SafetensorsFile f(p); }, {"w.data_offsets", "expected 8 bytes"});
  p = withHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  expectError([&] { SafetensorsFile f(p); }, {"overlap"});
  p = withHeader(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
  expectError([&] { SafetensorsFile f(p); }, {"w.shape"});
  p = withHeader(R"([1])", 0);
  expectError([&] { SafetensorsFile f(p); }, {"header", "object"});
}

TEST(Safetensors, ShardedCheckpointRoundTripsThroughTheReader) {
  TempDir dir;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (int i = 0; i < 5; ++i)
    tensors.emplace_back("layer." + std::to_string(i) + ".weight",
                         torch::full({10}, float(i)).to(torch::kBFloat16));
  // 20 bytes per tensor, 45 per shard: 2 + 2 + 1.
  auto files = writeShardedCheckpoint(dir.path, tensors, 45);
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  JsonValue index = readJsonFile(dir / "model.safetensors.index.json");
  EXPECT_EQ(index.find("metadata")->find("total_size")->asInt(), 100);
  EXPECT_EQ(index.find("weight_map")->find("layer.4.weight")->asString(),
            "model-00003-of-00003.safetensors");

  CheckpointReader reader(dir.path);
  std::vector<std::string> order = reader.namesInShardOrder();
  ASSERT_EQ(order.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(order[i], tensors[i].first);
    EXPECT_TRUE(reader.has(tensors[i].first));
    EXPECT_EQ(reader.encoding(tensors[i].first), TensorEncoding::Plain);
  }
  EXPECT_FALSE(reader.has("nope"));
  torch::Tensor t = reader.load("layer.3.weight", torch::kFloat);
  EXPECT_EQ(t.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(t, torch::full({10}, 3.0f)));
  int64_t calls = 0;
  auto all = reader.loadAll(order, torch::kBFloat16, [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, ++calls);
    EXPECT_EQ(total, 5);
  });
  EXPECT_EQ(all.size(), 5u);
  expectError([&] { reader.load("nope", torch::kFloat); }, {"nope", "absent"});

  ::unlink((dir / files[1]).c_str());
  expectError([&] { CheckpointReader r(dir.path); },
              {"model.safetensors.index.json", files[1], "missing"});
}

TEST(Safetensors, SingleFileCheckpoint) {
  TempDir dir;
  writeSafetensors(dir / "model.safetensors", {{"w", torch::ones({2, 2})}});
  CheckpointReader reader(dir.path);
  EXPECT_TRUE(reader.has("w"));
  EXPECT_EQ(reader.info("w").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(torch::equal(reader.load("w", torch::kFloat), torch::ones({2, 2})));
  TempDir empty;
  expectError([&] { CheckpointReader r(empty.path); }, {"model.safetensors"});
}

//===----------------------------------------------------------------------===//
// Dequantization
//===----------------------------------------------------------------------===//

TEST(Dequant, Fp8BlocksWithPartialEdgeBlocks) {
  TempDir dir;
  // A 3 x 5 weight in 2 x 2 blocks: scales [2, 3]; the last block row has
  // one row and the last block column one column.
  torch::Tensor w = torch::tensor({{1.0f, 2.0f, 0.5f, -1.0f, 4.0f},
                                   {-2.0f, 1.5f, 3.0f, 0.25f, -0.5f},
                                   {6.0f, -3.0f, 1.0f, 2.0f, 8.0f}});
  torch::Tensor s = torch::tensor({{2.0f, 10.0f, -1.0f}, {0.5f, 3.0f, 100.0f}});
  writeSafetensors(dir / "model.safetensors",
                   {{"proj.weight", w.to(torch::kFloat8_e4m3fn)},
                    {"proj.weight_scale_inv", s}});
  writeFile(dir / "config.json",
            R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 2]}})");
  CheckpointReader reader(dir.path);
  EXPECT_EQ(reader.encoding("proj.weight"), TensorEncoding::Fp8Block);
  torch::Tensor expected = torch::tensor({{2.0f, 4.0f, 5.0f, -10.0f, -4.0f},
                                          {-4.0f, 3.0f, 30.0f, 2.5f, 0.5f},
                                          {3.0f, -1.5f, 3.0f, 6.0f, 800.0f}});
  torch::Tensor got = reader.load("proj.weight", torch::kFloat);
  EXPECT_TRUE(torch::equal(got, expected)) << got;
  EXPECT_EQ(reader.load("proj.weight", torch::kBFloat16).scalar_type(), torch::kBFloat16);

  // Default 128 x 128 blocks: a 3 x 5 weight has one scale.
  reader.setFp8BlockSize(128, 128);
  expectError([&] { reader.load("proj.weight", torch::kFloat); },
              {"proj.weight_scale_inv", "expected shape [1, 1]"});
}

TEST(Dequant, Mxfp4HandComputed) {
  // One expert, 2 rows, 1 group of 16 bytes: 32 values per row.
  torch::Tensor blocks = torch::zeros({1, 2, 1, 16}, torch::kByte);
  torch::Tensor scales = torch::zeros({1, 2, 1}, torch::kByte);
  auto b = blocks.accessor<uint8_t, 4>();
  auto s = scales.accessor<uint8_t, 3>();
  b[0][0][0][0] = 0x21; // low 1 -> 0.5, high 2 -> 1.0
  b[0][0][0][15] = 0xf7; // low 7 -> 6, high 15 -> -6
  b[0][1][0][3] = 0x9c; // low 12 -> -2, high 9 -> -0.5
  s[0][0][0] = 128;      // x2
  s[0][1][0] = 125;      // x0.25
  torch::Tensor got = dequantizeMxfp4(blocks, scales, torch::kFloat, "f", "w");
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, 32, 2})); // [E, in, out]
  torch::Tensor expected = torch::zeros({1, 32, 2});
  expected[0][0][0] = 1.0f;   // 0.5 * 2
  expected[0][1][0] = 2.0f;   // 1.0 * 2
  expected[0][30][0] = 12.0f; // 6 * 2
  expected[0][31][0] = -12.0f;
  expected[0][6][1] = -0.5f;  // -2 * 0.25
  expected[0][7][1] = -0.125f; // -0.5 * 0.25
  EXPECT_TRUE(torch::equal(got, expected)) << got;
  EXPECT_TRUE(torch::equal(dequantizeMxfp4(blocks, scales, torch::kBFloat16, "f", "w"),
                           expected.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(dequantizeMxfp4(blocks, scales, torch::kDouble, "f", "w"),
                           expected.to(torch::kDouble)));
  expectError([&] { dequantizeMxfp4(blocks, scales.squeeze(0), torch::kFloat, "f", "w"); },
              {"w_scales", "expected shape [1, 2, 1]"});
}

TEST(Dequant, Mxfp4MatchesTransformers) {
  // Fixture made by runtime/tests/data/make_mxfp4_fixture.py from
  // transformers' convert_moe_packed_tensors.
  std::string fixture = std::string(ADAPT_SOURCE_DIR) +
                        "/runtime/tests/data/mxfp4_transformers.safetensors";
  SafetensorsFile file(fixture);
  torch::Tensor expected = file.view("expected");
  TempDir dir;
  writeSafetensors(dir / "model.safetensors",
                   {{"experts.gate_up_proj_blocks", file.view("experts.gate_up_proj_blocks")},
                    {"experts.gate_up_proj_scales", file.view("experts.gate_up_proj_scales")}});
  CheckpointReader reader(dir.path);
  ASSERT_TRUE(reader.has("experts.gate_up_proj"));
  EXPECT_EQ(reader.encoding("experts.gate_up_proj"), TensorEncoding::Mxfp4);
  TensorInfo info = reader.info("experts.gate_up_proj");
  EXPECT_EQ(info.dtype, "MXFP4");
  EXPECT_EQ(c10::IntArrayRef(info.shape), expected.sizes());
  torch::Tensor got = reader.load("experts.gate_up_proj", torch::kBFloat16);
  EXPECT_TRUE(torch::equal(got, expected));
  EXPECT_TRUE(torch::equal(reader.load("experts.gate_up_proj", torch::kFloat),
                           expected.to(torch::kFloat)));
}

//===----------------------------------------------------------------------===//
// Atomic writes
//===----------------------------------------------------------------------===//

TEST(AtomicWrite, FullDiskLeavesTheOldFileIntact) {
  TempDir dir;
  std::string path = dir / "adapter.safetensors";
  writeSafetensors(path, {{"w", torch::ones({4})}});
  std::string before = readFile(path);
  for (int64_t budget : {0, 5, 100}) {
    failWritesAfterForTesting(budget);
    RuntimeError e = expectError(
        [&] { writeSafetensors(path, {{"w", torch::zeros({64})}}); },
        {path, "No space left on device"});
    failWritesAfterForTesting(-1);
    EXPECT_EQ(e.exitCode, kExitWriteFailed);
    EXPECT_EQ(readFile(path), before);
    EXPECT_FALSE(pathExists(path + ".tmp"));
  }
  failWritesAfterForTesting(3);
  expectError([&] { writeFileAtomic(dir / "state.json", "{\"step\": 1}"); },
              {"state.json", "write"});
  failWritesAfterForTesting(-1);
  EXPECT_FALSE(pathExists(dir / "state.json"));
  EXPECT_FALSE(pathExists(dir / "state.json.tmp"));
  writeFileAtomic(dir / "state.json", "{}");
  EXPECT_EQ(readFile(dir / "state.json"), "{}");
}

TEST(AtomicWrite, ReadOnlyFolderLeavesTheOldFileIntact) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root ignores folder permissions";
  TempDir dir;
  std::string path = dir / "a.safetensors";
  writeSafetensors(path, {{"w", torch::ones({4})}});
  std::string before = readFile(path);
  ::chmod(dir.path.c_str(), 0500);
  RuntimeError e = expectError([&] { writeSafetensors(path, {{"w", torch::zeros({4})}}); },
                               {path});
  EXPECT_EQ(e.exitCode, kExitWriteFailed);
  ::chmod(dir.path.c_str(), 0700);
  EXPECT_EQ(readFile(path), before);
}

TEST(AtomicWrite, MissingFolderIsAWriteError) {
  RuntimeError e = expectError(
      [&] { writeFileAtomic("/nonexistent-adapt-dir/x.json", "{}"); },
      {"/nonexistent-adapt-dir/x.json"});
  EXPECT_EQ(e.exitCode, kExitWriteFailed);
}

//===----------------------------------------------------------------------===//
// Trainer pieces that need no model
//===----------------------------------------------------------------------===//

TEST(Trainer, LearningRateWarmsUpThenDecaysToZero) {
  TrainOptions o;
  o.lr = 1.0;
  o.warmup = 4;
  o.steps = 14;
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.25);
  EXPECT_DOUBLE_EQ(learningRate(o, 3), 1.0);
  EXPECT_DOUBLE_EQ(learningRate(o, 4), 1.0);  // cosine starts at the peak
  EXPECT_NEAR(learningRate(o, 9), 0.5, 1e-12); // half way through the decay
  EXPECT_GT(learningRate(o, 13), 0.0);         // the last step still learns
  EXPECT_DOUBLE_EQ(learningRate(o, 14), 0.0);
  o.warmup = 0;
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 1.0);
}

TEST(Trainer, RecoversTheCheckpointFolderAfterACrash) {
  TempDir out;
  auto make = [&](const std::string &name, const std::string &marker) {
    createDirectories(out / name);
    writeFile(out / (name + "/trainer_state.json"), marker);
  };
  // Crash between "checkpoint -> checkpoint.old" and "tmp -> checkpoint".
  make("checkpoint.old", "old");
  make("checkpoint.tmp", "new, maybe incomplete");
  recoverCheckpointFolder(out.path);
  EXPECT_EQ(readFile(out / "checkpoint/trainer_state.json"), "old");
  EXPECT_FALSE(pathExists(out / "checkpoint.old"));
  EXPECT_FALSE(pathExists(out / "checkpoint.tmp"));
  EXPECT_TRUE(Trainer::hasCheckpoint(out.path));
  // Crash after the new one was in place, before the old one was removed.
  make("checkpoint.old", "older");
  recoverCheckpointFolder(out.path);
  EXPECT_EQ(readFile(out / "checkpoint/trainer_state.json"), "old");
  EXPECT_FALSE(pathExists(out / "checkpoint.old"));
}

TEST(FileSystem, PathsFoldersAndCopies) {
  EXPECT_EQ(parentPath("a/b/c"), "a/b");
  EXPECT_EQ(parentPath("a/b/"), "a");
  EXPECT_EQ(parentPath("c"), ".");
  EXPECT_EQ(parentPath("/c"), "/");
  EXPECT_EQ(joinPath("a/", "b"), "a/b");
  EXPECT_EQ(joinPath("", "b"), "b");
  EXPECT_EQ(absolutePath("/x/y"), "/x/y");
  EXPECT_EQ(absolutePath("./rel").front(), '/');
  TempDir dir;
  createDirectories(dir / "x/y/z");
  EXPECT_TRUE(isDirectory(dir / "x/y/z"));
  writeFile(dir / "x/y/f.txt", "hello");
  copyFileAtomic(dir / "x/y/f.txt", dir / "x/g.txt");
  EXPECT_EQ(readFile(dir / "x/g.txt"), "hello");
  EXPECT_EQ(listDirectory(dir / "x"), (std::vector<std::string>{"g.txt", "y"}));
  EXPECT_EQ(canonicalPath(dir / "x/y/../g.txt"), canonicalPath(dir / "x/g.txt"));
  EXPECT_TRUE(removeAll(dir / "x"));
  EXPECT_FALSE(pathExists(dir / "x"));
  EXPECT_TRUE(removeAll(dir / "never-existed"));
  writeFile(dir / "file", "");
  RuntimeError e = expectError([&] { createDirectories(dir / "file/sub"); },
                              {dir / "file", "expected a folder"});
  EXPECT_EQ(e.exitCode, kExitWriteFailed);
}
