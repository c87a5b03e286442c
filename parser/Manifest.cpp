//===- Manifest.cpp - read model.safetensors.index.json -------------------===//
//
// The index is streamed through nlohmann's SAX interface: building a DOM of a
// 250,000-entry weight_map costs a std::map node per tensor and is several
// times slower than collecting the pairs straight into a vector. Metadata
// values other than total_size are small and are rebuilt as JSON values only
// to be printed back in compact form. Shard-level checks (names, numbering)
// run once per distinct shard after the pass, not once per tensor.
//
//===----------------------------------------------------------------------===//
#include "parser/Manifest.h"
#include "parser/MessageText.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <unordered_set>

namespace adapt {
namespace {

/// Deepest nesting accepted in metadata values and unknown top-level keys.
constexpr int kMaxDepth = 64;

/// A shard name of the form PREFIX-XXXXX-of-YYYYY.safetensors, split up.
struct NumberedName {
  std::string_view prefix; ///< PREFIX, e.g. "model".
  uint64_t index = 0;      ///< XXXXX.
  uint64_t count = 0;      ///< YYYYY.
};

/// Parses a run of 1 to 18 decimal digits (so it cannot overflow).
std::optional<uint64_t> parseDigits(std::string_view digits) {
  if (digits.empty() || digits.size() > 18)
    return std::nullopt;
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

/// Splits \p name if it follows the numbered-shard convention.
std::optional<NumberedName> parseNumberedName(std::string_view name) {
  constexpr std::string_view kSuffix = ".safetensors";
  if (name.size() < kSuffix.size() ||
      name.substr(name.size() - kSuffix.size()) != kSuffix)
    return std::nullopt;
  name.remove_suffix(kSuffix.size());
  size_t of = name.rfind("-of-");
  if (of == std::string_view::npos)
    return std::nullopt;
  std::optional<uint64_t> count = parseDigits(name.substr(of + 4));
  std::string_view head = name.substr(0, of);
  size_t dash = head.rfind('-');
  if (!count || dash == std::string_view::npos)
    return std::nullopt;
  std::optional<uint64_t> index = parseDigits(head.substr(dash + 1));
  if (!index)
    return std::nullopt;
  return NumberedName{head.substr(0, dash), *index, *count};
}

/// Why \p shard cannot be a shard file name next to the index, if it cannot.
std::optional<std::string> badShardName(std::string_view shard) {
  if (shard.empty())
    return "expected a shard file name but found an empty string";
  if (shard.find('/') != std::string_view::npos ||
      shard.find('\\') != std::string_view::npos)
    return "expected a plain file name but \"" + printable(shard) +
           "\" contains a path separator";
  if (shard.find("..") != std::string_view::npos)
    return "expected a plain file name but \"" + printable(shard) +
           "\" contains \"..\"";
  if (shard.find('\0') != std::string_view::npos)
    return "expected a plain file name but \"" + printable(shard) +
           "\" contains a NUL byte";
  return std::nullopt;
}

/// Checks tensor names and shard names of \p m, fills m.shards and the shard
/// numbering fields. \p where prefixes tensor names in error fields.
std::optional<InputError> finishManifest(Manifest &m,
                                         const std::string &where) {
  std::unordered_set<std::string_view> names;
  names.reserve(m.tensors.size());
  std::unordered_set<std::string_view> shards;
  std::string_view previous;
  bool havePrevious = false;
  for (const auto &[tensor, shard] : m.tensors) {
    if (tensor.empty())
      return InputError{m.file,
                        where.empty() ? "tensor name"
                                      : where.substr(0, where.size() - 1),
                        "expected non-empty tensor names but found \"\""};
    if (!names.insert(tensor).second)
      return InputError{m.file, where + printable(tensor),
                        "expected each tensor once but it is listed twice"};
    if (havePrevious && shard == previous)
      continue;
    previous = shard;
    havePrevious = true;
    if (!shards.insert(shard).second)
      continue;
    if (std::optional<std::string> why = badShardName(shard))
      return InputError{m.file, where + printable(tensor), *why};
  }
  m.shards.assign(shards.begin(), shards.end());
  std::sort(m.shards.begin(), m.shards.end());

  const std::string *first = nullptr;
  NumberedName firstNumbered;
  bool anyZero = false;
  std::vector<std::pair<const std::string *, NumberedName>> numbered;
  for (const std::string &shard : m.shards) {
    std::optional<NumberedName> n = parseNumberedName(shard);
    if (!n)
      continue;
    if (!first) {
      first = &shard;
      firstNumbered = *n;
    }
    if (n->prefix != firstNumbered.prefix || n->count != firstNumbered.count)
      return InputError{m.file, "shard names",
                        "expected numbered shards to agree on one prefix and "
                        "count but \"" + printable(*first) + "\" and \"" +
                            printable(shard) + "\" differ"};
    anyZero = anyZero || n->index == 0;
    numbered.emplace_back(&shard, *n);
  }
  if (!first)
    return std::nullopt;
  if (firstNumbered.count == 0)
    return InputError{m.file, "shard names",
                      "expected a shard count of at least 1 but \"" +
                          printable(*first) + "\" says 0"};
  int base = anyZero ? 0 : 1;
  for (const auto &[shard, n] : numbered)
    if (n.index > n.count)
      return InputError{m.file, "shard names",
                        "expected shard numbers from " + std::to_string(base) +
                            " to " + std::to_string(n.count) + " but \"" +
                            printable(*shard) + "\" is outside that range"};
  m.shardNumberBase = base;
  m.declaredShardCount = static_cast<int64_t>(firstNumbered.count);
  return std::nullopt;
}

/// Rebuilds one nested metadata value from SAX events so that it can be
/// printed back as compact JSON.
class JsonBuilder {
public:
  /// Opens a container; false when nesting gets deeper than kMaxDepth.
  bool open(nlohmann::json container) {
    if (stack.size() >= static_cast<size_t>(kMaxDepth))
      return false;
    stack.push_back(std::move(container));
    keys.emplace_back();
    return true;
  }
  /// Sets the key of the next value in the innermost object.
  void key(std::string k) { keys.back() = std::move(k); }
  /// Adds a finished value to the innermost container.
  void add(nlohmann::json value) {
    if (stack.back().is_array())
      stack.back().push_back(std::move(value));
    else
      stack.back()[keys.back()] = std::move(value);
  }
  /// Closes the innermost container; returns the whole value once the
  /// outermost one is closed.
  std::optional<nlohmann::json> close() {
    nlohmann::json done = std::move(stack.back());
    stack.pop_back();
    keys.pop_back();
    if (stack.empty())
      return done;
    add(std::move(done));
    return std::nullopt;
  }

private:
  std::vector<nlohmann::json> stack; ///< Open containers, outermost first.
  std::vector<std::string> keys;     ///< Pending key of each open container.
};

/// SAX consumer filling a Manifest in one pass over the index JSON.
class IndexHandler {
public:
  explicit IndexHandler(Manifest &m) : m(m) {}

  /// The first problem seen, if any; parsing stops there.
  std::optional<InputError> error;
  /// Whether a weight_map object was seen.
  bool sawWeightMap = false;

  // nlohmann SAX interface below; the library fixes the names.

  /// A JSON null: "no metadata", an ignored value or an error.
  bool null() { return value(nullptr, "null"); }
  /// A JSON boolean: kept in metadata, ignored or an error.
  bool boolean(bool v) { return value(v, "a boolean"); }
  /// A negative integer (nlohmann reports non-negative ones as unsigned,
  /// except "-0", which is forwarded).
  bool number_integer(int64_t v) {
    if (v >= 0)
      return number_unsigned(static_cast<uint64_t>(v));
    return value(v, "the negative number " + std::to_string(v));
  }
  /// A non-negative integer, e.g. total_size.
  bool number_unsigned(uint64_t v) {
    if (where == Where::Metadata && metaKey == "total_size") {
      m.hasTotalSize = true;
      m.totalSize = v;
      return true;
    }
    return value(v, "the number " + std::to_string(v));
  }
  /// A number with a fraction or exponent.
  bool number_float(double v, const std::string &text) {
    // Some writers print total_size as a float such as 1.5e10.
    if (where == Where::Metadata && metaKey == "total_size" && v >= 0 &&
        v < 18446744073709551616.0 && std::floor(v) == v)
      return number_unsigned(static_cast<uint64_t>(v));
    return value(v, "the number " + printable(text, 40));
  }
  /// Binary values only exist in binary formats; listed for completeness.
  bool binary(nlohmann::json::binary_t &) {
    return value(nullptr, "binary data");
  }
  /// A string: a shard file name (the hot path) or a metadata value.
  bool string(std::string &v) {
    if (where == Where::WeightMap) {
      m.tensors.emplace_back(std::move(tensorName), v);
      return true;
    }
    return value(v, "the string \"" + printable(v, 40) + "\"");
  }

  /// `{` anywhere.
  bool start_object(std::size_t) { return open(nlohmann::json::object()); }
  /// `[` anywhere.
  bool start_array(std::size_t) { return open(nlohmann::json::array()); }

  /// An object key: top-level, tensor name, metadata field or nested.
  bool key(std::string &k) {
    switch (where) {
    case Where::Root:
      rootKey = k == "weight_map" ? RootKey::WeightMap
                : k == "metadata" ? RootKey::Metadata
                                  : RootKey::Other;
      if (rootKey == RootKey::WeightMap && sawWeightMap)
        return fail("weight_map", "expected the key once but it appears twice");
      if (rootKey == RootKey::Metadata && sawMetadata)
        return fail("metadata", "expected the key once but it appears twice");
      return true;
    case Where::WeightMap:
      tensorName = k;
      return true;
    case Where::Metadata:
      metaKey = k;
      return true;
    case Where::MetaValue:
      builder.key(k);
      return true;
    default: // Where::Skip
      return true;
    }
  }

  /// `}` anywhere.
  bool end_object() { return close(); }
  /// `]` anywhere.
  bool end_array() { return close(); }

  /// Malformed JSON: reported with the byte offset, line and column.
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) {
    return fail("JSON", invalidJsonText(position, ex));
  }

private:
  /// Where in the document the next event lands.
  enum class Where { Top, Root, WeightMap, Metadata, MetaValue, Skip, Done };
  /// Which top-level key the current value belongs to.
  enum class RootKey { WeightMap, Metadata, Other };

  /// Records the first error and stops the parse.
  bool fail(std::string field, std::string expected) {
    if (!error)
      error = InputError{m.file, std::move(field), std::move(expected)};
    return false;
  }

  /// Handles a scalar \p v, described as \p found in messages.
  bool value(nlohmann::json v, const std::string &found) {
    switch (where) {
    case Where::Top:
      return fail("JSON", "expected a JSON object but found " + found);
    case Where::Root:
      if (rootKey == RootKey::WeightMap)
        return fail("weight_map", "expected an object mapping tensor names "
                                  "to shard files but found " + found);
      if (rootKey == RootKey::Metadata && !v.is_null())
        return fail("metadata", "expected an object but found " + found);
      return true;
    case Where::WeightMap:
      return fail("weight_map." + printable(tensorName),
                  "expected a shard file name string but found " + found);
    case Where::Metadata:
      if (metaKey == "total_size")
        return fail("metadata.total_size",
                    "expected a non-negative integer byte count but found " +
                        found);
      m.metadata.emplace_back(metaKey, v.dump());
      return true;
    case Where::MetaValue:
      builder.add(std::move(v));
      return true;
    default: // Where::Skip
      return true;
    }
  }

  /// Handles the start of an object or array \p container.
  bool open(nlohmann::json container) {
    bool isObject = container.is_object();
    switch (where) {
    case Where::Top:
      if (!isObject)
        return fail("JSON", "expected a JSON object but found an array");
      where = Where::Root;
      return true;
    case Where::Root:
      if (rootKey == RootKey::WeightMap) {
        if (!isObject)
          return fail("weight_map", "expected an object mapping tensor names "
                                    "to shard files but found an array");
        sawWeightMap = true;
        where = Where::WeightMap;
        return true;
      }
      if (rootKey == RootKey::Metadata) {
        if (!isObject)
          return fail("metadata", "expected an object but found an array");
        sawMetadata = true;
        where = Where::Metadata;
        return true;
      }
      where = Where::Skip;
      skipDepth = 1;
      return true;
    case Where::WeightMap:
      return fail("weight_map." + printable(tensorName),
                  std::string("expected a shard file name string but found ") +
                      (isObject ? "an object" : "an array"));
    case Where::Metadata:
      if (metaKey == "total_size")
        return fail("metadata.total_size",
                    "expected a non-negative integer byte count but found " +
                        std::string(isObject ? "an object" : "an array"));
      where = Where::MetaValue;
      builder.open(std::move(container));
      return true;
    case Where::MetaValue:
      if (!builder.open(std::move(container)))
        return tooDeep("metadata." + printable(metaKey));
      return true;
    default: // Where::Skip
      if (++skipDepth > kMaxDepth)
        return tooDeep("JSON");
      return true;
    }
  }

  /// Handles the end of the innermost object or array.
  bool close() {
    switch (where) {
    case Where::WeightMap:
    case Where::Metadata:
      where = Where::Root;
      return true;
    case Where::MetaValue:
      if (std::optional<nlohmann::json> done = builder.close()) {
        m.metadata.emplace_back(metaKey, done->dump());
        where = Where::Metadata;
      }
      return true;
    case Where::Skip:
      if (--skipDepth == 0)
        where = Where::Root;
      return true;
    default: // Where::Root: the document is complete.
      where = Where::Done;
      return true;
    }
  }

  /// Reports nesting deeper than kMaxDepth at \p field.
  bool tooDeep(std::string field) {
    return fail(std::move(field), "expected at most " +
                                      std::to_string(kMaxDepth) +
                                      " levels of nesting");
  }

  Manifest &m;                      ///< Receives tensors and metadata.
  Where where = Where::Top;         ///< Current position.
  RootKey rootKey = RootKey::Other; ///< Top-level key being read.
  bool sawMetadata = false;         ///< Whether a metadata object was seen.
  std::string tensorName;           ///< weight_map key awaiting its value.
  std::string metaKey;              ///< Metadata field being read.
  JsonBuilder builder;              ///< Rebuilds nested metadata values.
  int skipDepth = 0;                ///< Nesting inside an ignored value.
};

} // namespace

Result<Manifest> parseManifest(std::string_view json,
                               const std::string &fileForErrors) {
  try {
    Manifest m;
    m.file = fileForErrors;
    IndexHandler handler(m);
    bool ok = nlohmann::json::sax_parse(json.data(), json.data() + json.size(),
                                        &handler);
    if (handler.error)
      return *handler.error;
    if (!ok)
      return InputError{fileForErrors, "JSON",
                        "expected valid JSON but the parser stopped"};
    if (!handler.sawWeightMap)
      return InputError{fileForErrors, "weight_map",
                        "expected an object mapping tensor names to shard "
                        "files but the key is missing"};
    if (std::optional<InputError> err = finishManifest(m, "weight_map."))
      return *err;
    return m;
  } catch (...) {
    return InputError{fileForErrors, "JSON", parseFailureText("an index")};
  }
}

Result<Manifest> readManifest(const std::string &path) {
  try {
    Result<uint64_t> fileSize = regularFileSize(path, "an index file");
    if (!fileSize)
      return fileSize.error();
    uint64_t size = *fileSize;
    if (size > kMaxManifestBytes)
      return InputError{path, "", "expected at most " +
                                      std::to_string(kMaxManifestBytes) +
                                      " bytes but the file has " +
                                      std::to_string(size)};
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return InputError{path, "", "expected a readable file"};
    std::string text(static_cast<size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    text.resize(static_cast<size_t>(in.gcount()));
    return parseManifest(text, path);
  } catch (const std::exception &ex) {
    return InputError{path, "", std::string("expected a readable file: ") +
                                    printable(ex.what())};
  }
}

Result<Manifest> manifestFromShard(const ShardHeader &shard) {
  Manifest m;
  m.file = shard.file;
  size_t slash = shard.file.find_last_of("/\\");
  std::string base =
      slash == std::string::npos ? shard.file : shard.file.substr(slash + 1);
  m.tensors.reserve(shard.tensors.size());
  uint64_t total = 0;
  for (const TensorHeader &t : shard.tensors) {
    m.tensors.emplace_back(t.name, base);
    uint64_t bytes = t.end >= t.begin ? t.end - t.begin : 0;
    if (total > UINT64_MAX - bytes)
      return InputError{m.file, printable(t.name),
                        "expected a total size that fits in 64 bits"};
    total += bytes;
  }
  m.hasTotalSize = true;
  m.totalSize = total;
  if (std::optional<InputError> err = finishManifest(m, ""))
    return *err;
  return m;
}

} // namespace adapt
