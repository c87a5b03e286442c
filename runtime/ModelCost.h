//===- ModelCost.h - forward FLOPs of a model's parts -----------*- C++ -*-===//
//
// Forward FLOPs per token of each decoder layer and of the LM head, read from
// the ModelDef alone (no weights): the trainer's MFU and the pipeline's stage
// boundaries (hybrid models have layers of very different cost) use them.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_MODELCOST_H
#define ADAPT_RUNTIME_MODELCOST_H

#include "runtime/ModelDef.h"

#include <cstdint>
#include <vector>

namespace adapt::rt {

/// Forward FLOPs per token of decoder layer \p layer at sequence length
/// \p seqLen: 2 per multiply-add of every weight a token meets (routed
/// experts: the top-k it is sent to), plus attention's score and value work.
double layerFlopsPerToken(const ModelDef &def, const LayerDef &layer, int64_t seqLen);

/// Forward FLOPs per token of the LM head (vocab x hidden).
double headFlopsPerToken(const ModelDef &def);

/// Pipeline stages: PP + 1 layer boundaries (stage s runs layers
/// [b[s], b[s+1])), contiguous, each stage at least one layer, chosen to
/// make the most expensive stage as cheap as possible. The LM head counts
/// on the last stage. Requires 1 <= PP <= layer count.
std::vector<int64_t> pipelineBoundaries(const ModelDef &def, int64_t pp, int64_t seqLen);

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_MODELCOST_H
