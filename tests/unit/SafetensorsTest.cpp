//===- SafetensorsTest.cpp - tests for the safetensors header reader ------===//
//
// Every test writes real shard files into a fresh temporary directory, laid
// out byte by byte as the format prescribes (8-byte little-endian header
// length, header JSON, tensor bytes), then reads them back through
// readSafetensorsHeader. Error tests assert that the message names the file
// and the field, since that is what a user sees.
//
//===----------------------------------------------------------------------===//
#include "parser/Safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

using namespace adapt;

namespace {

/// The 8 bytes of \p n in little-endian order.
std::string lengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

/// A complete safetensors file: length, \p header, \p dataBytes zero bytes.
std::string shardBytes(const std::string &header, uint64_t dataBytes) {
  return lengthPrefix(header.size()) + header +
         std::string(static_cast<size_t>(dataBytes), '\0');
}

/// One tensor entry of a header, as JSON text.
std::string entry(const std::string &name, const std::string &dtype,
                  const std::string &shape, uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," +
         std::to_string(end) + "]}";
}

/// Gives each test its own directory for the shard files it writes.
class SafetensorsTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::random_device random;
    dir = std::filesystem::temp_directory_path() /
          ("adapt-safetensors-test-" + std::to_string(random()));
    std::filesystem::create_directories(dir);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  /// Writes \p bytes to \p name in the test directory; returns its path.
  std::string write(const std::string &name, const std::string &bytes) {
    std::string path = (dir / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  /// Writes a shard with \p header and \p dataBytes of data, then reads it.
  Result<ShardHeader> roundTrip(const std::string &header, uint64_t dataBytes,
                                const std::string &name = "model.safetensors") {
    return readSafetensorsHeader(write(name, shardBytes(header, dataBytes)));
  }

  /// Reads a shard expected to be rejected; returns the error message after
  /// checking that it starts with the file's path.
  std::string errorOf(const std::string &header, uint64_t dataBytes) {
    Result<ShardHeader> r = roundTrip(header, dataBytes);
    EXPECT_FALSE(r.ok()) << header;
    if (r.ok())
      return "";
    std::string msg = r.error().message();
    EXPECT_EQ(msg.rfind((dir / "model.safetensors").string() + ": ", 0), 0u)
        << msg;
    return msg;
  }

  /// Expects \p header (with \p dataBytes of data) to be refused with a
  /// message containing \p needle.
  void expectRefused(const std::string &header, uint64_t dataBytes, const std::string &needle) {
    std::string msg = errorOf(header, dataBytes);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }

  std::filesystem::path dir;
};

TEST(SafetensorsDtype, BitsOfEveryFormatDtype) {
  const std::pair<int64_t, std::vector<const char *>> byWidth[] = {
      {4, {"F4"}},
      {6, {"F6_E2M3", "F6_E3M2"}},
      {8, {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}},
      {16, {"I16", "U16", "F16", "BF16"}},
      {32, {"I32", "U32", "F32"}},
      {64, {"I64", "U64", "F64", "C64"}}};
  for (const auto &[bits, names] : byWidth)
    for (const char *name : names)
      EXPECT_EQ(safetensorsDtypeBits(name), bits) << name;
  EXPECT_EQ(safetensorsDtypeBits("bf16"), -1);
  EXPECT_EQ(safetensorsDtypeBits(""), -1);
  EXPECT_EQ(safetensorsDtypeBits("F8"), -1);
}

TEST_F(SafetensorsTest, ReadsEveryDtypeInFileOrder) {
  struct Case {
    const char *dtype;
    const char *shape;
    std::vector<int64_t> dims;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"BF16", "[2,3]", {2, 3}, 12},      {"F8_E4M3", "[4,4]", {4, 4}, 16},
      {"U8", "[5]", {5}, 5},              {"F4", "[2,3]", {2, 3}, 3},
      {"F6_E2M3", "[4]", {4}, 3},         {"F6_E3M2", "[8]", {8}, 6},
      {"F8_E5M2", "[3]", {3}, 3},         {"F8_E8M0", "[2]", {2}, 2},
      {"F8_E4M3FNUZ", "[1]", {1}, 1},     {"F8_E5M2FNUZ", "[1]", {1}, 1},
      {"BOOL", "[3]", {3}, 3},            {"I8", "[2]", {2}, 2},
      {"I16", "[2]", {2}, 4},             {"U16", "[1]", {1}, 2},
      {"F16", "[3]", {3}, 6},             {"I32", "[1]", {1}, 4},
      {"U32", "[2]", {2}, 8},             {"F32", "[2,2]", {2, 2}, 16},
      {"I64", "[1]", {1}, 8},             {"U64", "[1]", {1}, 8},
      {"F64", "[1]", {1}, 8},             {"C64", "[2]", {2}, 16},
      {"F32", "[]", {}, 4},               {"BF16", "[0,7]", {0, 7}, 0}};
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"}";
  uint64_t offset = 0;
  int i = 0;
  for (const Case &c : cases) {
    header += "," + entry("t" + std::to_string(i++), c.dtype, c.shape, offset,
                          offset + c.bytes);
    offset += c.bytes;
  }
  header += "}";
  header += std::string((8 - header.size() % 8) % 8, ' '); // As writers pad.

  Result<ShardHeader> r = roundTrip(header, offset);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->headerBytes, header.size());
  EXPECT_EQ(r->fileSize, 8 + header.size() + offset);
  ASSERT_EQ(r->metadata.size(), 2u);
  EXPECT_EQ(r->metadata[0], (std::pair<std::string, std::string>("format",
                                                                 "pt")));
  ASSERT_EQ(r->tensors.size(), std::size(cases));
  offset = 0;
  for (size_t k = 0; k < std::size(cases); ++k) {
    const TensorHeader &t = r->tensors[k];
    EXPECT_EQ(t.name, "t" + std::to_string(k));
    EXPECT_EQ(t.dtype, cases[k].dtype);
    EXPECT_EQ(t.shape, cases[k].dims);
    EXPECT_EQ(t.begin, offset);
    EXPECT_EQ(t.end, offset + cases[k].bytes);
    offset += cases[k].bytes;
  }
}

TEST_F(SafetensorsTest, AcceptsUnorderedOffsetsExtraFieldsAndNullMetadata) {
  std::string header =
      "{\"b\":{\"shape\":[2],\"data_offsets\":[4,8],\"dtype\":\"BF16\","
      "\"note\":{\"deep\":[1,[2,{}]]}}," +
      entry("a", "U8", "[4]", 0, 4) + ",\"__metadata__\":null}";
  Result<ShardHeader> r = roundTrip(header, 16);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "b");
  EXPECT_EQ(r->tensors[1].name, "a");
  EXPECT_TRUE(r->metadata.empty());
}

TEST_F(SafetensorsTest, EmptyHeaderObjectHasNoTensors) {
  Result<ShardHeader> r = roundTrip("{}", 0);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->tensors.empty());
}

TEST_F(SafetensorsTest, BytesAndFileReadersAgree) {
  std::string bytes =
      shardBytes("{" + entry("w", "F8_E4M3", "[3,5]", 0, 15) + "}", 15);
  Result<ShardHeader> fromBytes = parseSafetensorsBytes(bytes, "mem");
  Result<ShardHeader> fromFile =
      readSafetensorsHeader(write("model.safetensors", bytes));
  ASSERT_TRUE(fromBytes.ok()) << fromBytes.error().message();
  ASSERT_TRUE(fromFile.ok()) << fromFile.error().message();
  EXPECT_EQ(fromBytes->tensors[0].shape, fromFile->tensors[0].shape);
  EXPECT_EQ(fromBytes->fileSize, fromFile->fileSize);
  EXPECT_EQ(fromBytes->file, "mem");
}

TEST_F(SafetensorsTest, RejectsFileShorterThanLength) {
  std::string path = write("model.safetensors", std::string("\x05\0\0", 3));
  Result<ShardHeader> r = readSafetensorsHeader(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, path);
  EXPECT_EQ(r.error().field, "header length");
  EXPECT_NE(r.error().message().find("at least 8 bytes"), std::string::npos);
  EXPECT_NE(r.error().message().find("has 3 bytes"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEndOfFile) {
  std::string path =
      write("model-00001.safetensors", lengthPrefix(99999) + "{}" +
                                           std::string(30, '\0'));
  Result<ShardHeader> r = readSafetensorsHeader(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(),
            path + ": header length: expected at most 32 bytes (file size 40 "
                   "minus the 8-byte length) but the first 8 bytes say 99999");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthOverCap) {
  std::string path = write("model.safetensors",
                           lengthPrefix(~0ull) + std::string(16, ' '));
  Result<ShardHeader> r = readSafetensorsHeader(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("header length: expected at most "
                                     "100000000 bytes"),
            std::string::npos)
      << r.error().message();
}

TEST_F(SafetensorsTest, RejectsTruncatedHeaderJson) {
  expectRefused("{\"w\":{\"dtype\":\"F3", 0, "header JSON: expected valid JSON");
}

TEST_F(SafetensorsTest, RejectsNonObjectHeader) {
  expectRefused("[1,2]", 0, ": header: expected a JSON object but found an array");
  expectRefused("\"just a string\"", 0, "expected a JSON object");
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  std::string msg = errorOf("{" + entry("w", "F5", "[1]", 0, 1) + "}", 1);
  EXPECT_NE(msg.find("w.dtype: expected one of BOOL, F4,"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("but found \"F5\""), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfRange) {
  expectRefused("{" + entry("w", "F32", "[4]", 8, 24) + "}", 16, "w.data_offsets: expected end <= 16");
}

TEST_F(SafetensorsTest, RejectsOverlappingRanges) {
  std::string header = "{" + entry("a", "F32", "[2]", 0, 8) + "," +
                       entry("b", "F32", "[2]", 4, 12) + "}";
  expectRefused(header, 12,
                "b.data_offsets: expected no overlap but [4, 12] "
                "overlaps a at [0, 8]");
  // A range nested inside an earlier, longer one overlaps too.
  header = "{" + entry("big", "U8", "[16]", 0, 16) + "," +
           entry("mid", "U8", "[2]", 2, 4) + "," +
           entry("in", "U8", "[2]", 8, 10) + "}";
  expectRefused(header, 16, "overlaps big");
}

TEST_F(SafetensorsTest, RejectsSizeMismatch) {
  expectRefused("{" + entry("w", "BF16", "[2,2]", 0, 6) + "}", 8,
                "w.data_offsets: expected 8 bytes for [2, 2] of BF16 "
                "but [0, 6] holds 6");
}

TEST_F(SafetensorsTest, RejectsSubByteDtypeWithPartialByte) {
  expectRefused("{" + entry("w", "F4", "[3]", 0, 2) + "}", 2,
                "w.shape: expected a whole number of bytes but [3] of "
                "F4 is 12 bits");
}

TEST_F(SafetensorsTest, RejectsShapeOverflow) {
  expectRefused("{" + entry("w", "U8", "[4294967296,4294967296,16]", 0, 0) + "}", 0,
                "w.shape: expected an element count that fits in 64 "
                "bits");
  expectRefused("{" + entry("w", "F64", "[4611686018427387904]", 0, 0) + "}",
                0, "w.shape: expected a size that fits in 64 bits");
  expectRefused("{" + entry("w", "U8", "[18446744073709551615]", 0, 0) + "}",
                0, "w.shape[0]: expected a dimension below 2^63");
}

TEST_F(SafetensorsTest, RejectsBadShapeAndOffsetValues) {
  expectRefused("{" + entry("w", "U8", "[2,-1]", 0, 0) + "}", 0,
                "w.shape[1]: expected a non-negative integer but found "
                "the negative number -1");
  expectRefused("{" + entry("w", "U8", "[1.5]", 0, 0) + "}", 0, "w.shape[0]: expected a non-negative integer");
  expectRefused("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
                "\"data_offsets\":[0,1,2]}}",
                2, "w.data_offsets: expected exactly 2 offsets");
  expectRefused("{" + entry("w", "U8", "[1]", 3, 2) + "}", 4, "w.data_offsets: expected begin <= end but found [3, 2]");
  expectRefused("{\"w\":{\"dtype\":\"U8\",\"shape\":\"1\","
                "\"data_offsets\":[0,1]}}",
                1, "w.shape: expected an array of non-negative integers");
}

TEST_F(SafetensorsTest, RejectsMissingDuplicateAndMistypedFields) {
  expectRefused("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
                ": w: expected dtype, shape and data_offsets but "
                "data_offsets is missing");
  expectRefused("{" + entry("w", "U8", "[1]", 0, 1) + "," +
                    entry("w", "U8", "[1]", 1, 2) + "}",
                2, ": w: expected each key once");
  expectRefused("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
                "\"data_offsets\":[0,1]}}",
                1, "w.dtype: expected the field once");
  expectRefused("{\"w\":[1,2]}", 0, ": w: expected an object with dtype");
  expectRefused("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}",
                1, "w.dtype: expected a dtype name string");
  expectRefused("{\"__metadata__\":{\"format\":1}}", 0,
                "__metadata__.format: expected a string but found the "
                "number 1");
}

TEST_F(SafetensorsTest, RejectsMissingFileAndDirectory) {
  std::string missing = (dir / "nope.safetensors").string();
  Result<ShardHeader> r = readSafetensorsHeader(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().file, missing);
  r = readSafetensorsHeader(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("expected a regular file"),
            std::string::npos);
}

TEST(SafetensorsBytes, HeaderLargerThanFileIsRejected) {
  Result<ShardHeader> r = parseSafetensorsHeader("{}", 9, "f.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().field, "file size");
}

TEST(SafetensorsBytes, DeepNestingInUnknownFieldIsRejected) {
  std::string header = "{\"w\":{\"x\":" + std::string(10000, '[') +
                       std::string(10000, ']') + "}}";
  Result<ShardHeader> r =
      parseSafetensorsBytes(shardBytes(header, 0), "deep.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("levels of nesting"), std::string::npos)
      << r.error().message();
}

TEST(SafetensorsBytes, ControlCharactersInNamesAreEscaped) {
  std::string header = "{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]}}";
  Result<ShardHeader> r =
      parseSafetensorsBytes(shardBytes(header, 1), "ctl.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  EXPECT_NE(r.error().message().find("a\\x0ab.dtype"), std::string::npos)
      << r.error().message();
}

} // namespace
