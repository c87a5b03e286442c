//===- ConfigKeys.h - checked access to config.json keys --------*- C++ -*-===//
//
// A view over one JSON object of a config that remembers which keys a rule
// read, so that the reader can list every key nobody understood. Type errors
// become InputErrors naming the file and the dotted key path.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_CONFIGKEYS_H
#define ADAPT_PARSER_CONFIGKEYS_H

#include "parser/InputError.h"
#include "parser/ModelSpec.h"

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace adapt {

/// Thrown inside the config reader only; readModelConfig catches it and
/// returns it as a Result. Never escapes parser/.
struct ConfigError {
  InputError error;
};

/// Checked, recorded access to one JSON object of a config.
class ConfigObject {
public:
  /// \p path is the dotted prefix ("" at the root, "text_config." below).
  ConfigObject(const nlohmann::json &object, std::string path,
               std::string file)
      : object(&object), path(std::move(path)), file(std::move(file)) {}

  /// True when one of \p names is present and not null.
  bool has(std::initializer_list<const char *> names) const;
  /// First present, non-null integer among \p names (a float with an integral
  /// value is accepted). Wrong type: ConfigError.
  std::optional<int64_t> getInt(std::initializer_list<const char *> names);
  /// Like getInt but the key is required and must be >= \p minimum.
  int64_t requireInt(std::initializer_list<const char *> names,
                     int64_t minimum = 1);
  std::optional<double> getDouble(std::initializer_list<const char *> names);
  std::optional<bool> getBool(std::initializer_list<const char *> names);
  std::optional<std::string>
  getString(std::initializer_list<const char *> names);
  /// A list of integers, or a single integer repeated \p count times when the
  /// key holds a scalar (Hunyuan writes per-layer lists, others scalars).
  std::optional<std::vector<int64_t>>
  getIntList(std::initializer_list<const char *> names, int64_t count = 0);
  std::optional<std::vector<std::string>>
  getStringList(std::initializer_list<const char *> names);
  /// The getters' "set the field when the key is there" form: \p into keeps
  /// its default when none of \p names is present.
  using Names = std::initializer_list<const char *>;
  void readInt(Names names, int64_t &into) { assignIf(getInt(names), into); }
  void readDouble(Names names, double &into) { assignIf(getDouble(names), into); }
  void readBool(Names names, bool &into) { assignIf(getBool(names), into); }
  void readString(Names names, std::string &into) { assignIf(getString(names), into); }
  /// A nested object (records the key as read).
  std::optional<ConfigObject> getObject(const char *name);
  /// Marks keys as understood without reading them.
  void markRead(std::initializer_list<const char *> names);
  /// Raw access for rules that inspect structure; records the key.
  const nlohmann::json *raw(const char *name);

  /// Keys of this object nobody read and that are not known to be harmless.
  void collectUnknown(std::vector<UnknownKey> &out) const;

  /// An InputError for \p key of this object.
  [[noreturn]] void fail(const std::string &key,
                         const std::string &expected) const;

  const std::string &filePath() const { return file; }
  const std::string &keyPath() const { return path; }

private:
  /// Sets \p into to \p value when there is one.
  template <typename T> static void assignIf(const std::optional<T> &value, T &into) {
    if (value)
      into = *value;
  }
  const nlohmann::json *find(std::initializer_list<const char *> names,
                             std::string &foundName);
  /// \p convert (value, key name) applied to the first non-null spelling of
  /// \p names; nullopt when none is there. Every getter reads through this.
  template <typename Convert>
  auto lookup(std::initializer_list<const char *> names, Convert convert)
      -> std::optional<decltype(convert(std::declval<const nlohmann::json &>(), std::string()))> {
    std::string name;
    const nlohmann::json *value = find(names, name);
    if (!value)
      return std::nullopt;
    return convert(*value, name);
  }

  const nlohmann::json *object;
  std::string path;
  std::string file;
  std::set<std::string> read;
};

/// True for keys every Hugging Face config may carry that do not change the
/// architecture (tokens, generation, training hyper-parameters, bookkeeping).
bool isArchitectureNeutralKey(const std::string &key,
                              const nlohmann::json &value);

/// Abbreviates a JSON value for reports ("[0, 0, 1, ... 80 items]").
std::string abbreviateJson(const nlohmann::json &value);

} // namespace adapt

#endif // ADAPT_PARSER_CONFIGKEYS_H
