//===- ImportOnnx.cpp - an ONNX graph into the adapt dialect --------------===//

#include "ir/ImportOnnx.h"
#include "ir/AdaptDialect.h"
#include "parser/OnnxModel.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSwitch.h"

#include <map>

using namespace mlir;

namespace adapt {
namespace {
/// The MLIR element type of an initializer's dtype (safetensors spelling):
/// floats as they are, 64- and 32-bit integers by width, anything else i8.
Type elementTypeFor(OpBuilder &b, const std::string &dtype) {
  return llvm::StringSwitch<Type>(dtype)
      .Case("F32", b.getF32Type())
      .Case("F16", b.getF16Type())
      .Case("BF16", b.getBF16Type())
      .Case("F64", b.getF64Type())
      .Cases("I64", "U64", b.getI64Type())
      .Cases("I32", "U32", b.getI32Type())
      .Default(b.getI8Type());
}
} // namespace

Result<OwningOpRef<ModuleOp>> importOnnxModel(MLIRContext &context,
                                              const std::string &path,
                                              std::string &architecture) {
  Result<OnnxGraph> graph = readOnnxModel(path);
  if (!graph)
    return graph.error();
  std::vector<OnnxComponent> components = mapOnnxGraph(graph.value());
  std::map<std::string, const OnnxTensorInfo *> initializers;
  for (const OnnxTensorInfo &t : graph->initializers)
    initializers[t.name] = &t;

  // The embedding table gives vocab and hidden; without one, stay generic.
  int64_t vocab = 1, hidden = 1;
  for (const OnnxComponent &c : components)
    if (c.kind == "embedding" && !c.weights.empty())
      if (const OnnxTensorInfo *t = initializers[c.weights.front()];
          t && t->shape.size() == 2) {
        vocab = t->shape[0];
        hidden = t->shape[1];
      }
  architecture = graph->producer.empty() ? "ONNX graph" : graph->producer;

  context.getOrLoadDialect<AdaptDialect>();
  OpBuilder b(&context);
  Location loc = FileLineColLoc::get(&context, path, 1, 1);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto model = b.create<ModelOp>(loc, "onnx", "onnx", "onnx", hidden, vocab, /*architecture=*/"",
                                 /*parallel_layout=*/DenseI64ArrayAttr(), /*recompute=*/false);
  Block *body = b.createBlock(&model.getBody());
  Value x = body->addArgument(
      RankedTensorType::get({ShapedType::kDynamic}, b.getI64Type()), loc);
  b.setInsertionPointToStart(body);

  std::map<std::string, bool> declared;
  auto weightsOf = [&](const OnnxComponent &c) {
    llvm::SmallVector<Attribute> refs;
    for (const std::string &name : c.weights) {
      const OnnxTensorInfo *t = initializers[name];
      if (!t)
        continue;
      if (!declared[name]) {
        declared[name] = true;
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(body);
        std::string role = c.kind == "embedding" ? "embed_tokens" : name;
        auto type = RankedTensorType::get(t->shape, elementTypeFor(b, t->dtype));
        b.create<WeightOp>(loc, name, type, role, false, false,
                           c.kind == "linear" || c.kind == "lm_head",
                           StringAttr(), StringAttr(), DictionaryAttr());
      }
      refs.push_back(FlatSymbolRefAttr::get(&context, name));
    }
    return b.getArrayAttr(refs);
  };

  auto act = [&](int64_t width) {
    return RankedTensorType::get({ShapedType::kDynamic, width}, b.getF32Type());
  };
  llvm::SmallVector<Value> outputs;
  for (const OnnxComponent &c : components) {
    ArrayAttr weights = weightsOf(c);
    int64_t count = std::max<int64_t>(1, c.nodes.size());
    if (c.kind == "embedding") {
      x = b.create<EmbeddingOp>(loc, act(hidden), ValueRange{x}, -1, weights);
    } else if (c.kind == "rms_norm") {
      x = b.create<RMSNormOp>(loc, act(hidden), ValueRange{x}, -1, weights,
                              llvm::APFloat(1e-6));
    } else if (c.kind == "lm_head") {
      x = b.create<LMHeadOp>(loc, act(vocab), ValueRange{x}, -1, weights,
                             false);
    } else if (c.kind == "unmapped") {
      x = b.create<UnmappedOp>(loc, act(hidden), ValueRange{x}, -1, weights,
                               c.domain.empty() ? "ai.onnx" : c.domain,
                               c.opType, count);
    } else {
      x = b.create<GenericComponentOp>(loc, act(hidden), ValueRange{x}, -1,
                                       weights, c.kind, count);
    }
  }
  outputs.push_back(x);
  b.create<OutputOp>(loc, outputs);
  return module;
}

} // namespace adapt
