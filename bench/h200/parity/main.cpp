#include "runtime/Model.h"
#include "runtime/SafetensorsIO.h"
#include <fstream>
#include <iostream>
adapt::rt::ModelDef buildModel();
using namespace adapt::rt;
// Forward parity against transformers + PEFT: builds the generated model,
// fills every adapter with random values, exports them in PEFT's layout and
// writes logits for fixed ids; compare.py runs the reference on the same.
// usage: parity MODEL_DIR OUT_DIR [cpu|cuda] [fp32|bf16]
int main(int argc, char **argv) {
  ModelDef def = buildModel();
  ModelOptions o;
  if (argc > 3 && std::string(argv[3]) == "cuda") o.device = torch::kCUDA;
  if (argc > 4 && std::string(argv[4]) == "bf16") o.dtype = torch::kBFloat16;
  Model model(def, argv[1], o);
  { torch::NoGradGuard g; torch::manual_seed(1); for (auto &a : model.adapters()) a.value.uniform_(-0.1, 0.1); }
  std::string out = argv[2];
  std::vector<std::pair<std::string, torch::Tensor>> ts;
  for (auto &a : model.adapters()) ts.push_back({a.peftKey, a.value.detach()});
  system(("mkdir -p " + out + "/adapter").c_str());
  writeSafetensors(out + "/adapter/adapter_model.safetensors", ts);
  std::ofstream(out + "/adapter/adapter_config.json") << model.peftConfigJson(argv[1]);
  torch::Tensor ids = (torch::arange(0, 40, torch::kInt64) * 7 + 3).remainder(def.vocab).view({2, 20});
  torch::Tensor logits = model.logits(ids);
  auto loss = model.loss(ids, ids); loss.backward();
  int nan = 0; for (auto &a : model.adapters()) if (!a.value.grad().defined() || !torch::isfinite(a.value.grad()).all().item<bool>()) ++nan;
  std::cerr << "adapters " << model.adapters().size() << " bad grads " << nan << " loss " << loss.item<float>() << "\n";
  writeSafetensors(out + "/logits.safetensors", {{"input_ids", ids.cpu()}, {"logits", logits.detach().cpu()}});
}
