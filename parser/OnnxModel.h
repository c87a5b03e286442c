//===- OnnxModel.h - an ONNX model file as plain data -----------*- C++ -*-===//
//
// Reads an ONNX ModelProto (`.onnx`, tensors inline or stored as external
// data) into plain C++ data and maps its top-level graph onto the component
// kinds of the `adapt` operator library, so that the gap analysis can report
// the operators nothing in the library can train yet. Plain data with no MLIR
// in it; the protobuf classes stay inside OnnxModel.cpp so that users of this
// header do not need the ONNX headers.
//
// The reader checks external data without reading it: the file must exist
// inside the model's folder and offset + length must fit in its size.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PARSER_ONNXMODEL_H
#define ADAPT_PARSER_ONNXMODEL_H

#include "parser/InputError.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace adapt {

/// One tensor the graph names: an initializer (a weight or constant, with its
/// storage) or a graph input/output (type and shape only).
struct OnnxTensorInfo {
  /// Tensor name as the graph spells it.
  std::string name;
  /// Element type, safetensors-style: F32, BF16, F16, F64, I64, I32, I16, I8,
  /// U8, U16, U32, U64, BOOL, C64, C128, F8_E4M3, F8_E4M3FNUZ, F8_E5M2,
  /// F8_E5M2FNUZ, F8_E8M0, U4, I4, F4, U2, I2, STRING; "" for a graph
  /// input/output whose type is not a tensor or is left undefined.
  std::string dtype;
  /// Dimensions; -1 for a symbolic or unknown dimension of an input/output.
  /// Empty for a scalar, and for an input/output the file gives no shape.
  std::vector<int64_t> shape;
  /// External data file, relative to the model's folder ("" when inline).
  std::string externalFile;
  /// Byte offset of the tensor's bytes in externalFile.
  uint64_t offset = 0;
  /// Byte length of the tensor in externalFile (its computed size when the
  /// file leaves `length` out).
  uint64_t length = 0;
  /// True when the bytes live in externalFile rather than in the .onnx file.
  bool external = false;
};

/// One operator application of the top-level graph. Subgraphs (If/Loop
/// bodies) are not flattened: their parent node stands for them.
struct OnnxNode {
  /// Node name; `#<index>:<opType>` when the file leaves it empty, so that
  /// reports can always point at a node.
  std::string name;
  /// Operator name, e.g. "MatMul".
  std::string opType;
  /// Operator domain as written: "" (or "ai.onnx") is the standard domain.
  std::string domain;
  /// Input value names in order; "" marks an omitted optional input.
  std::vector<std::string> inputs;
  /// Output value names in order; "" marks an omitted optional output.
  std::vector<std::string> outputs;
};

/// The parts of one ONNX model the gap analysis needs.
struct OnnxGraph {
  /// Path of the file it was read from (used in error messages).
  std::string file;
  /// ModelProto.ir_version.
  int64_t irVersion = 0;
  /// Opset version of the standard domain ("" / "ai.onnx"); 0 if not imported.
  int64_t opset = 0;
  /// producer_name, plus " " and producer_version when the file has one.
  std::string producer;
  /// Nodes of the top-level graph in file (topological) order.
  std::vector<OnnxNode> nodes;
  /// Initializers, then sparse initializers (their dense shape), file order.
  std::vector<OnnxTensorInfo> initializers;
  /// Graph inputs that are not initializers (IR < 4 lists weights as inputs).
  std::vector<OnnxTensorInfo> inputs;
  /// Graph outputs.
  std::vector<OnnxTensorInfo> outputs;
};

/// Reads and checks the ONNX model at `path`; external data is resolved
/// against the model's folder. Never throws.
Result<OnnxGraph> readOnnxModel(const std::string &path);

/// Parses `bytes` as a serialized ModelProto. `fileForErrors` names the input
/// in errors; external data locations are resolved against
/// `baseDirForExternalData` ("" means the current directory) and must stay
/// inside it. Never throws and never reads external tensor bytes.
Result<OnnxGraph> parseOnnxModel(std::string_view bytes,
                                 const std::string &fileForErrors,
                                 const std::string &baseDirForExternalData);

/// One group of graph nodes that maps onto one library component kind (or
/// onto none: kind "unmapped").
struct OnnxComponent {
  /// embedding|linear|rms_norm|layer_norm|attention|rotary|activation|
  /// elementwise|shape|softmax|moe_gate|lm_head|unmapped.
  std::string kind;
  /// The ONNX op type; for a recognised multi-node pattern its ops joined
  /// with '+' in graph order (e.g. "Pow+ReduceMean+Add+Sqrt+Reciprocal+Mul").
  std::string opType;
  /// Domain of opType as the file writes it ("" is the standard domain).
  std::string domain;
  /// Names of the nodes in the component, graph order. Aggregated kinds
  /// (activation, elementwise, shape, softmax, unmapped) hold every node of
  /// the same op in the graph, so nodes.size() is its count.
  std::vector<std::string> nodes;
  /// Initializer names the component consumes, first use order, no repeats;
  /// includes weights reached through Transpose/Cast/Reshape-like glue.
  std::vector<std::string> weights;
  /// Sum of numel of the weights this component is the first to consume: an
  /// initializer shared by several components (tied embeddings) counts once
  /// in the whole graph, in the first component (graph order) using it.
  int64_t parameters = 0;
  /// For kind "unmapped": why ("no library op for ONNX <domain>::<op_type>").
  std::string reason;
};

/// Maps the graph's nodes onto library component kinds (rules table in
/// OnnxComponents.cpp). Every node lands in exactly one component;
/// components come in the graph order of their first node. Never throws;
/// tolerates graphs that are not well formed (cycles, dangling names).
std::vector<OnnxComponent> mapOnnxGraph(const OnnxGraph &graph);

} // namespace adapt

#endif // ADAPT_PARSER_ONNXMODEL_H
