//===- Validate.cpp - the model stage of the validation ladder ------------===//

#include "runtime/Validate.h"

#include "runtime/Errors.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"
#include "runtime/SafetensorsIO.h"
#include "runtime/Sha256.h"

#include <cstdio>
#include <map>
#include <sstream>

namespace adapt::rt {

namespace {

/// One comparison of the record.
struct Check {
  std::string name;      ///< "logits", "loss", "grad <key>", "layers.3.ffn", "experts"
  std::string metric;    ///< how the error is measured
  double error = 0.0;
  double tolerance = 0.0;
  bool pass = false;
  std::string where;     ///< index of the worst element, or a note
};

/// max |ours - ref| / max |ref|, and the flat index of the worst element.
std::pair<double, int64_t> relMax(const torch::Tensor &ours, const torch::Tensor &ref) {
  torch::Tensor a = ours.detach().to(torch::kCPU, torch::kFloat64).reshape({-1});
  torch::Tensor b = ref.detach().to(torch::kCPU, torch::kFloat64).reshape({-1});
  if (a.numel() != b.numel())
    return {std::numeric_limits<double>::infinity(), -1};
  torch::Tensor diff = (a - b).abs();
  // NaN never passes: a NaN difference becomes infinite error.
  diff = torch::where(torch::isnan(diff), torch::full_like(diff, INFINITY), diff);
  int64_t worst = diff.argmax().item<int64_t>();
  double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return {diff[worst].item<double>() / scale, worst};
}

/// ||ours - ref|| / ||ref||.
double relNorm(const torch::Tensor &ours, const torch::Tensor &ref) {
  torch::Tensor a = ours.detach().to(torch::kCPU, torch::kFloat64), b = ref.detach().to(torch::kCPU, torch::kFloat64);
  if (a.sizes() != b.sizes())
    return std::numeric_limits<double>::infinity();
  double err = (a - b).norm().item<double>();
  return std::isnan(err) ? INFINITY : err / std::max(b.norm().item<double>(), 1e-30);
}

std::string format(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

} // namespace

int validateModelStage(Model &model, const std::string &modelDir, const std::string &fixtureDir,
                       const std::string &outDir) {
  const std::string metaPath = joinPath(fixtureDir, "fixture.json");
  const std::string dataPath = joinPath(fixtureDir, "fixture.safetensors");
  for (const std::string &p : {metaPath, dataPath})
    if (!isRegularFile(p))
      throw badInput(p, "fixture", "expected a reference fixture (validation/make_fixture.py) here");
  JsonValue meta = readJsonFile(metaPath);
  // The fixture must come from exactly these weights.
  const JsonValue *files = meta.find("model_files");
  if (!files || !files->isObject())
    throw badInput(metaPath, "model_files", "expected the SHA-256 of every model file");
  for (const auto &[name, hash] : files->asObject()) {
    std::string path = joinPath(modelDir, name);
    std::string actual = isRegularFile(path) ? sha256File(path) : "missing";
    if (actual != hash.asString())
      throw badInput(metaPath, "model_files." + name,
                     "expected the fixture to be made from " + modelDir + ", but " + name +
                         (actual == "missing" ? " is missing there" : " has other contents (fixture from another model)"));
  }
  SafetensorsFile fixture(dataPath);
  auto ref = [&](const std::string &name) {
    if (!fixture.find(name))
      throw badInput(dataPath, name, "expected this tensor in the fixture");
    return fixture.view(name).to(torch::kFloat32);
  };
  // The fixture's initial adapter must be exactly the trainer's adapter set.
  std::vector<AdapterTensor> adapters = model.adapters();
  std::map<std::string, torch::Tensor> byKey;
  for (const AdapterTensor &a : adapters)
    byKey[a.peftKey] = a.value;
  for (const TensorInfo &t : fixture.tensors())
    if (t.name.rfind("base_model.", 0) == 0 && t.name.find(".grad") == std::string::npos && !byKey.count(t.name))
      throw badInput(dataPath, t.name, "expected the trainer to have this adapter (build it with the fixture's LoRA targets)");
  {
    torch::NoGradGuard noGrad;
    for (AdapterTensor &a : adapters) {
      torch::Tensor init = ref(a.peftKey);
      if (init.sizes() != a.value.sizes())
        throw badInput(dataPath, a.peftKey, "expected the trainer's adapter shape (same rank and targets)");
      a.value.copy_(init);
    }
  }
  torch::Tensor ids = fixture.view("input_ids").to(torch::kInt64).clone();
  // A family with a vision tower: the fixture's images go through it.
  ImageInput images;
  if (fixture.find("pixel_values")) {
    if (!fixture.find("image_grid_thw"))
      throw badInput(dataPath, "image_grid_thw", "expected the images' grids next to pixel_values");
    images.pixels = fixture.view("pixel_values").to(torch::kFloat32).clone();
    images.gridThw = fixture.view("image_grid_thw").to(torch::kInt64).clone();
  }
  std::vector<std::pair<std::string, torch::Tensor>> activations;
  model.captureActivations(&activations);
  torch::Tensor loss = model.loss(ids, ids, images);
  model.captureActivations(nullptr);
  loss.backward();
  activations.clear();
  model.captureActivations(&activations);
  torch::Tensor logits;
  {
    torch::NoGradGuard noGrad;
    logits = model.logits(ids, images);
  }
  model.captureActivations(nullptr);

  const double tol = 1e-4; // fp32 against fp32: measured ~1e-6
  std::vector<Check> checks;
  auto add = [&](std::string name, std::string metric, double err, std::string where = "") {
    checks.push_back({std::move(name), std::move(metric), err, tol, err <= tol, std::move(where)});
  };
  auto [logitErr, worst] = relMax(logits, ref("logits"));
  add("logits", "max|d|/max|ref|", logitErr, "flat index " + std::to_string(worst));
  add("loss", "|d|/|ref|", relMax(loss.reshape({1}), ref("loss")).first);
  std::string firstDivergence;
  for (const auto &[name, value] : activations) {
    double err = relMax(value, ref(name)).first;
    add(name, "max|d|/max|ref|", err);
    if (err > tol && firstDivergence.empty())
      firstDivergence = name;
  }
  for (const AdapterTensor &a : adapters) {
    torch::Tensor g = a.value.grad().defined() ? a.value.grad() : torch::zeros_like(a.value);
    add("grad " + a.peftKey, "||d||/||ref||", relNorm(g, ref(a.peftKey + ".grad")));
  }
  // Every routed expert that received tokens must have got a gradient.
  std::vector<std::string> frozen, idle;
  for (const Model::ExpertGradient &e : model.expertGradients()) {
    std::string id = "layer " + std::to_string(e.layer) + " expert " + std::to_string(e.expert);
    if (e.tokens == 0)
      idle.push_back(id);
    else if (!(e.gradNorm > 0.0))
      frozen.push_back(id);
  }
  checks.push_back({"experts", "routed experts with tokens but no adapter gradient", double(frozen.size()), 0.0,
                    frozen.empty(),
                    (frozen.empty() ? std::string("none") : frozen.front()) + "; without tokens: " +
                        (idle.empty() ? std::string("none") : std::to_string(idle.size()) + " (" + idle.front() + ", ...)")});

  bool passed = true;
  for (const Check &c : checks)
    passed &= c.pass;
  // Records: JSON for tools, Markdown for people.
  JsonValue list = JsonValue::array();
  for (const Check &c : checks)
    list.push(JsonValue::object({{"name", c.name}, {"metric", c.metric}, {"error", c.error},
                                 {"tolerance", c.tolerance}, {"pass", c.pass}, {"where", c.where}}));
  std::string exe = canonicalPath("/proc/self/exe");
  JsonValue record = JsonValue::object({
      {"stage", "model"},
      {"passed", passed},
      {"first_divergence", firstDivergence},
      {"model_dir", absolutePath(modelDir)},
      {"model_files", *files},
      {"fixture", JsonValue::object({{"dir", absolutePath(fixtureDir)}, {"sha256", sha256File(dataPath)},
                                      {"reference", meta.find("reference") ? *meta.find("reference") : JsonValue()}})},
      {"code", JsonValue::object({{"trainer", exe}, {"sha256", sha256File(exe)}})},
      {"dtype", "float32"},
      {"device", "cpu"},
      {"checks", std::move(list)},
  });
  createDirectories(outDir);
  writeFileAtomic(joinPath(outDir, "model-stage.json"), record.dump(2) + "\n");
  std::ostringstream md;
  md << "# Model stage: " << (passed ? "passed" : "FAILED") << "\n\n"
     << "Model `" << modelDir << "` against fixture `" << fixtureDir << "` (transformers + PEFT, fp32).\n\n";
  if (!firstDivergence.empty())
    md << "First divergence: **" << firstDivergence << "**\n\n";
  md << "| check | metric | error | tolerance | result | where |\n|---|---|---:|---:|---|---|\n";
  for (const Check &c : checks)
    md << "| " << c.name << " | " << c.metric << " | " << format(c.error) << " | " << format(c.tolerance) << " | "
       << (c.pass ? "pass" : "**FAIL**") << " | " << c.where << " |\n";
  writeFileAtomic(joinPath(outDir, "model-stage.md"), md.str());
  // The table people see: failures and the headline checks.
  std::printf("%-70s %10s %10s  %s\n", "check", "error", "tolerance", "result");
  for (const Check &c : checks)
    if (!c.pass || c.name == "logits" || c.name == "loss" || c.name == "experts")
      std::printf("%-70s %10s %10s  %s\n", c.name.substr(0, 70).c_str(), format(c.error).c_str(),
                  format(c.tolerance).c_str(), c.pass ? "pass" : "FAIL");
  std::printf("%zu checks, %s%s\n", checks.size(), passed ? "all passed" : "FAILED",
              firstDivergence.empty() ? "" : ("; first divergence: " + firstDivergence).c_str());
  return passed ? 0 : kExitCheckFailed;
}

} // namespace adapt::rt
