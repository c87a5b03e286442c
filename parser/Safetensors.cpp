//===- Safetensors.cpp - read the header of a .safetensors shard ----------===//
//
// The header JSON is walked with nlohmann's SAX interface rather than built
// into a DOM: SAX keeps the tensors in file order, sees duplicate keys (a DOM
// silently keeps the last one), stops at the first bad value with a precise
// field name, and bounds nesting so hostile input cannot make us recurse or
// allocate without limit. Semantic checks (dtype, sizes, ranges, overlaps)
// run afterwards on the collected entries.
//
//===----------------------------------------------------------------------===//
#include "parser/Safetensors.h"
#include "parser/MessageText.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <unordered_set>

namespace adapt {
namespace {

/// Deepest nesting accepted inside an unknown per-tensor field. Real headers
/// nest three levels; the cap keeps garbage from growing our state.
constexpr int kMaxSkipDepth = 64;

/// Longest piece of user text (a tensor name, a dtype) quoted in a message.
constexpr size_t kMaxQuoted = 200;

/// A dtype name and its element width in bits.
struct DtypeInfo {
  std::string_view name; ///< As spelled in headers.
  int64_t bits;          ///< Width of one element.
};

/// Every dtype of the safetensors format (Rust crate 0.6+: MX formats F4,
/// F6_*, F8_E8M0, complex C64; 0.7+: the FNUZ float8 variants).
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 8},         {"F4", 4},           {"F6_E2M3", 6},
    {"F6_E3M2", 6},      {"U8", 8},           {"I8", 8},
    {"F8_E5M2", 8},      {"F8_E4M3", 8},      {"F8_E8M0", 8},
    {"F8_E4M3FNUZ", 8},  {"F8_E5M2FNUZ", 8},  {"I16", 16},
    {"U16", 16},         {"F16", 16},         {"BF16", 16},
    {"I32", 32},         {"U32", 32},         {"F32", 32},
    {"C64", 64},         {"F64", 64},         {"I64", 64},
    {"U64", 64},
};

/// "[2, 3, 4]" for error messages.
std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// Checks the 8-byte length prefix (\p first8, shorter when the file is)
/// against \p fileSize and the header cap; returns the header length.
Result<uint64_t> headerLength(std::string_view first8, uint64_t fileSize,
                              const std::string &file) {
  if (fileSize < 8 || first8.size() < 8)
    return InputError{file, "header length",
                      "expected a file of at least 8 bytes (the little-endian "
                      "header length) but the file has " +
                          std::to_string(fileSize) + " bytes"};
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(first8[i]);
  if (n > kMaxSafetensorsHeaderBytes)
    return InputError{file, "header length",
                      "expected at most " +
                          std::to_string(kMaxSafetensorsHeaderBytes) +
                          " bytes (the safetensors limit) but the first 8 "
                          "bytes say " +
                          std::to_string(n)};
  if (n > fileSize - 8)
    return InputError{file, "header length",
                      "expected at most " + std::to_string(fileSize - 8) +
                          " bytes (file size " + std::to_string(fileSize) +
                          " minus the 8-byte length) but the first 8 bytes "
                          "say " +
                          std::to_string(n)};
  return n;
}

/// SAX consumer collecting the raw entries of a header. It only checks JSON
/// types and structure; sizes are checked by validateTensors afterwards.
class HeaderHandler {
public:
  explicit HeaderHandler(const std::string &file) : file(file) {}

  /// The first problem seen, if any; parsing stops there.
  std::optional<InputError> error;
  /// Tensors and metadata in file order.
  ShardHeader shard;

  // nlohmann SAX interface below; the library fixes the names.

  /// A JSON null; only valid as the value of `__metadata__`.
  bool null() { return scalar("null"); }
  /// A JSON boolean; never valid except inside an unknown field.
  bool boolean(bool) { return scalar("a boolean"); }
  /// A negative integer (nlohmann reports non-negative ones as unsigned,
  /// except "-0", which is forwarded).
  bool number_integer(int64_t v) {
    if (v >= 0)
      return number_unsigned(static_cast<uint64_t>(v));
    return scalar("the negative number " + std::to_string(v));
  }
  /// A non-negative integer: a shape dimension or a data offset.
  bool number_unsigned(uint64_t v) {
    if (where == Where::Shape) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail(dimField(), "expected a dimension below 2^63 but found " +
                                    std::to_string(v));
      current.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (where == Where::Offsets) {
      if (offsetCount == 2)
        return fail(fieldName("data_offsets"),
                    "expected exactly 2 offsets [begin, end] but found more");
      (offsetCount++ == 0 ? current.begin : current.end) = v;
      return true;
    }
    return scalar("the number " + std::to_string(v));
  }
  /// A number with a fraction or exponent; never a valid size.
  bool number_float(double, const std::string &text) {
    return scalar("the number " + printable(text, 40));
  }
  /// Binary values only exist in binary formats; listed for completeness.
  bool binary(nlohmann::json::binary_t &) { return scalar("binary data"); }
  /// A string: a dtype or a metadata value.
  bool string(std::string &v) {
    if (where == Where::Metadata) {
      shard.metadata.emplace_back(std::move(pendingKey), std::move(v));
      return true;
    }
    if (where == Where::Tensor && field == Field::Dtype) {
      current.dtype = std::move(v);
      return true;
    }
    return scalar("the string \"" + printable(v, 40) + "\"");
  }

  /// `{`: the header, a tensor entry, `__metadata__` or an unknown field.
  bool start_object(std::size_t) {
    switch (where) {
    case Where::Top:
      where = Where::Root;
      return true;
    case Where::Root:
      if (pendingKey == "__metadata__") {
        where = Where::Metadata;
        return true;
      }
      current = TensorHeader{};
      current.name = std::move(pendingKey);
      seenDtype = seenShape = seenOffsets = false;
      where = Where::Tensor;
      return true;
    case Where::Tensor:
      if (field == Field::Other)
        return startSkip();
      return wrongType("an object");
    case Where::Skip:
      return deeperSkip();
    default:
      return wrongType("an object");
    }
  }

  /// `[`: a shape, data_offsets or an unknown field.
  bool start_array(std::size_t) {
    if (where == Where::Tensor && field == Field::Shape) {
      where = Where::Shape;
      return true;
    }
    if (where == Where::Tensor && field == Field::Offsets) {
      where = Where::Offsets;
      offsetCount = 0;
      return true;
    }
    if (where == Where::Tensor && field == Field::Other)
      return startSkip();
    if (where == Where::Skip)
      return deeperSkip();
    return wrongType("an array");
  }

  /// An object key: a tensor name, a metadata key or a tensor field.
  bool key(std::string &k) {
    if (where == Where::Root) {
      if (!names.insert(k).second)
        return fail(printable(k), "expected each key once but it appears "
                                  "twice in the header");
      pendingKey = std::move(k);
      return true;
    }
    if (where == Where::Metadata) {
      pendingKey = std::move(k);
      return true;
    }
    // Where::Tensor; keys inside skipped values are ignored.
    if (where != Where::Tensor)
      return true;
    field = k == "dtype"          ? Field::Dtype
            : k == "shape"        ? Field::Shape
            : k == "data_offsets" ? Field::Offsets
                                  : Field::Other;
    bool *seen = field == Field::Dtype   ? &seenDtype
                 : field == Field::Shape ? &seenShape
                 : field == Field::Offsets ? &seenOffsets
                                           : nullptr;
    if (seen && *seen)
      return fail(fieldName(k), "expected the field once but it appears twice");
    if (seen)
      *seen = true;
    return true;
  }

  /// `}`: completes a tensor entry (checking its fields) or the header.
  bool end_object() {
    switch (where) {
    case Where::Metadata:
      where = Where::Root;
      return true;
    case Where::Tensor:
      if (!seenDtype || !seenShape || !seenOffsets)
        return fail(printable(current.name),
                    std::string("expected dtype, shape and data_offsets but ") +
                        (!seenDtype ? "dtype" : !seenShape ? "shape"
                                                           : "data_offsets") +
                        " is missing");
      shard.tensors.push_back(std::move(current));
      where = Where::Root;
      field = Field::Other;
      return true;
    case Where::Skip:
      return shallowerSkip();
    default: // Where::Root: the header is complete.
      where = Where::Done;
      return true;
    }
  }

  /// `]`: completes a shape or data_offsets (checking the count).
  bool end_array() {
    if (where == Where::Shape) {
      where = Where::Tensor;
      return true;
    }
    if (where == Where::Offsets) {
      if (offsetCount != 2)
        return fail(fieldName("data_offsets"),
                    "expected exactly 2 offsets [begin, end] but found " +
                        std::to_string(offsetCount));
      where = Where::Tensor;
      return true;
    }
    return shallowerSkip();
  }

  /// Malformed JSON: reported with the byte offset, line and column.
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) {
    return fail("header JSON", invalidJsonText(position, ex));
  }

private:
  /// Where in the header the next event lands.
  enum class Where { Top, Root, Metadata, Tensor, Shape, Offsets, Skip, Done };
  /// Which field of a tensor entry the current value belongs to.
  enum class Field { Dtype, Shape, Offsets, Other };

  /// Records the first error and stops the parse.
  bool fail(std::string field, std::string expected) {
    if (!error)
      error = InputError{file, std::move(field), std::move(expected)};
    return false;
  }

  /// "NAME.FIELD", the field path used in errors about one tensor.
  std::string fieldName(std::string_view f) const {
    return printable(current.name) + "." + std::string(f);
  }

  /// "NAME.shape[i]" for the dimension about to be appended.
  std::string dimField() const {
    return fieldName("shape[" + std::to_string(current.shape.size()) + "]");
  }

  /// Handles a scalar value \p found (described for messages).
  bool scalar(const std::string &found) {
    if (where == Where::Skip)
      return true;
    if (where == Where::Tensor && field == Field::Other)
      return true;
    if (where == Where::Root && found == "null" && pendingKey == "__metadata__")
      return true; // The reference reader treats null as "no metadata".
    return wrongType(found);
  }

  /// Reports that \p found is not what the current position needs.
  bool wrongType(const std::string &found) {
    switch (where) {
    case Where::Top:
      return fail("header", "expected a JSON object but found " + found);
    case Where::Root:
      if (pendingKey == "__metadata__")
        return fail("__metadata__",
                    "expected an object of string values but found " + found);
      return fail(printable(pendingKey),
                  "expected an object with dtype, shape and data_offsets but "
                  "found " + found);
    case Where::Metadata:
      return fail("__metadata__." + printable(pendingKey),
                  "expected a string but found " + found);
    case Where::Tensor:
      if (field == Field::Dtype)
        return fail(fieldName("dtype"),
                    "expected a dtype name string but found " + found);
      return fail(fieldName(field == Field::Shape ? "shape" : "data_offsets"),
                  "expected an array of non-negative integers but found " +
                      found);
    case Where::Shape:
      return fail(dimField(),
                  "expected a non-negative integer but found " + found);
    default: // Where::Offsets
      return fail(fieldName("data_offsets[" + std::to_string(offsetCount) +
                            "]"),
                  "expected a non-negative integer but found " + found);
    }
  }

  /// Starts skipping the value of an unknown tensor field.
  bool startSkip() {
    where = Where::Skip;
    skipDepth = 1;
    return true;
  }
  /// Enters a nested container inside a skipped value, up to the cap.
  bool deeperSkip() {
    if (++skipDepth > kMaxSkipDepth)
      return fail(fieldName("<unknown field>"),
                  "expected at most " + std::to_string(kMaxSkipDepth) +
                      " levels of nesting");
    return true;
  }
  /// Leaves a container inside a skipped value.
  bool shallowerSkip() {
    if (--skipDepth == 0)
      where = Where::Tensor;
    return true;
  }

  const std::string &file;           ///< Named in every error.
  Where where = Where::Top;          ///< Current position.
  Field field = Field::Other;        ///< Tensor field being read.
  std::string pendingKey;            ///< Last top-level or metadata key.
  TensorHeader current;              ///< Tensor entry being read.
  bool seenDtype = false;            ///< Whether `current` has a dtype,
  bool seenShape = false;            ///< a shape
  bool seenOffsets = false;          ///< and data_offsets.
  int offsetCount = 0;               ///< Offsets read so far (<= 2).
  int skipDepth = 0;                 ///< Nesting inside a skipped value.
  std::unordered_set<std::string> names; ///< Top-level keys seen.
};

/// Checks dtype, size and range of every tensor and that no two byte ranges
/// overlap; \p dataBytes is the size of the data section after the header.
std::optional<InputError> validateTensors(const ShardHeader &shard,
                                          uint64_t dataBytes) {
  const std::string &file = shard.file;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (const TensorHeader &t : shard.tensors) {
    std::string name = printable(t.name);
    int64_t bits = safetensorsDtypeBits(t.dtype);
    if (bits < 0) {
      std::string known;
      for (const DtypeInfo &d : kDtypes)
        known += (known.empty() ? "" : ", ") + std::string(d.name);
      return InputError{file, name + ".dtype",
                        "expected one of " + known + " but found \"" +
                            printable(t.dtype, 40) + "\""};
    }
    uint64_t numel = 1;
    bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    for (int64_t dim : t.shape) {
      if (empty)
        break;
      uint64_t d = static_cast<uint64_t>(dim);
      if (numel > kMax / d)
        return InputError{file, name + ".shape",
                          "expected an element count that fits in 64 bits "
                          "but " +
                              shapeText(t.shape) + " overflows"};
      numel *= d;
    }
    if (empty)
      numel = 0;
    if (numel > kMax / static_cast<uint64_t>(bits))
      return InputError{file, name + ".shape",
                        "expected a size that fits in 64 bits but " +
                            shapeText(t.shape) + " of " + t.dtype +
                            " overflows"};
    uint64_t totalBits = numel * static_cast<uint64_t>(bits);
    if (totalBits % 8 != 0)
      return InputError{file, name + ".shape",
                        "expected a whole number of bytes but " +
                            shapeText(t.shape) + " of " + t.dtype + " is " +
                            std::to_string(totalBits) + " bits"};
    uint64_t bytes = totalBits / 8;
    std::string range = "[" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + "]";
    if (t.begin > t.end)
      return InputError{file, name + ".data_offsets",
                        "expected begin <= end but found " + range};
    if (t.end > dataBytes)
      return InputError{file, name + ".data_offsets",
                        "expected end <= " + std::to_string(dataBytes) +
                            " (data section: file size " +
                            std::to_string(shard.fileSize) + " - 8 - header " +
                            std::to_string(shard.headerBytes) +
                            ") but found " + range};
    if (t.end - t.begin != bytes)
      return InputError{file, name + ".data_offsets",
                        "expected " + std::to_string(bytes) + " bytes for " +
                            shapeText(t.shape) + " of " + t.dtype + " but " +
                            range + " holds " +
                            std::to_string(t.end - t.begin)};
  }

  std::vector<const TensorHeader *> byBegin;
  byBegin.reserve(shard.tensors.size());
  for (const TensorHeader &t : shard.tensors)
    if (t.end > t.begin)
      byBegin.push_back(&t);
  std::sort(byBegin.begin(), byBegin.end(),
            [](const TensorHeader *a, const TensorHeader *b) {
              return a->begin != b->begin ? a->begin < b->begin
                                          : a->end < b->end;
            });
  const TensorHeader *reach = nullptr; // Non-empty range ending furthest.
  for (const TensorHeader *t : byBegin) {
    if (reach && t->begin < reach->end)
      return InputError{
          file, printable(t->name) + ".data_offsets",
          "expected no overlap but [" + std::to_string(t->begin) + ", " +
              std::to_string(t->end) + "] overlaps " + printable(reach->name) +
              " at [" + std::to_string(reach->begin) + ", " +
              std::to_string(reach->end) + "]"};
    if (!reach || t->end > reach->end)
      reach = t;
  }
  return std::nullopt;
}

} // namespace

int64_t safetensorsDtypeBits(std::string_view dtype) {
  for (const DtypeInfo &d : kDtypes)
    if (d.name == dtype)
      return d.bits;
  return -1;
}

Result<ShardHeader> parseSafetensorsHeader(std::string_view headerJson,
                                           uint64_t fileSize,
                                           const std::string &fileForErrors) {
  try {
    uint64_t headerBytes = headerJson.size();
    if (fileSize < 8 || fileSize - 8 < headerBytes)
      return InputError{fileForErrors, "file size",
                        "expected at least " + std::to_string(headerBytes) +
                            " + 8 bytes (header and its length) but the "
                            "file has " +
                            std::to_string(fileSize)};
    HeaderHandler handler(fileForErrors);
    handler.shard.file = fileForErrors;
    handler.shard.headerBytes = headerBytes;
    handler.shard.fileSize = fileSize;
    bool ok = nlohmann::json::sax_parse(
        headerJson.data(), headerJson.data() + headerJson.size(), &handler);
    if (handler.error)
      return *handler.error;
    if (!ok)
      return InputError{fileForErrors, "header JSON",
                        "expected valid JSON but the parser stopped"};
    if (auto err = validateTensors(handler.shard,
                                   fileSize - 8 - headerBytes))
      return *err;
    return std::move(handler.shard);
  } catch (...) {
    return InputError{fileForErrors, "header JSON", parseFailureText("a header")};
  }
}

Result<ShardHeader> parseSafetensorsBytes(std::string_view whole,
                                          const std::string &fileForErrors) {
  Result<uint64_t> n =
      headerLength(whole.substr(0, 8), whole.size(), fileForErrors);
  if (!n)
    return n.error();
  return parseSafetensorsHeader(whole.substr(8, *n), whole.size(),
                                fileForErrors);
}

Result<uint64_t> regularFileSize(const std::string &path, const std::string &what) {
  std::error_code ec;
  std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    return InputError{path, "", "expected " + what +
                                    " but it does not exist or cannot be accessed"};
  if (!std::filesystem::is_regular_file(status))
    return InputError{path, "", "expected a regular file"};
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec)
    return InputError{path, "", "expected a readable file size: " + ec.message()};
  return size;
}

Result<ShardHeader> readSafetensorsHeader(const std::string &path) {
  try {
    Result<uint64_t> fileSize = regularFileSize(path, "a safetensors file");
    if (!fileSize)
      return fileSize.error();
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return InputError{path, "", "expected a readable file"};
    char first8[8] = {};
    in.read(first8, 8);
    std::string_view prefix(first8, static_cast<size_t>(in.gcount()));
    Result<uint64_t> n = headerLength(prefix, *fileSize, path);
    if (!n)
      return n.error();
    std::string header(static_cast<size_t>(*n), '\0');
    in.read(header.data(), static_cast<std::streamsize>(*n));
    if (static_cast<uint64_t>(in.gcount()) != *n)
      return InputError{path, "header",
                        "expected " + std::to_string(*n) +
                            " header bytes but the file ended after " +
                            std::to_string(in.gcount())};
    return parseSafetensorsHeader(header, *fileSize, path);
  } catch (const std::exception &ex) {
    return InputError{path, "", std::string("expected a readable file: ") +
                                    printable(ex.what())};
  }
}

} // namespace adapt
