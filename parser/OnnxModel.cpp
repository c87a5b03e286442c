//===- OnnxModel.cpp - read an ONNX model into plain data -----------------===//
//
// Turns a serialized ModelProto into OnnxGraph and checks every initializer's
// storage: inline sizes, external data location and bounds (without reading
// external bytes). The component mapping lives in OnnxComponents.cpp.
//
//===----------------------------------------------------------------------===//
#include "parser/OnnxModel.h"
#include "parser/Safetensors.h"

#ifndef ONNX_ML
#error "build with -DONNX_ML=1 -DONNX_NAMESPACE=onnx (ONNX::onnx_proto's flags)"
#endif
#include <onnx/onnx_pb.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>
#include <optional>
#include <unordered_set>

using namespace adapt;
namespace fs = std::filesystem;

namespace {

/// An error found while checking one field, or none.
using Check = std::optional<InputError>;

/// One ONNX TensorProto.DataType: safetensors-style name and element width.
struct DataTypeInfo {
  const char *name; ///< Name stored in OnnxTensorInfo::dtype.
  unsigned bits;    ///< Bits per element; 0 for STRING (no fixed size).
};

/// Looks up TensorProto.DataType `code`; nullptr for UNDEFINED (0) and codes
/// this reader does not know (ONNX 1.19 defines 1..26).
const DataTypeInfo *dataTypeInfo(int64_t code) {
  // Indexed by the code. The widths are safetensors' (safetensorsDtypeBits),
  // but for the few types it has no name for.
  static const std::vector<DataTypeInfo> table = [] {
    static const char *const names[] = {
        /* 0 */ "", "F32", "U8", "I8", "U16", "I16", "I32", "I64", "STRING", "BOOL",
        /* 10 */ "F16", "F64", "U32", "U64", "C64", "C128", "BF16", "F8_E4M3", "F8_E4M3FNUZ",
        "F8_E5M2",
        /* 20 */ "F8_E5M2FNUZ", "U4", "I4", "F4", "F8_E8M0", "U2", "I2"};
    const std::map<std::string, unsigned> onnxOnlyBits = {
        {"", 0}, {"STRING", 0}, {"C128", 128}, {"U4", 4}, {"I4", 4}, {"U2", 2}, {"I2", 2}};
    std::vector<DataTypeInfo> out;
    for (const char *name : names) {
      int64_t bits = safetensorsDtypeBits(name);
      out.push_back({name, bits >= 0 ? unsigned(bits) : onnxOnlyBits.at(name)});
    }
    return out;
  }();
  if (code <= 0 || code >= int64_t(table.size()))
    return nullptr;
  return &table[size_t(code)];
}

/// The error for a data_type code dataTypeInfo does not know.
std::string badDataType(int64_t code) {
  return "unsupported TensorProto data_type " + std::to_string(code) +
         (code == 0 ? " (UNDEFINED)" : "") +
         "; expected one of 1..26 (FLOAT=1, FLOAT16=10, BFLOAT16=16, ...)";
}

/// Parses a non-empty run of decimal digits into `value`; false on anything
/// else or on overflow (external_data offsets are decimal strings).
bool parseU64(const std::string &text, uint64_t &value) {
  if (text.empty() || text.size() > 20)
    return false;
  value = 0;
  for (char c : text) {
    if (c < '0' || c > '9')
      return false;
    uint64_t digit = uint64_t(c - '0');
    if (value > (UINT64_MAX - digit) / 10)
      return false;
    value = value * 10 + digit;
  }
  return true;
}

/// Why an external_data location may not be used, or "" if it may: it must
/// be a relative path that stays inside the model's folder.
std::string locationProblem(const std::string &location) {
  if (location.empty())
    return "is empty";
  if (location.find('\0') != std::string::npos)
    return "contains a NUL byte";
  if (location[0] == '/' || location[0] == '\\' ||
      (location.size() >= 2 && std::isalpha((unsigned char)location[0]) &&
       location[1] == ':'))
    return "is absolute";
  size_t start = 0;
  while (start <= location.size()) {
    size_t end = location.find_first_of("/\\", start);
    if (end == std::string::npos)
      end = location.size();
    if (location.compare(start, end - start, "..") == 0 && end - start == 2)
      return "contains '..'";
    start = end + 1;
  }
  return "";
}

/// Converts protobuf messages of one model into OnnxGraph pieces, checking
/// them; remembers the size of each external data file it has looked at.
class Converter {
public:
  /// `file` names the model in errors; `baseDir` anchors external data.
  Converter(std::string file, std::string baseDir)
      : file(std::move(file)), baseDir(std::move(baseDir)) {}

  /// Fills `out` from initializer `t`; `field` locates it in errors.
  Check tensor(const onnx::TensorProto &t, const std::string &field,
               OnnxTensorInfo &out);

  /// Fills `out` from graph input/output `v`.
  Check valueInfo(const onnx::ValueInfoProto &v, const std::string &field,
                  OnnxTensorInfo &out);

  /// Validates `dims` into `shape` and its element count `numel`.
  Check dims(const google::protobuf::RepeatedField<int64_t> &dims,
             const std::string &field, std::vector<int64_t> &shape,
             uint64_t &numel);

  /// An InputError about `field` of this model.
  InputError error(const std::string &field, std::string expected) const {
    return InputError{file, field, std::move(expected)};
  }

private:
  /// Checks t's external_data entries against the data file; `bytes` is the
  /// tensor's size when known (UINT64_MAX for STRING).
  Check external(const onnx::TensorProto &t, const std::string &field,
                 uint64_t bytes, OnnxTensorInfo &out);

  std::string file;
  std::string baseDir;
  std::map<std::string, uint64_t> fileSizes; ///< Data files already checked.
};

Check Converter::dims(const google::protobuf::RepeatedField<int64_t> &dims,
                      const std::string &field, std::vector<int64_t> &shape,
                      uint64_t &numel) {
  numel = 1;
  shape.assign(dims.begin(), dims.end());
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d < 0)
      return error(field + ".dims[" + std::to_string(i) + "]",
                   "expected a dimension >= 0, found " + std::to_string(d));
    if (d != 0 && numel > uint64_t(INT64_MAX) / uint64_t(d))
      return error(field + ".dims",
                   "expected an element count below 2^63; the dims overflow");
    numel *= uint64_t(d);
  }
  return std::nullopt;
}

Check Converter::tensor(const onnx::TensorProto &t, const std::string &field,
                        OnnxTensorInfo &out) {
  out.name = t.name();
  const DataTypeInfo *type = dataTypeInfo(t.data_type());
  if (!type)
    return error(field + ".data_type", badDataType(t.data_type()));
  out.dtype = type->name;
  uint64_t numel = 0;
  if (Check bad = dims(t.dims(), field, out.shape, numel))
    return bad;
  uint64_t bytes = UINT64_MAX;
  if (type->bits != 0) {
    if (numel > (UINT64_MAX - 7) / type->bits)
      return error(field + ".dims", "expected a byte size below 2^64");
    bytes = (numel * type->bits + 7) / 8;
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    return external(t, field, bytes, out);
  std::string shapeText = std::string(type->name) + " with " +
                          std::to_string(numel) + " elements";
  if (t.has_raw_data()) {
    if (type->bits == 0)
      return error(field + ".raw_data", "STRING tensors cannot use raw_data");
    if (t.raw_data().size() != bytes)
      return error(field + ".raw_data",
                   "expected " + std::to_string(bytes) + " bytes for " +
                       shapeText + ", found " +
                       std::to_string(t.raw_data().size()));
    return std::nullopt;
  }
  uint64_t typed = uint64_t(t.float_data_size()) + t.int32_data_size() +
                   t.string_data_size() + t.int64_data_size() +
                   t.double_data_size() + t.uint64_data_size();
  uint64_t want = numel;
  if (type->bits < 8)
    want = (numel * type->bits + 7) / 8; // Packed sub-byte types.
  if (t.data_type() == onnx::TensorProto::COMPLEX64 ||
      t.data_type() == onnx::TensorProto::COMPLEX128)
    want = numel * 2;
  if (typed != want)
    return error(field, "expected " + std::to_string(want) +
                            " typed data values for " + shapeText +
                            ", found " + std::to_string(typed) +
                            " (and no raw_data or external_data)");
  return std::nullopt;
}

Check Converter::external(const onnx::TensorProto &t, const std::string &field,
                          uint64_t bytes, OnnxTensorInfo &out) {
  std::string where = field + ".external_data";
  if (bytes == UINT64_MAX)
    return error(where, "STRING tensors cannot be stored as external data");
  std::string location, offsetText, lengthText;
  bool hasLocation = false, hasOffset = false, hasLength = false;
  for (const onnx::StringStringEntryProto &entry : t.external_data()) {
    if (entry.key() == "location") {
      location = entry.value();
      hasLocation = true;
    } else if (entry.key() == "offset") {
      offsetText = entry.value();
      hasOffset = true;
    } else if (entry.key() == "length") {
      lengthText = entry.value();
      hasLength = true;
    }
  }
  if (!hasLocation)
    return error(where, "data_location is EXTERNAL but no 'location' key");
  if (std::string why = locationProblem(location); !why.empty())
    return error(where + ".location",
                 "expected a relative path inside the model's folder; '" +
                     location + "' " + why);
  if (hasOffset && !parseU64(offsetText, out.offset))
    return error(where + ".offset",
                 "expected a decimal byte offset, found '" + offsetText + "'");
  if (hasLength && !parseU64(lengthText, out.length))
    return error(where + ".length",
                 "expected a decimal byte length, found '" + lengthText + "'");
  fs::path full = baseDir.empty() ? fs::path(location)
                                  : fs::path(baseDir) / fs::path(location);
  auto cached = fileSizes.find(location);
  if (cached == fileSizes.end()) {
    std::error_code ec;
    bool regular = fs::is_regular_file(full, ec);
    uint64_t size = regular ? uint64_t(fs::file_size(full, ec)) : 0;
    if (!regular || ec)
      return error(where + ".location",
                   "expected external data file '" + full.string() +
                       "' to exist as a regular file; it does not");
    cached = fileSizes.emplace(location, size).first;
  }
  uint64_t size = cached->second;
  if (!hasLength)
    out.length = bytes;
  else if (out.length != bytes)
    return error(where + ".length",
                 "expected " + std::to_string(bytes) + " bytes for " +
                     out.dtype + " " + std::to_string(out.shape.size()) +
                     "-D tensor, found length " + std::to_string(out.length));
  if (out.offset > size || out.length > size - out.offset)
    return error(where + ".offset",
                 "expected offset + length to fit in '" + full.string() +
                     "' (" + std::to_string(size) + " bytes); found offset " +
                     std::to_string(out.offset) + " + length " +
                     std::to_string(out.length) + ", past its end");
  out.externalFile = location;
  out.external = true;
  return std::nullopt;
}

Check Converter::valueInfo(const onnx::ValueInfoProto &v,
                           const std::string &field, OnnxTensorInfo &out) {
  out.name = v.name();
  if (!v.has_type() || !v.type().has_tensor_type())
    return std::nullopt; // Sequences, maps, optionals: no tensor type.
  const onnx::TypeProto::Tensor &tensor = v.type().tensor_type();
  if (tensor.elem_type() != 0) {
    const DataTypeInfo *type = dataTypeInfo(tensor.elem_type());
    if (!type)
      return error(field + ".type.tensor_type.elem_type",
                   badDataType(tensor.elem_type()));
    out.dtype = type->name;
  }
  if (!tensor.has_shape())
    return std::nullopt;
  for (int i = 0; i < tensor.shape().dim_size(); ++i) {
    const onnx::TensorShapeProto::Dimension &d = tensor.shape().dim(i);
    if (d.has_dim_value() && d.dim_value() < 0)
      return error(field + ".type.tensor_type.shape.dim[" +
                       std::to_string(i) + "]",
                   "expected a dimension >= 0 or a symbolic name, found " +
                       std::to_string(d.dim_value()));
    out.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
  }
  return std::nullopt;
}

/// `graph.<list>[i] 'name'`: how errors point at one tensor of the graph.
std::string tensorField(const char *list, int index, const std::string &name) {
  return std::string("graph.") + list + "[" + std::to_string(index) + "] '" +
         name + "'";
}

/// parseOnnxModel without the exception guard.
Result<OnnxGraph> parseUnguarded(std::string_view bytes,
                                 const std::string &file,
                                 const std::string &baseDir) {
  Converter convert(file, baseDir);
  if (bytes.size() > size_t(INT_MAX))
    return convert.error("", "expected at most 2147483647 bytes: protobuf "
                             "cannot parse a larger ModelProto; save the "
                             "weights as external data");
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), int(bytes.size()));
  google::protobuf::io::CodedInputStream in(&raw);
  in.SetTotalBytesLimit(INT_MAX);
  if (!model.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    return convert.error("", "expected a serialized ONNX ModelProto; protobuf "
                             "decoding failed near byte " +
                             std::to_string(in.CurrentPosition()));
  if (model.ir_version() <= 0)
    return convert.error("ir_version",
                         "expected a positive ONNX IR version, found " +
                             std::to_string(model.ir_version()) +
                             " (not an ONNX model?)");
  if (!model.has_graph())
    return convert.error("graph", "expected a ModelProto with a graph; the "
                                  "file has none");
  OnnxGraph graph;
  graph.file = file;
  graph.irVersion = model.ir_version();
  for (const onnx::OperatorSetIdProto &set : model.opset_import())
    if (set.domain().empty() || set.domain() == "ai.onnx")
      graph.opset = set.version();
  graph.producer = model.producer_name();
  if (!model.producer_version().empty())
    graph.producer += " " + model.producer_version();

  const onnx::GraphProto &g = model.graph();
  std::unordered_set<std::string> names;
  for (int i = 0; i < g.initializer_size(); ++i) {
    std::string field = tensorField("initializer", i, g.initializer(i).name());
    OnnxTensorInfo info;
    if (Check bad = convert.tensor(g.initializer(i), field, info))
      return *bad;
    if (!names.insert(info.name).second)
      return convert.error(field, "expected unique initializer names");
    graph.initializers.push_back(std::move(info));
  }
  for (int i = 0; i < g.sparse_initializer_size(); ++i) {
    const onnx::SparseTensorProto &sparse = g.sparse_initializer(i);
    std::string field =
        tensorField("sparse_initializer", i, sparse.values().name());
    OnnxTensorInfo info;
    if (Check bad = convert.tensor(sparse.values(), field + ".values", info))
      return *bad;
    uint64_t numel = 0;
    if (Check bad = convert.dims(sparse.dims(), field, info.shape, numel))
      return *bad;
    if (!names.insert(info.name).second)
      return convert.error(field, "expected unique initializer names");
    graph.initializers.push_back(std::move(info));
  }
  // Reads graph.input or graph.output (WHAT) into INTO; with
  // SKIP_INITIALIZERS, inputs naming an initializer (weights, not graph
  // inputs) are left out.
  auto readValues = [&](const auto &values, const char *what,
                        std::vector<OnnxTensorInfo> &into, bool skipInitializers) -> Check {
    for (int i = 0; i < values.size(); ++i) {
      OnnxTensorInfo info;
      if (Check bad = convert.valueInfo(values[i], tensorField(what, i, values[i].name()), info))
        return bad;
      if (!skipInitializers || !names.count(info.name))
        into.push_back(std::move(info));
    }
    return std::nullopt;
  };
  if (Check bad = readValues(g.input(), "input", graph.inputs, /*skipInitializers=*/true))
    return *bad;
  if (Check bad = readValues(g.output(), "output", graph.outputs, /*skipInitializers=*/false))
    return *bad;
  graph.nodes.reserve(size_t(g.node_size()));
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto &n = g.node(i);
    if (n.op_type().empty())
      return convert.error("graph.node[" + std::to_string(i) + "] '" +
                               n.name() + "'.op_type",
                           "expected an operator name, found none");
    OnnxNode node;
    node.opType = n.op_type();
    node.name = n.name().empty() ? "#" + std::to_string(i) + ":" + node.opType
                                 : n.name();
    node.domain = n.domain();
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    graph.nodes.push_back(std::move(node));
  }
  return graph;
}

} // namespace

Result<OnnxGraph> adapt::parseOnnxModel(std::string_view bytes,
                                        const std::string &fileForErrors,
                                        const std::string &baseDir) {
  try {
    return parseUnguarded(bytes, fileForErrors, baseDir);
  } catch (const std::exception &e) {
    return InputError{fileForErrors, "", std::string("could not be read: ") +
                                             e.what()};
  } catch (...) {
    return InputError{fileForErrors, "", "could not be read"};
  }
}

Result<OnnxGraph> adapt::readOnnxModel(const std::string &path) {
  try {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return InputError{path, "", "expected an existing .onnx file; " +
                                      std::string(fs::exists(path, ec)
                                                      ? "it is not a file"
                                                      : "it does not exist")};
    uint64_t size = fs::file_size(path, ec);
    if (ec)
      return InputError{path, "", "could not get its size: " + ec.message()};
    if (size > uint64_t(INT_MAX))
      return InputError{path, "",
                        "file is " + std::to_string(size) +
                            " bytes; protobuf cannot parse a ModelProto over "
                            "2147483647 bytes: save the weights as external "
                            "data"};
    std::ifstream stream(path, std::ios::binary);
    std::string bytes(size_t(size), '\0');
    if (!stream || !stream.read(&bytes[0], std::streamsize(size)))
      return InputError{path, "", "could not read " + std::to_string(size) +
                                      " bytes from the file"};
    std::string base = fs::path(path).parent_path().string();
    return parseOnnxModel(bytes, path, base.empty() ? "." : base);
  } catch (const std::exception &e) {
    return InputError{path, "", std::string("could not be read: ") + e.what()};
  } catch (...) {
    return InputError{path, "", "could not be read"};
  }
}
