//===- Distributed.h - process groups of a parallel training run -*- C++ -*-===//
//
// A generated trainer runs as one process per device, started by torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST), or alone when
// neither set any variable. The processes meet through PyTorch's TCPStore and
// talk through PyTorch's c10d backends from the LibTorch the runtime links:
// ProcessGroupNCCL on CUDA, ProcessGroupGloo on CPU. No c10d header is
// included here, so the layers and the trainer compile without them.
//
// Layout (docs/parallel.md): world = tp * cp * ep * dp * pp, ranks ordered
// with tp fastest, then cp, ep, dp, pp. A TP group splits attention heads and
// MLP widths and sees the same data. Data ranks (ep * dp of them) take
// disjoint slices of each global batch; an expert-parallel group (ep ranks
// that share dp and pp) splits every MoE layer's routed experts between its
// members and exchanges tokens all-to-all; ranks with the same expert slice
// (the expert-data group) average those experts' adapter gradients.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_RUNTIME_DISTRIBUTED_H
#define ADAPT_RUNTIME_DISTRIBUTED_H

#include "runtime/ModelDef.h"

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace adapt::rt {

/// Where this process stands, as its launcher said.
struct LaunchInfo {
  int rank = 0, worldSize = 1, localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string launcher = "none"; ///< "torchrun", "slurm" or "none".
};

/// Reads the launcher's variables (torchrun's first, then Slurm's). Throws
/// BadInput naming the variable when one is malformed or inconsistent.
LaunchInfo launchFromEnvironment();

/// First host of a Slurm node list: "gpu[03-05,7],cpu1" -> "gpu03".
std::string firstSlurmHost(const std::string &nodeList);

/// Parallel sizes of a run (the --tp/--ep/--pp/--dp/--cp flags).
struct Layout {
  int64_t tp = 1, ep = 1, pp = 1, dp = 1, cp = 1;
  int64_t product() const { return tp * ep * pp * dp * cp; }
  /// Ranks that read different data: ep * dp.
  int64_t dataRanks() const { return ep * dp; }
  /// "TP1xEP2xPP1xDP2xCP1"-style text for messages and metrics.
  std::string text() const;
};

/// Checks LAYOUT before any weight is read: every size >= 1, their product is
/// the world size, EP divides every MoE layer's expert count, TP divides the
/// attention heads and the dense/shared MLP widths of layers it can split
/// (softmax GQA/MHA; other token mixers are refused under TP), PP is at most
/// the layer count, the data ranks divide the batch, CP divides the sequence
/// length and every token mixer can be split by it (not generated
/// attention or RoPE operators). Throws BadInput naming the flag and the
/// expectation.
void checkLayout(const Layout &layout, int worldSize, const ModelDef &def, int64_t batch, int64_t seqLen);

/// One process group's collectives; tensors on the run's device.
class Collectives {
public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sums each tensor in place across the group.
  virtual void allReduceSum(std::vector<torch::Tensor> &tensors) = 0;
  /// Rows of X [R, ...] sent in consecutive blocks of SEND[i] rows to member
  /// i; returns the blocks received, RECV[i] rows from member i, in order.
  virtual torch::Tensor allToAll(const torch::Tensor &x, const std::vector<int64_t> &send,
                                 const std::vector<int64_t> &recv) = 0;
  /// Every member's X (same shape everywhere), in member order.
  virtual std::vector<torch::Tensor> allGather(const torch::Tensor &x) = 0;
  virtual void barrier() = 0;
  /// Point-to-point, for pipeline stages: starts sending X to member PEER
  /// under TAG and returns at once; waitSends() waits for every send started.
  virtual void send(const torch::Tensor &x, int peer, int tag) = 0;
  virtual void waitSends() = 0;
  /// Receives a tensor of SHAPE and OPTIONS sent by member PEER under TAG.
  virtual torch::Tensor recv(const std::vector<int64_t> &shape, const torch::TensorOptions &options,
                             int peer, int tag) = 0;
};

/// The process groups of one run.
class Distributed {
public:
  /// Joins the run LAUNCH describes with LAYOUT (checked already), on DEVICE:
  /// NCCL for CUDA, gloo for CPU. Collectives that wait longer than TIMEOUT
  /// (a rank died or hangs) throw, and every rank exits with an error.
  static std::shared_ptr<Distributed> join(const LaunchInfo &launch, const Layout &layout,
                                           torch::Device device, std::chrono::seconds timeout);
  virtual ~Distributed() = default;

  const LaunchInfo &launch() const { return launchInfo; }
  const Layout &layout() const { return sizes; }
  int rank() const { return launchInfo.rank; }
  /// This rank's index among the data ranks, its EP index and its TP index.
  int64_t dataRank() const { return dataIndex; }
  int64_t expertRank() const { return expertIndex; }
  int64_t tensorRank() const { return tensorIndex; }
  /// This rank's pipeline stage, 0 .. pp-1.
  int64_t pipelineRank() const { return pipelineIndex; }
  /// This rank's part of every sequence, 0 .. cp-1.
  int64_t contextRank() const { return contextIndex; }

  /// Every rank of the run.
  virtual Collectives &world() = 0;
  /// The ranks that see different tokens with this rank's tp/pp position:
  /// the data ranks and the context ranks (dense adapters' gradients, loss
  /// and token counts are summed over them).
  virtual Collectives &data() = 0;
  /// This rank's expert-parallel group (ep members).
  virtual Collectives &expert() = 0;
  /// The ranks holding this rank's expert slice (dp * cp members).
  virtual Collectives &expertData() = 0;
  /// This rank's context-parallel group (cp members, parts of the same sequences).
  virtual Collectives &context() = 0;
  /// This rank's tensor-parallel group (tp members, the same data).
  virtual Collectives &tensor() = 0;
  /// This rank's pipeline: the pp ranks with its tp/cp/ep/dp position, in
  /// stage order (activations forward, their gradients back).
  virtual Collectives &pipeline() = 0;

protected:
  LaunchInfo launchInfo;
  Layout sizes;
  int64_t dataIndex = 0, expertIndex = 0, tensorIndex = 0, pipelineIndex = 0, contextIndex = 0;
};

} // namespace adapt::rt

#endif // ADAPT_RUNTIME_DISTRIBUTED_H
