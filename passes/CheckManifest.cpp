//===- CheckManifest.cpp - config-implied tensors against the manifest ----===//

#include "ir/AdaptDialect.h"
#include "models/WeightSchema.h"
#include "passes/PassInput.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"

namespace adapt {
#define GEN_PASS_DEF_CHECKMANIFESTPASS
#include "passes/Passes.h.inc"
} // namespace adapt

using namespace mlir;

namespace adapt {
namespace {

/// The checkpoint's quantization, as the importer recorded it.
QuantSpec quantOf(ModelOp model) {
  QuantSpec q;
  auto quant = model->getAttrOfType<QuantAttr>("adapt.quant");
  if (!quant)
    return q;
  q.method = quant.getMethod().str();
  q.format = quant.getFormat().str();
  if (quant.getBlock().size() == 2) {
    q.blockRows = quant.getBlock()[0];
    q.blockCols = quant.getBlock()[1];
  }
  q.groupSize = quant.getGroupSize();
  q.bits = quant.getBits();
  for (StringAttr module : quant.getExcluded())
    q.excluded.push_back(module.str());
  return q;
}

std::string shapeText(llvm::ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// Which component kind owns a weight: MTP and encoder weights may be
/// absent from pruned or text-only checkpoints without being an error.
std::string ownerKind(WeightOp weight, ModelOp model,
                      const llvm::StringMap<std::string> &owners) {
  auto it = owners.find(weight.getSymName());
  return it == owners.end() ? std::string() : it->second;
}

struct CheckManifestPass : impl::CheckManifestPassBase<CheckManifestPass> {
  using CheckManifestPassBase::CheckManifestPassBase;
  explicit CheckManifestPass(AnalysisContext context) : context(context) {}

  void runOnOperation() override {
    std::optional<Manifest> owned;
    mlir::FailureOr<const Manifest *> manifest =
        passInput(context.manifest, manifestPath, owned, readManifest, getOperation());
    if (mlir::failed(manifest))
      return signalPassFailure();
    if (!*manifest)
      return; // Nothing to compare against.
    check(getOperation(), **manifest);
  }

  void check(ModelOp model, const Manifest &manifest) {
    ManifestCheck result;
    result.checked = true;
    result.file = manifest.file;
    result.tensors = manifest.tensors.size();
    result.shards = manifest.shards.size();

    // Tensor name → (shard, seen); header facts when shards were read.
    llvm::StringMap<std::pair<llvm::StringRef, bool>> index;
    llvm::StringMap<std::pair<llvm::StringRef, bool>> sized(manifest.tensors.size());
    index = std::move(sized);
    for (const auto &[name, shard] : manifest.tensors)
      index[name] = {shard, false};
    llvm::StringMap<const TensorHeader *> headers;
    if (context.headers) {
      result.headersRead = context.headers->size();
      for (const ShardHeader &shard : *context.headers)
        for (const TensorHeader &t : shard.tensors)
          headers[t.name] = &t;
    }
    llvm::StringMap<std::string> owners;
    model.walk([&](Operation *op) {
      if (auto weights = op->getAttrOfType<ArrayAttr>("weights"))
        for (Attribute a : weights)
          owners[llvm::cast<FlatSymbolRefAttr>(a).getValue()] =
              op->getName().stripDialect().str();
    });

    QuantSpec quant = quantOf(model);
    std::string dtype = "BF16";
    if (auto d = model->getAttrOfType<StringAttr>("adapt.dtype"))
      dtype = safetensorsDtypeFor(d.str());
    Builder b(model.getContext());
    std::vector<DiskTensor> disk;
    llvm::StringMap<int64_t> absentOptional;
    int64_t expected = 0;
    // A quantization method adapt has never seen stores linear weights in an
    // unknown layout: their tensors are matched by name prefix only, never
    // called missing or mismatched (the adapt.weights component is the gap).
    const bool unseenFormat = !quant.method.empty() && quant.method != "fp8" && quant.method != "mxfp4" &&
                              quant.method != "nvfp4" && quant.method != "compressed-tensors";
    std::vector<llvm::StringRef> sortedNames;
    if (unseenFormat) {
      for (auto &entry : index)
        sortedNames.push_back(entry.first());
      llvm::sort(sortedNames);
    }
    int64_t unchecked = 0;
    for (WeightOp weight : model.getBody().getOps<WeightOp>()) {
      WeightDecl decl;
      decl.name = weight.getSymName().str();
      decl.role = weight.getRole().str();
      decl.linear = weight.getLinear();
      decl.routed = weight.getRouted();
      auto shape = llvm::cast<RankedTensorType>(weight.getType()).getShape();
      int64_t experts = weight.getPerExpert() ? shape.front() : 0;
      decl.shape.assign(shape.begin() + (experts ? 1 : 0), shape.end());
      std::string owner = ownerKind(weight, model, owners);
      bool optional = owner == "mtp" || owner == "encoder";
      llvm::StringRef firstShard;
      for (int64_t e = 0; e < std::max<int64_t>(experts, 1); ++e) {
        disk.clear();
        expandToDisk(decl, e, quant, dtype, disk);
        for (const DiskTensor &t : disk) {
          if (unseenFormat && decl.linear && decl.role != "gate" && decl.role != "router" &&
              decl.role != "lm_head") {
            llvm::StringRef base(t.name);
            if (base.ends_with("weight"))
              base = base.drop_back(6);
            for (auto n = std::lower_bound(sortedNames.begin(), sortedNames.end(), base);
                 n != sortedNames.end() && n->starts_with(base); ++n) {
              auto &seen = index[*n];
              seen.second = true;
              if (firstShard.empty())
                firstShard = seen.first;
            }
            ++unchecked;
            continue;
          }
          ++expected;
          auto it = index.find(t.name);
          if (it == index.end()) {
            if (optional) {
              ++absentOptional[owner];
              --expected;
            }
            else
              result.issues.push_back({"missing", t.name, shapeText(t.shape) + " " + t.dtype, "not in manifest"});
            continue;
          }
          it->second.second = true;
          if (firstShard.empty())
            firstShard = it->second.first;
          auto header = headers.find(t.name);
          if (header == headers.end())
            continue;
          const TensorHeader &h = *header->second;
          if (h.shape != t.shape)
            result.issues.push_back({"shape", t.name, shapeText(t.shape), shapeText(h.shape)});
          if (h.dtype != t.dtype && !(quant.method.empty() && isFloatDtype(h.dtype)))
            result.issues.push_back({"dtype", t.name, t.dtype, h.dtype});
          weight.setDiskDtypeAttr(b.getStringAttr(h.dtype));
        }
      }
      if (!firstShard.empty())
        weight.setShardAttr(b.getStringAttr(firstShard));
    }
    result.expectedTensors = expected;
    for (auto &entry : index)
      if (!entry.second.second)
        result.issues.push_back({"extra", entry.first().str(), "a tensor the config implies", "not recognised"});
    std::sort(result.issues.begin(), result.issues.end(),
              [](const ManifestIssue &a, const ManifestIssue &b) {
                return std::tie(a.kind, a.tensor) < std::tie(b.kind, b.tensor);
              });
    int64_t missing = 0, extra = 0, mismatched = 0;
    for (const ManifestIssue &issue : result.issues) {
      missing += issue.kind == "missing";
      extra += issue.kind == "extra";
      mismatched += issue.kind == "shape" || issue.kind == "dtype";
    }
    NamedAttrList summary;
    summary.append("tensors", b.getI64IntegerAttr(result.tensors));
    summary.append("expected", b.getI64IntegerAttr(expected));
    summary.append("missing", b.getI64IntegerAttr(missing));
    summary.append("extra", b.getI64IntegerAttr(extra));
    summary.append("mismatched", b.getI64IntegerAttr(mismatched));
    model->setAttr("adapt.manifest", b.getDictionaryAttr(summary));
    if (!context.report) {
      size_t shown = 0;
      for (const ManifestIssue &issue : result.issues)
        if (shown++ < 20)
          model.emitWarning() << issue.kind << " tensor " << issue.tensor
                              << ": expected " << issue.expected << ", found "
                              << issue.found;
      return;
    }
    if (unchecked > 0)
      context.report->notes.push_back(
          std::to_string(unchecked) + " linear weight tensors are stored in the quantization format \"" +
          quant.method + "\", which adapt has never seen: their on-disk tensors were matched by name only, "
          "not checked (the adapt.weights component is missing)");
    for (auto &entry : absentOptional)
      context.report->notes.push_back(
          "the config declares " + entry.first().str() + " weights (" +
          std::to_string(entry.second) +
          " tensors) that this checkpoint does not contain; they are counted "
          "in parameters." + entry.first().str() + " but cannot be trained");
    context.report->manifest = std::move(result);
  }

  static bool isFloatDtype(llvm::StringRef dtype) {
    return dtype == "BF16" || dtype == "F16" || dtype == "F32";
  }

  AnalysisContext context;
};

} // namespace

std::unique_ptr<Pass> createCheckManifestPass(AnalysisContext context) {
  return std::make_unique<CheckManifestPass>(context);
}

} // namespace adapt
