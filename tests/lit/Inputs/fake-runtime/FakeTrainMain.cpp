// trainMain of the stand-in runtime: prints the ModelDef it was given.
#include "runtime/TrainMain.h"

#include <cstdio>

namespace adapt::rt {
int trainMain(int, char **, const ModelDef &def,
              const std::string &defaultModelDir) {
  int64_t experts = 0;
  for (const LayerDef &l : def.layers)
    experts += l.ffn.experts;
  std::printf("family=%s layers=%zu experts=%lld rank=%lld targets=%zu model=%s\n",
              def.family.c_str(), def.layers.size(), (long long)experts,
              (long long)def.lora.rank, def.lora.targets.size(),
              defaultModelDir.c_str());
  return 0;
}
} // namespace adapt::rt
