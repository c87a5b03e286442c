//===- FuzzConfig.cpp - libFuzzer target for the config reader ------------===//
//
// Any bytes as config.json: the reader must return a ModelSpec or an
// InputError, never crash, hang or throw.
//
//===----------------------------------------------------------------------===//

#include "models/WeightSchema.h"
#include "parser/ConfigReader.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  adapt::Result<adapt::ModelSpec> spec =
      adapt::parseModelConfig(text, "fuzz/config.json");
  // Declaring weights must also cope with whatever shapes got through, but
  // stays bounded: skip configs that would declare huge layer counts.
  if (spec.ok() && spec->layers.size() <= 64)
    (void)adapt::declareModel(spec.value());
  return 0;
}
