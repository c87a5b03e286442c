//===- Distributed.cpp - process groups on PyTorch's c10d -----------------===//
//
// The only file that includes c10d's headers. Gloo needs its own headers,
// which the pip wheel lacks (Debian's libgloo-dev matches the wheel's
// bundled gloo, see docs/parallel.md): ADAPT_WITH_GLOO says they were found.
// ADAPT_WITH_NCCL says NCCL's header was found next to a CUDA LibTorch.
//
//===----------------------------------------------------------------------===//

#include "runtime/Distributed.h"
#include "runtime/Errors.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef ADAPT_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef ADAPT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <set>

namespace adapt::rt {

namespace {

const char *env(const char *name) {
  const char *value = std::getenv(name);
  return value && *value ? value : nullptr;
}

/// An integer environment variable in [LOW, HIGH]; BadInput otherwise.
int envInt(const char *name, int low, int high) {
  const char *text = env(name);
  char *end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < low || value > high)
    throw badInput("", name,
                   "expected an integer in " + std::to_string(low) + ".." + std::to_string(high) +
                       " but got '" + text + "'");
  return static_cast<int>(value);
}

/// Waits for WORK; a failure (a peer's connection reset, NCCL's watchdog,
/// gloo's timeout, each with its own exception type) becomes one error with
/// exit code 7, so every rank stops with the same clear message.
void finish(const c10::intrusive_ptr<c10d::Work> &work) {
  try {
    work->wait();
  } catch (const std::exception &e) {
    std::string what = e.what();
    if (size_t nl = what.find('\n'); nl != std::string::npos)
      what.resize(nl);
    throw RuntimeError("", "parallel run", "another rank failed or timed out: " + what,
                       kExitPeerFailed);
  }
}

/// One c10d backend seen through Collectives.
class BackendCollectives : public Collectives {
public:
  BackendCollectives(c10::intrusive_ptr<c10d::Backend> backend, torch::Device device)
      : backend(std::move(backend)), device(device) {}
  int rank() const override { return backend->getRank(); }
  int size() const override { return backend->getSize(); }

  void allReduceSum(std::vector<torch::Tensor> &tensors) override {
    if (tensors.empty())
      return;
    // One flat buffer per call on the group's device (NCCL takes CUDA
    // tensors only): one collective, whatever the tensor count.
    std::vector<torch::Tensor> flat = {torch::cat(flatten(tensors)).to(device)};
    finish(backend->allreduce(flat));
    int64_t offset = 0;
    for (torch::Tensor &t : tensors) {
      t.copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }

  torch::Tensor allToAll(const torch::Tensor &x, const std::vector<int64_t> &send,
                         const std::vector<int64_t> &recv) override {
    int64_t rows = 0;
    for (int64_t r : recv)
      rows += r;
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = rows;
    torch::Tensor in = x.to(device).contiguous();
    torch::Tensor out = torch::empty(shape, in.options());
    std::vector<int64_t> sendSplits = send, recvSplits = recv;
    finish(backend->alltoall_base(out, in, recvSplits, sendSplits));
    return out.to(x.device());
  }

  std::vector<torch::Tensor> allGather(const torch::Tensor &x) override {
    std::vector<torch::Tensor> in = {x.to(device).contiguous()};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int i = 0; i < size(); ++i)
      out[0].push_back(torch::empty_like(in[0]));
    finish(backend->allgather(out, in));
    for (torch::Tensor &t : out[0])
      t = t.to(x.device());
    return out[0];
  }

  void barrier() override { finish(backend->barrier()); }

  void send(const torch::Tensor &x, int peer, int tag) override {
    // The buffer lives until its send is waited for.
    std::vector<torch::Tensor> buffer = {x.detach().to(device).contiguous()};
    pending.emplace_back(backend->send(buffer, peer, tag), buffer[0]);
  }

  void waitSends() override {
    for (auto &[work, buffer] : pending)
      finish(work);
    pending.clear();
  }

  torch::Tensor recv(const std::vector<int64_t> &shape, const torch::TensorOptions &options, int peer,
                     int tag) override {
    std::vector<torch::Tensor> buffer = {torch::empty(shape, options.device(device))};
    finish(backend->recv(buffer, peer, tag));
    return buffer[0].to(options.device());
  }

private:
  static std::vector<torch::Tensor> flatten(const std::vector<torch::Tensor> &tensors) {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor &t : tensors)
      out.push_back(t.reshape({-1}));
    return out;
  }

  c10::intrusive_ptr<c10d::Backend> backend;
  torch::Device device; ///< Where the backend wants tensors (CUDA for NCCL).
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, torch::Tensor>> pending; ///< Sends in flight.
};

class C10dDistributed : public Distributed {
public:
  Collectives &world() override { return *worldGroup; }
  Collectives &data() override { return *dataGroup; }
  Collectives &expert() override { return *expertGroup; }
  Collectives &expertData() override { return *expertDataGroup; }
  Collectives &tensor() override { return *tensorGroup; }
  Collectives &pipeline() override { return *pipelineGroup; }
  Collectives &context() override { return *contextGroup; }

  std::unique_ptr<Collectives> worldGroup, dataGroup, expertGroup, expertDataGroup, tensorGroup,
      pipelineGroup, contextGroup;
  c10::intrusive_ptr<c10d::Store> store;
  torch::Device device = torch::kCPU;
  std::chrono::seconds timeout{300};

  /// A backend over RANKS (sorted world ranks containing this one), with
  /// its own key space NAME in the store.
  std::unique_ptr<Collectives> group(const std::string &name, const std::vector<int> &ranks) {
    int me = -1;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == launchInfo.rank)
        me = static_cast<int>(i);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
    const int size = static_cast<int>(ranks.size());
    if (device.is_cuda()) {
#ifdef ADAPT_WITH_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      return std::make_unique<BackendCollectives>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, me, size, options), device);
#else
      throw badInput("", "--device",
                     "expected NCCL for a parallel CUDA run, but this runtime was built without "
                     "NCCL's header (nccl.h); rebuild it where NCCL is installed");
#endif
    }
#ifdef ADAPT_WITH_GLOO
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
        launchInfo.launcher == "none" ? "127.0.0.1" : hostForGloo()));
    return std::make_unique<BackendCollectives>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, me, size, options), torch::Device(torch::kCPU));
#else
    throw badInput("", "--device",
                   "expected gloo for a parallel CPU run, but this runtime was built without "
                   "gloo's headers (Debian: libgloo-dev); rebuild it with them");
#endif
  }

  /// The address gloo binds on: this host's name, resolvable by the others
  /// on a cluster; loopback when every rank runs here (MASTER_ADDR local).
  std::string hostForGloo() const {
    const std::string &m = launchInfo.masterAddr;
    if (m == "127.0.0.1" || m == "localhost" || m == "::1")
      return "127.0.0.1";
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return name;
  }
};

} // namespace

std::string firstSlurmHost(const std::string &nodeList) {
  // The first entry ends at a comma outside brackets.
  size_t depth = 0, end = nodeList.size();
  for (size_t i = 0; i < nodeList.size(); ++i) {
    if (nodeList[i] == '[')
      ++depth;
    else if (nodeList[i] == ']' && depth > 0)
      --depth;
    else if (nodeList[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = nodeList.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string::npos)
    return first;
  // "gpu[03-05,7]": the prefix and the first number of the range, its zeros kept.
  std::string range = first.substr(open + 1);
  size_t stop = range.find_first_of("-,]");
  return first.substr(0, open) + range.substr(0, stop);
}

LaunchInfo launchFromEnvironment() {
  LaunchInfo info;
  if (env("WORLD_SIZE") || env("RANK")) {
    info.launcher = "torchrun";
    for (const char *name : {"RANK", "WORLD_SIZE"})
      if (!env(name))
        throw badInput("", name, "expected RANK and WORLD_SIZE together (torchrun sets both)");
    info.worldSize = envInt("WORLD_SIZE", 1, 1 << 20);
    info.rank = envInt("RANK", 0, info.worldSize - 1);
    info.localRank = env("LOCAL_RANK") ? envInt("LOCAL_RANK", 0, 1 << 16) : 0;
    if (env("MASTER_ADDR"))
      info.masterAddr = env("MASTER_ADDR");
  } else if (env("SLURM_NTASKS") && env("SLURM_PROCID")) {
    info.launcher = "slurm";
    info.worldSize = envInt("SLURM_NTASKS", 1, 1 << 20);
    info.rank = envInt("SLURM_PROCID", 0, info.worldSize - 1);
    info.localRank = env("SLURM_LOCALID") ? envInt("SLURM_LOCALID", 0, 1 << 16) : 0;
    if (env("MASTER_ADDR"))
      info.masterAddr = env("MASTER_ADDR");
    else if (env("SLURM_NODELIST"))
      info.masterAddr = firstSlurmHost(env("SLURM_NODELIST"));
    else if (env("SLURM_JOB_NODELIST"))
      info.masterAddr = firstSlurmHost(env("SLURM_JOB_NODELIST"));
    // One port per job, so jobs sharing a first node do not collide.
    if (!env("MASTER_PORT") && env("SLURM_JOB_ID"))
      info.masterPort = 20000 + envInt("SLURM_JOB_ID", 0, 1 << 30) % 20000;
  }
  if (env("MASTER_PORT"))
    info.masterPort = envInt("MASTER_PORT", 1, 65535);
  return info;
}

std::string Layout::text() const {
  return "TP" + std::to_string(tp) + "xCP" + std::to_string(cp) + "xEP" + std::to_string(ep) +
         "xDP" + std::to_string(dp) + "xPP" + std::to_string(pp);
}

void checkLayout(const Layout &layout, int worldSize, const ModelDef &def, int64_t batch, int64_t seqLen) {
  const std::pair<const char *, int64_t> sizes[] = {
      {"--tp", layout.tp}, {"--ep", layout.ep}, {"--pp", layout.pp}, {"--dp", layout.dp},
      {"--cp", layout.cp}};
  for (const auto &[flag, size] : sizes)
    if (size < 1)
      throw badInput("", flag, "expected a positive size, got " + std::to_string(size));
  if (layout.product() != worldSize)
    throw badInput("", "--tp/--ep/--pp/--dp/--cp",
                   "expected sizes whose product is the world size " + std::to_string(worldSize) +
                       " (the launcher's), but " + layout.text() + " makes " +
                       std::to_string(layout.product()));
  // Checked against the model before anything is split (these are the rules
  // the splits will need), then refused while the split does not exist yet.
  for (const LayerDef &layer : def.layers) {
    if (layer.ffn.experts > 0 && layer.ffn.experts % layout.ep != 0)
      throw badInput("", "--ep",
                     "expected a size dividing every MoE layer's expert count, but layer " +
                         std::to_string(layer.index) + " has " +
                         std::to_string(layer.ffn.experts) + " experts and --ep is " +
                         std::to_string(layout.ep));
    const int64_t heads = layer.attention.linear.valueHeads > 0 ? layer.attention.linear.valueHeads
                                                                  : layer.attention.heads;
    const int64_t kvHeads = layer.attention.linear.keyHeads > 0 ? layer.attention.linear.keyHeads
                                                                 : layer.attention.kvHeads;
    const std::string where = "layer " + std::to_string(layer.index);
    if (heads % layout.tp != 0 || (kvHeads > 0 && kvHeads % layout.tp != 0))
      throw badInput("", "--tp",
                     "expected a size dividing the attention heads, but " + where + " has " +
                         std::to_string(heads) + " heads (" + std::to_string(kvHeads) +
                         " key/value) and --tp is " + std::to_string(layout.tp));
    if (layout.tp == 1)
      continue;
    const AttentionDef &a = layer.attention;
    if (!a.generatedCore.empty())
      throw badInput("", "--tp",
                     "expected 1: " + where + "'s generated attention operator is not split by tensor "
                     "parallelism yet (docs/parallel.md)");
    for (int64_t width : {layer.ffn.experts == 0 ? layer.ffn.intermediate : int64_t(0),
                          layer.ffn.sharedIntermediate})
      if (width % layout.tp != 0)
        throw badInput("", "--tp",
                       "expected a size dividing the MLP widths, but " + where + " has width " +
                           std::to_string(width) + " and --tp is " + std::to_string(layout.tp));
  }
  if (layout.pp > static_cast<int64_t>(def.layers.size()))
    throw badInput("", "--pp",
                   "expected at most one stage per layer: the model has " +
                       std::to_string(def.layers.size()) + " layers and --pp is " +
                       std::to_string(layout.pp));
  if (batch % layout.dataRanks() != 0)
    throw badInput("", "--batch",
                   "expected a global batch divisible by the data ranks (ep * dp = " +
                       std::to_string(layout.dataRanks()) + "), got " + std::to_string(batch));
  if (layout.cp == 1)
    return;
  if (seqLen % layout.cp != 0)
    throw badInput("", "--cp",
                   "expected a size dividing the sequence length " + std::to_string(seqLen) + ", got " +
                       std::to_string(layout.cp));
  for (const LayerDef &layer : def.layers) {
    const AttentionDef &a = layer.attention;
    std::string why = !a.generatedCore.empty()   ? "a generated attention operator"
                      : !a.generatedRope.empty() ? "a generated RoPE operator"
                                                 : "";
    if (!why.empty())
      throw badInput("", "--cp",
                     "expected 1: layer " + std::to_string(layer.index) + "'s " + why +
                         " is not split by context parallelism yet (docs/parallel.md)");
  }
}

std::shared_ptr<Distributed> Distributed::join(const LaunchInfo &launch, const Layout &layout,
                                               torch::Device device,
                                               std::chrono::seconds timeout) {
  auto run = std::make_shared<C10dDistributed>();
  run->launchInfo = launch;
  run->sizes = layout;
  run->device = device;
  run->timeout = timeout;
  // Rank order: tp fastest, then cp, ep, dp, pp (docs/parallel.md).
  const int rank = launch.rank;
  const int64_t inner = layout.tp * layout.cp;
  run->tensorIndex = rank % layout.tp;
  run->expertIndex = (rank / inner) % layout.ep;
  const int64_t dpIndex = (rank / (inner * layout.ep)) % layout.dp;
  run->dataIndex = dpIndex * layout.ep + run->expertIndex;
  run->pipelineIndex = rank / (inner * layout.ep * layout.dp);
  run->contextIndex = (rank / layout.tp) % layout.cp;

  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<uint16_t>(launch.masterPort);
  storeOptions.isServer = rank == 0;
  storeOptions.numWorkers = launch.worldSize;
  storeOptions.timeout = timeout;
  storeOptions.waitWorkers = true;
  try {
    run->store = c10::make_intrusive<c10d::TCPStore>(launch.masterAddr, storeOptions);
  } catch (const std::exception &e) {
    throw RuntimeError("", "MASTER_ADDR/MASTER_PORT",
                       "could not meet the other ranks at " + launch.masterAddr + ":" +
                           std::to_string(launch.masterPort) + " within " +
                           std::to_string(timeout.count()) + " s: " + e.what(),
                       kExitBadInput);
  }
  std::vector<int> all;
  for (int r = 0; r < launch.worldSize; ++r)
    all.push_back(r);
  run->worldGroup = run->group("world/", all);
  // Members of this rank's groups: vary one coordinate, keep the others.
  auto members = [&](auto keep) {
    std::vector<int> out;
    for (int r = 0; r < launch.worldSize; ++r)
      if (keep(r))
        out.push_back(r);
    return out;
  };
  auto tpcp = [&](int r) { return r % inner; };
  auto ep = [&](int r) { return (r / inner) % layout.ep; };
  auto pp = [&](int r) { return r / (inner * layout.ep * layout.dp); };
  auto dp = [&](int r) { return (r / (inner * layout.ep)) % layout.dp; };
  auto tp = [&](int r) { return r % layout.tp; };
  run->dataGroup = run->group("data/" + std::to_string(tp(rank)) + "." + std::to_string(pp(rank)) + "/",
                              members([&](int r) { return tp(r) == tp(rank) && pp(r) == pp(rank); }));
  run->expertGroup = run->group(
      "expert/" + std::to_string(tpcp(rank)) + "." + std::to_string(dp(rank)) + "." +
          std::to_string(pp(rank)) + "/",
      members([&](int r) { return tpcp(r) == tpcp(rank) && dp(r) == dp(rank) && pp(r) == pp(rank); }));
  run->tensorGroup = run->group("tensor/" + std::to_string(rank / layout.tp) + "/",
                                members([&](int r) { return r / layout.tp == rank / layout.tp; }));
  run->expertDataGroup = run->group(
      "expert-data/" + std::to_string(tp(rank)) + "." + std::to_string(ep(rank)) + "." +
          std::to_string(pp(rank)) + "/",
      members([&](int r) { return tp(r) == tp(rank) && ep(r) == ep(rank) && pp(r) == pp(rank); }));
  run->contextGroup = run->group("context/" + std::to_string(tp(rank)) + "." + std::to_string(rank / inner) + "/",
                                 members([&](int r) { return tp(r) == tp(rank) && r / inner == rank / inner; }));
  const int64_t stageSize = inner * layout.ep * layout.dp;
  run->pipelineGroup = run->group("pipeline/" + std::to_string(rank % stageSize) + "/",
                                  members([&](int r) { return r % stageSize == rank % stageSize; }));
  return run;
}

} // namespace adapt::rt
