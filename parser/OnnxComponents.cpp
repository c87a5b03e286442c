//===- OnnxComponents.cpp - map an ONNX graph onto library ops ------------===//
//
// mapOnnxGraph (declared in OnnxModel.h): sorts the nodes of an OnnxGraph
// into the component kinds of the `adapt` operator library so that the gap
// analysis can name what it cannot train. Kept apart from the reader so that
// neither file grows past the size limit; needs no protobuf.
//
// Rules
// -----
//
// A node belongs to the first rule, top to bottom, that claims it. A
// "weight" is an initializer, directly or through up to 8 Transpose, Cast,
// Identity, Reshape, Squeeze or Unsqueeze nodes (the component claims those
// too). std = domain "" or "ai.onnx"; ms = com.microsoft. "Aggregated" kinds
// get one component per (kind, domain, opType) for the whole graph, so a big
// graph's glue is a handful of components with node counts.
//
// | nodes                                               | kind       | per   |
// |-----------------------------------------------------|------------|-------|
// | Pow->ReduceMean->Add->Sqrt->Reciprocal->Mul(x,.),   | rms_norm   | match |
// |   or ..Sqrt->Div(c,.)->Mul(x,.), or ..Sqrt->Div(x,.);|            |       |
// |   then [Cast->]Mul by a weight if present           |            |       |
// | MatMul/Gemm with a weight operand [+ Add 1-D weight]| linear     | node  |
// | the last linear a graph output is reached from via  | lm_head    | node  |
// |   Reshape/Cast/Identity/(Un)Squeeze/Transpose/Tanh  |            |       |
// |   or Add/Sub/Mul/Div with a constant operand        |            |       |
// | Gather whose data input is a 2-D weight             | embedding  | node  |
// | MatMul->[Mul|Div|Add|Sub|Where|Cast]*->Softmax->    | attention  | match |
// |   [Cast|Dropout]*->MatMul, no weight operands       |            |       |
// | Sigmoid(x) consumed only by Mul(x, .) (SiLU)        | activation | aggr. |
// | SimplifiedLayerNormalization (std, ms),             | rms_norm   | node  |
// |   RMSNormalization (std, opset 23),                 |            |       |
// |   SkipSimplifiedLayerNormalization (ms)             |            |       |
// | LayerNormalization (std), SkipLayerNormalization(ms)| layer_norm | node  |
// | Attention, MultiHeadAttention, GroupQueryAttention  | attention  | node  |
// |   (ms); Attention (std, opset 23)                   |            |       |
// | RotaryEmbedding (ms; std, opset 23)                 | rotary     | node  |
// | TopK                                                | moe_gate   | node  |
// | Sigmoid, Relu, Gelu, Tanh, Erf; Gelu (ms)           | activation | aggr. |
// | Add, Mul, Sub, Div, Neg                             | elementwise| aggr. |
// | Reshape, Transpose, Concat, Slice, Squeeze,         | shape      | aggr. |
// |   Unsqueeze, Shape, Cast, Expand, Constant,         |            |       |
// |   Identity, Gather (not an embedding), Split        |            |       |
// | Softmax                                             | softmax    | aggr. |
// | anything else (reason: "no library op for ONNX      | unmapped   | aggr. |
// |   <domain>::<op_type>")                             |            |       |
//
//===----------------------------------------------------------------------===//
#include "parser/OnnxModel.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

using namespace adapt;

namespace {

/// Is `node` the standard-domain operator `op`?
bool isStd(const OnnxNode &node, const char *op) {
  return (node.domain.empty() || node.domain == "ai.onnx") && node.opType == op;
}

/// Is `node` the com.microsoft operator `op`?
bool isMs(const OnnxNode &node, const char *op) {
  return node.domain == "com.microsoft" && node.opType == op;
}

/// Is `node` one of the standard-domain operators `ops`?
bool isStdOneOf(const OnnxNode &node, std::initializer_list<const char *> ops) {
  return std::any_of(ops.begin(), ops.end(),
                     [&](const char *op) { return isStd(node, op); });
}

/// Element count of `shape`, saturating; negative dimensions count as 0.
int64_t numelOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0)
      return 0;
    n = n > INT64_MAX / d ? INT64_MAX : n * d;
  }
  return n;
}

/// One mapOnnxGraph call: indexes over the graph, the component owning each
/// node, and the components being built.
class Mapper {
public:
  /// Indexes `graph` (which must outlive the Mapper).
  explicit Mapper(const OnnxGraph &graph);
  /// Applies the rules table and returns components in graph order.
  std::vector<OnnxComponent> run();

private:
  /// A component being built; `anchor` is the node that founded it.
  struct Draft {
    OnnxComponent component; ///< The result, filled in as nodes are seen.
    size_t anchor = 0;       ///< Founding node (graph order of lm_head).
    std::unordered_set<std::string> seen; ///< Weights already listed.
  };

  /// Starts a per-node/per-match component founded by node `anchor`.
  int create(const std::string &kind, const std::string &opType,
             const std::string &domain, size_t anchor);
  /// The aggregated component of `kind` for node's domain and `opType`.
  int aggregate(const std::string &kind, const OnnxNode &node,
                const std::string &opType);
  /// Gives `node` to `component` unless another component has it.
  void claim(size_t node, int component) {
    if (owner[node] < 0)
      owner[node] = component;
  }
  /// The node consuming `value` if it has exactly one, unclaimed; else -1.
  long soleConsumer(const std::string &value) const;
  /// First output of `node`, "" if it has none.
  const std::string &out(size_t node) const {
    static const std::string none;
    return g.nodes[node].outputs.empty() ? none : g.nodes[node].outputs[0];
  }
  /// If `value` is a weight, its initializer's index, and its glue chain.
  std::optional<size_t> findWeight(std::string value,
                                   std::vector<size_t> &chain) const;
  /// Claims a weight's `chain` for `component`; `user` consumes the root.
  void takeWeight(size_t user, size_t root, const std::vector<size_t> &chain,
                  int component);
  /// Is `value` an initializer, a Constant node's output or a weight?
  bool isConstant(const std::string &value) const;
  /// The opTypes of `nodes` joined with '+' in graph order.
  std::string joinOps(std::vector<size_t> nodes) const;

  /// Claims the RMS-norm decomposition starting at Pow node `pow`.
  void matchRmsNorm(size_t pow);
  /// Claims MatMul/Gemm `node` (+ bias Add, weight glue) if it has a weight.
  void matchLinear(size_t node);
  /// Claims Gather `node` as an embedding if it reads a 2-D weight.
  void matchEmbedding(size_t node);
  /// Claims MatMul->...->Softmax->...->MatMul starting at MatMul `first`.
  void matchAttentionCore(size_t first);
  /// Claims Sigmoid `sigmoid` and its Mul(x, sigmoid(x)) as one SiLU.
  void matchSilu(size_t sigmoid);
  /// Gives a still unclaimed `node` its single-op kind (or "unmapped").
  void classifySingle(size_t node);
  /// Turns the last linear feeding a graph output into the lm_head.
  void markLmHead();

  const OnnxGraph &g;                               ///< The graph mapped.
  std::unordered_map<std::string, size_t> init;     ///< Initializer by name.
  std::unordered_map<std::string, size_t> producer; ///< Node by output.
  /// Nodes reading each value, one entry per reading input.
  std::unordered_map<std::string, std::vector<size_t>> consumers;
  std::vector<int> owner;                        ///< Component per node.
  std::vector<std::vector<size_t>> extraWeights; ///< Roots used via chains.
  std::vector<Draft> drafts;             ///< Every component so far.
  std::map<std::string, int> aggregates; ///< "kind\ndomain\nop" -> draft.
};

Mapper::Mapper(const OnnxGraph &graph)
    : g(graph), owner(graph.nodes.size(), -1),
      extraWeights(graph.nodes.size()) {
  for (size_t i = 0; i < g.initializers.size(); ++i)
    init.emplace(g.initializers[i].name, i);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const std::string &o : g.nodes[i].outputs)
      if (!o.empty())
        producer.emplace(o, i);
    for (const std::string &in : g.nodes[i].inputs)
      if (!in.empty())
        consumers[in].push_back(i);
  }
}

int Mapper::create(const std::string &kind, const std::string &opType,
                   const std::string &domain, size_t anchor) {
  Draft draft;
  draft.component.kind = kind;
  draft.component.opType = opType;
  draft.component.domain = domain;
  draft.anchor = anchor;
  drafts.push_back(std::move(draft));
  return int(drafts.size()) - 1;
}

int Mapper::aggregate(const std::string &kind, const OnnxNode &node,
                      const std::string &opType) {
  std::string domain = node.domain == "ai.onnx" ? "" : node.domain;
  auto [it, added] = aggregates.emplace(kind + "\n" + domain + "\n" + opType,
                                        int(drafts.size()));
  if (added)
    create(kind, opType, domain, 0);
  return it->second;
}

long Mapper::soleConsumer(const std::string &value) const {
  auto it = consumers.find(value);
  if (value.empty() || it == consumers.end() || it->second.size() != 1 ||
      owner[it->second[0]] >= 0)
    return -1;
  return long(it->second[0]);
}

std::optional<size_t> Mapper::findWeight(std::string value,
                                         std::vector<size_t> &chain) const {
  chain.clear();
  for (int step = 0; step <= 8; ++step) {
    if (auto it = init.find(value); it != init.end())
      return it->second;
    auto p = producer.find(value);
    if (p == producer.end() || step == 8)
      break;
    const OnnxNode &n = g.nodes[p->second];
    if (n.inputs.empty() ||
        !isStdOneOf(n, {"Transpose", "Cast", "Identity", "Reshape", "Squeeze",
                        "Unsqueeze"}))
      break;
    chain.push_back(p->second);
    value = n.inputs[0];
  }
  return std::nullopt;
}

void Mapper::takeWeight(size_t user, size_t root,
                        const std::vector<size_t> &chain, int component) {
  for (size_t node : chain)
    claim(node, component);
  extraWeights[user].push_back(root);
}

bool Mapper::isConstant(const std::string &value) const {
  auto p = producer.find(value);
  if (p != producer.end() && isStd(g.nodes[p->second], "Constant"))
    return true;
  std::vector<size_t> chain;
  return findWeight(value, chain).has_value();
}

std::string Mapper::joinOps(std::vector<size_t> nodes) const {
  std::sort(nodes.begin(), nodes.end());
  std::string joined;
  for (size_t n : nodes)
    joined += (joined.empty() ? "" : "+") + g.nodes[n].opType;
  return joined;
}

void Mapper::matchRmsNorm(size_t pow) {
  const OnnxNode &p = g.nodes[pow];
  if (owner[pow] >= 0 || !isStd(p, "Pow") || p.inputs.size() != 2 ||
      !isConstant(p.inputs[1]))
    return;
  const std::string &x = p.inputs[0];
  std::vector<size_t> match{pow};
  auto next = [&](size_t from, const char *op) -> long {
    long c = soleConsumer(out(from));
    if (c < 0 || !isStd(g.nodes[c], op) || g.nodes[c].inputs.size() > 2)
      return -1;
    match.push_back(size_t(c));
    return c;
  };
  long sqrt = -1, mean = next(pow, "ReduceMean");
  long add = mean < 0 ? -1 : next(size_t(mean), "Add");
  if (add >= 0)
    sqrt = next(size_t(add), "Sqrt");
  long inv = sqrt < 0 ? -1 : soleConsumer(out(size_t(sqrt)));
  if (inv < 0)
    return;
  const OnnxNode &i = g.nodes[inv];
  bool divides = isStd(i, "Div") && i.inputs.size() == 2 &&
                 i.inputs[1] == out(size_t(sqrt));
  if (!isStd(i, "Reciprocal") && !divides)
    return;
  match.push_back(size_t(inv));
  size_t normed = size_t(inv);
  if (!divides || i.inputs[0] != x) { // 1/sqrt first, then Mul(x, 1/sqrt).
    if (divides && !isConstant(i.inputs[0]))
      return;
    long mul = next(size_t(inv), "Mul");
    if (mul < 0 || std::count(g.nodes[mul].inputs.begin(),
                              g.nodes[mul].inputs.end(), x) != 1)
      return;
    normed = size_t(mul);
  }
  int c = create("rms_norm", "", p.domain, pow);
  long cast = -1, scale = soleConsumer(out(normed));
  if (scale >= 0 && isStd(g.nodes[scale], "Cast")) {
    cast = scale;
    scale = soleConsumer(out(size_t(cast)));
  }
  if (scale >= 0 && isStd(g.nodes[scale], "Mul")) {
    std::vector<size_t> chain;
    for (const std::string &in : g.nodes[scale].inputs)
      if (std::optional<size_t> w = findWeight(in, chain)) {
        if (cast >= 0)
          match.push_back(size_t(cast));
        match.push_back(size_t(scale));
        takeWeight(size_t(scale), *w, chain, c);
        break;
      }
  }
  for (size_t n : match)
    claim(n, c);
  drafts[c].component.opType = joinOps(match);
}

void Mapper::matchLinear(size_t node) {
  const OnnxNode &n = g.nodes[node];
  if (owner[node] >= 0 || !(isStd(n, "MatMul") || isStd(n, "Gemm")))
    return;
  int c = -1;
  std::vector<size_t> chain;
  for (size_t k = 0; k < std::min<size_t>(2, n.inputs.size()); ++k)
    if (std::optional<size_t> w = findWeight(n.inputs[k], chain)) {
      if (c < 0)
        c = create("linear", n.opType, n.domain, node);
      takeWeight(node, *w, chain, c);
    }
  if (c < 0)
    return;
  claim(node, c);
  long bias = soleConsumer(out(node));
  if (bias < 0 || !isStd(g.nodes[bias], "Add") ||
      g.nodes[bias].inputs.size() != 2)
    return;
  const std::vector<std::string> &in = g.nodes[bias].inputs;
  std::optional<size_t> w = findWeight(in[in[0] == out(node) ? 1 : 0], chain);
  if (w && g.initializers[*w].shape.size() == 1) {
    claim(size_t(bias), c);
    takeWeight(size_t(bias), *w, chain, c);
  }
}

void Mapper::matchEmbedding(size_t node) {
  const OnnxNode &n = g.nodes[node];
  if (owner[node] >= 0 || !isStd(n, "Gather") || n.inputs.empty())
    return;
  std::vector<size_t> chain;
  std::optional<size_t> w = findWeight(n.inputs[0], chain);
  if (!w || g.initializers[*w].shape.size() != 2)
    return;
  int c = create("embedding", n.opType, n.domain, node);
  claim(node, c);
  takeWeight(node, *w, chain, c);
}

void Mapper::matchAttentionCore(size_t first) {
  if (owner[first] >= 0 || !isStd(g.nodes[first], "MatMul"))
    return;
  std::vector<size_t> match{first};
  std::string value = out(first);
  auto walk = [&](std::initializer_list<const char *> through,
                  const char *stop) -> long {
    for (int step = 0; step < 8; ++step) {
      long c = soleConsumer(value);
      if (c < 0 || std::count(match.begin(), match.end(), size_t(c)))
        return -1;
      match.push_back(size_t(c));
      if (isStd(g.nodes[c], stop))
        return c;
      if (!isStdOneOf(g.nodes[c], through))
        return -1;
      value = out(size_t(c));
    }
    return -1;
  };
  long softmax = walk({"Mul", "Div", "Add", "Sub", "Where", "Cast"}, "Softmax");
  if (softmax < 0)
    return;
  value = out(size_t(softmax));
  long second = walk({"Cast", "Dropout"}, "MatMul");
  if (second < 0 || g.nodes[second].inputs.empty() ||
      g.nodes[second].inputs[0] != value)
    return;
  int c = create("attention", joinOps(match), "", first);
  for (size_t n : match)
    claim(n, c);
}

void Mapper::matchSilu(size_t sigmoid) {
  const OnnxNode &s = g.nodes[sigmoid];
  if (owner[sigmoid] >= 0 || !isStd(s, "Sigmoid") || s.inputs.empty())
    return;
  long mul = soleConsumer(out(sigmoid));
  if (mul < 0 || !isStd(g.nodes[mul], "Mul"))
    return;
  const std::vector<std::string> &in = g.nodes[mul].inputs;
  if (in.size() != 2 || !((in[0] == s.inputs[0] && in[1] == out(sigmoid)) ||
                          (in[1] == s.inputs[0] && in[0] == out(sigmoid))))
    return;
  int c = aggregate("activation", s, "Sigmoid+Mul");
  claim(sigmoid, c);
  claim(size_t(mul), c);
}

void Mapper::classifySingle(size_t node) {
  const OnnxNode &n = g.nodes[node];
  if (owner[node] >= 0)
    return;
  const char *kind = nullptr;
  if (isStdOneOf(n, {"SimplifiedLayerNormalization", "RMSNormalization"}) ||
      isMs(n, "SimplifiedLayerNormalization") ||
      isMs(n, "SkipSimplifiedLayerNormalization"))
    kind = "rms_norm";
  else if (isStd(n, "LayerNormalization") || isMs(n, "SkipLayerNormalization"))
    kind = "layer_norm";
  else if (isStd(n, "Attention") || isMs(n, "Attention") ||
           isMs(n, "MultiHeadAttention") || isMs(n, "GroupQueryAttention"))
    kind = "attention";
  else if (isStd(n, "RotaryEmbedding") || isMs(n, "RotaryEmbedding"))
    kind = "rotary";
  else if (isStd(n, "TopK"))
    kind = "moe_gate";
  if (kind) {
    claim(node, create(kind, n.opType, n.domain, node));
    return;
  }
  if (isStdOneOf(n, {"Sigmoid", "Relu", "Gelu", "Tanh", "Erf"}) ||
      isMs(n, "Gelu"))
    kind = "activation";
  else if (isStdOneOf(n, {"Add", "Mul", "Sub", "Div", "Neg"}))
    kind = "elementwise";
  else if (isStdOneOf(n, {"Reshape", "Transpose", "Concat", "Slice", "Squeeze",
                          "Unsqueeze", "Shape", "Cast", "Expand", "Constant",
                          "Identity", "Gather", "Split"}))
    kind = "shape";
  else if (isStd(n, "Softmax"))
    kind = "softmax";
  if (kind) {
    claim(node, aggregate(kind, n, n.opType));
    return;
  }
  int c = aggregate("unmapped", n, n.opType);
  OnnxComponent &u = drafts[c].component;
  u.reason = "no library op for ONNX " +
             (u.domain.empty() ? std::string("ai.onnx") : u.domain) +
             "::" + n.opType;
  if (isStd(n, "MatMul") || isStd(n, "Gemm"))
    u.reason += " (no initializer operand and not part of a recognised "
                "attention core)";
  claim(node, c);
}

void Mapper::markLmHead() {
  int best = -1;
  for (const OnnxTensorInfo &output : g.outputs) {
    std::string value = output.name;
    for (int step = 0; step < 64; ++step) {
      auto p = producer.find(value);
      if (p == producer.end() || owner[p->second] < 0)
        break;
      const Draft &d = drafts[owner[p->second]];
      if (d.component.kind == "linear") {
        if (best < 0 || d.anchor > drafts[best].anchor)
          best = owner[p->second];
        break;
      }
      const OnnxNode &n = g.nodes[p->second];
      if (n.inputs.empty())
        break;
      if (isStdOneOf(n, {"Reshape", "Cast", "Identity", "Squeeze",
                         "Unsqueeze", "Transpose", "Tanh"})) {
        value = n.inputs[0];
        continue;
      }
      if (!isStdOneOf(n, {"Add", "Sub", "Mul", "Div"}) || n.inputs.size() != 2)
        break;
      bool constant0 = isConstant(n.inputs[0]);
      if (constant0 == isConstant(n.inputs[1]))
        break;
      value = n.inputs[constant0 ? 1 : 0];
    }
  }
  if (best >= 0)
    drafts[best].component.kind = "lm_head";
}

std::vector<OnnxComponent> Mapper::run() {
  size_t count = g.nodes.size();
  for (size_t i = 0; i < count; ++i)
    matchRmsNorm(i);
  for (size_t i = 0; i < count; ++i) {
    matchLinear(i);
    matchEmbedding(i);
  }
  for (size_t i = 0; i < count; ++i) {
    matchAttentionCore(i);
    matchSilu(i);
  }
  for (size_t i = 0; i < count; ++i)
    classifySingle(i);
  markLmHead();

  std::vector<int> order;
  std::vector<bool> started(drafts.size(), false);
  std::unordered_set<std::string> counted;
  auto addWeight = [&](Draft &d, const std::string &name) {
    if (d.seen.insert(name).second)
      d.component.weights.push_back(name);
    if (counted.insert(name).second) {
      int64_t n = numelOf(g.initializers[init.at(name)].shape);
      d.component.parameters = d.component.parameters > INT64_MAX - n
                                   ? INT64_MAX
                                   : d.component.parameters + n;
    }
  };
  for (size_t i = 0; i < count; ++i) {
    int c = owner[i];
    if (!started[c]) {
      started[c] = true;
      order.push_back(c);
    }
    drafts[c].component.nodes.push_back(g.nodes[i].name);
    for (const std::string &in : g.nodes[i].inputs)
      if (init.count(in))
        addWeight(drafts[c], in);
    for (size_t root : extraWeights[i])
      addWeight(drafts[c], g.initializers[root].name);
  }
  std::vector<OnnxComponent> result;
  result.reserve(order.size());
  for (int c : order)
    result.push_back(std::move(drafts[c].component));
  return result;
}

} // namespace

std::vector<OnnxComponent> adapt::mapOnnxGraph(const OnnxGraph &graph) {
  try {
    return Mapper(graph).run();
  } catch (...) {
    return {};
  }
}
