//===- MakeTinyOnnx.cpp - write the tiny ONNX models the tests read -------===//
//
// Usage: make-tiny-onnx OUTPUT_DIR
//
// Writes, with the ONNX protobuf classes, the models under tests/data/onnx/:
//   tiny-decoder.onnx (+ .data)  a 1-layer decoder built from standard ops,
//                                every initializer stored as external data;
//   unknown-op.onnx              a MatMul then com.example::FancyMixer, which
//                                no library op maps;
//   bad-external.onnx (+ .data)  an initializer whose external offset points
//                                past the end of its 64-byte data file.
// Weights are seeded pseudo-random floats, so reruns give the same bytes.
//
//===----------------------------------------------------------------------===//
#ifndef ONNX_ML
#error "build with -DONNX_ML=1 -DONNX_NAMESPACE=onnx (ONNX::onnx_proto's flags)"
#endif
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

/// Builds one GraphProto node by node, collecting external weight bytes.
class GraphBuilder {
public:
  /// Adds nodes and initializers to `graph`; external weights go to
  /// `dataFile` (a name relative to the model) at increasing offsets.
  GraphBuilder(onnx::GraphProto &graph, std::string dataFile)
      : graph(graph), dataFile(std::move(dataFile)) {}

  /// Adds node `name` running `op` on `inputs`; returns its output's name.
  std::string node(const std::string &op, const std::string &name,
                   const std::vector<std::string> &inputs,
                   const std::string &domain = "") {
    onnx::NodeProto *n = graph.add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->set_domain(domain);
    for (const std::string &in : inputs)
      n->add_input(in);
    n->add_output(name + "/out");
    return name + "/out";
  }

  /// Adds integer-list attribute `key` to the last node added.
  void intsAttr(const std::string &key, const std::vector<int64_t> &values) {
    onnx::AttributeProto *a = lastNode()->add_attribute();
    a->set_name(key);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : values)
      a->add_ints(v);
  }

  /// Adds integer attribute `key` to the last node added.
  void intAttr(const std::string &key, int64_t value) {
    onnx::AttributeProto *a = lastNode()->add_attribute();
    a->set_name(key);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }

  /// Adds a Constant node holding an F32 scalar; returns its output.
  std::string scalar(const std::string &name, float value) {
    std::string out = node("Constant", name, {});
    onnx::TensorProto *t = valueAttr();
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(value);
    return out;
  }

  /// Adds a Constant node holding an I64 vector; returns its output.
  std::string shape(const std::string &name, const std::vector<int64_t> &v) {
    std::string out = node("Constant", name, {});
    onnx::TensorProto *t = valueAttr();
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(int64_t(v.size()));
    for (int64_t x : v)
      t->add_int64_data(x);
    return out;
  }

  /// Adds F32 initializer `name` of `dims` with random values, stored as
  /// external data when `external`, else inline; returns its name.
  std::string weight(const std::string &name, const std::vector<int64_t> &dims,
                     bool external = true) {
    onnx::TensorProto *t = graph.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t numel = 1;
    for (int64_t d : dims) {
      t->add_dims(d);
      numel *= d;
    }
    std::string bytes(size_t(numel) * sizeof(float), '\0');
    std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
    for (int64_t i = 0; i < numel; ++i) {
      float f = dist(rng);
      std::memcpy(&bytes[size_t(i) * sizeof(float)], &f, sizeof(float));
    }
    if (!external) {
      t->set_raw_data(bytes);
      return name;
    }
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    addEntry(*t, "location", dataFile);
    addEntry(*t, "offset", std::to_string(data.size()));
    addEntry(*t, "length", std::to_string(bytes.size()));
    data += bytes;
    return name;
  }

  /// Declares graph input `name` of element type `type` and `dims` (a name
  /// in `symbols` position makes that dimension symbolic).
  void input(const std::string &name, int type, const std::vector<int64_t> &dims,
             const std::vector<std::string> &symbols = {}) {
    valueInfo(*graph.add_input(), name, type, dims, symbols);
  }

  /// Declares graph output `name`, as input().
  void output(const std::string &name, int type, const std::vector<int64_t> &dims,
              const std::vector<std::string> &symbols = {}) {
    valueInfo(*graph.add_output(), name, type, dims, symbols);
  }

  static void valueInfo(onnx::ValueInfoProto &v, const std::string &name,
                        int type, const std::vector<int64_t> &dims,
                        const std::vector<std::string> &symbols = {}) {
    v.set_name(name);
    onnx::TypeProto::Tensor *t = v.mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    onnx::TensorShapeProto *s = t->mutable_shape();
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i < symbols.size() && !symbols[i].empty())
        s->add_dim()->set_dim_param(symbols[i]);
      else
        s->add_dim()->set_dim_value(dims[i]);
    }
  }

  /// Adds one external_data key/value pair to `t`.
  static void addEntry(onnx::TensorProto &t, const std::string &key,
                       const std::string &value) {
    onnx::StringStringEntryProto *e = t.add_external_data();
    e->set_key(key);
    e->set_value(value);
  }

  /// Bytes of every external weight so far, in offset order.
  const std::string &externalBytes() const { return data; }

private:
  /// The node added last (nodes get attributes right after creation).
  onnx::NodeProto *lastNode() {
    return graph.mutable_node(graph.node_size() - 1);
  }

  /// Adds the `value` tensor attribute of a Constant node.
  onnx::TensorProto *valueAttr() {
    onnx::AttributeProto *a = lastNode()->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    return a->mutable_t();
  }

  onnx::GraphProto &graph;
  std::string dataFile;
  std::string data;
  std::mt19937 rng{20240611};
};

/// Sets the header fields every test model shares.
void initModel(onnx::ModelProto &model, const std::string &graphName) {
  model.set_ir_version(8);
  model.set_producer_name("adapt-make-tiny-onnx");
  model.set_producer_version("1");
  onnx::OperatorSetIdProto *opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  model.mutable_graph()->set_name(graphName);
}

/// Writes `bytes` to `path`; false (with a message) on failure.
bool writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make-tiny-onnx: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

/// Adds the RMS-norm pattern Pow->ReduceMean->Add->Sqrt->...->Mul(weight) in
/// one of its three spellings (`variant` 0: Reciprocal then Mul, 1: Div(x,
/// sqrt), 2: Div(1, sqrt) then Mul); returns the normalised output.
std::string rmsNorm(GraphBuilder &b, const std::string &prefix,
                    const std::string &x, const std::string &weight,
                    int variant, const std::string &two,
                    const std::string &eps, const std::string &one) {
  std::string sq = b.node("Pow", prefix + "/pow", {x, two});
  std::string mean = b.node("ReduceMean", prefix + "/mean", {sq});
  b.intsAttr("axes", {-1});
  b.intAttr("keepdims", 1);
  std::string var = b.node("Add", prefix + "/add_eps", {mean, eps});
  std::string rms = b.node("Sqrt", prefix + "/sqrt", {var});
  std::string normed;
  if (variant == 0) {
    std::string inv = b.node("Reciprocal", prefix + "/reciprocal", {rms});
    normed = b.node("Mul", prefix + "/normalize", {x, inv});
  } else if (variant == 1) {
    normed = b.node("Div", prefix + "/normalize", {x, rms});
  } else {
    std::string inv = b.node("Div", prefix + "/reciprocal", {one, rms});
    normed = b.node("Mul", prefix + "/normalize", {inv, x});
  }
  return b.node("Mul", prefix + "/scale", {normed, weight});
}

/// Writes tiny-decoder.onnx and tiny-decoder.onnx.data into `dir`.
bool writeTinyDecoder(const std::string &dir) {
  const int64_t vocab = 64, hidden = 16, heads = 2, headDim = 8, inter = 32;
  onnx::ModelProto model;
  initModel(model, "tiny-decoder");
  onnx::GraphProto &g = *model.mutable_graph();
  GraphBuilder b(g, "tiny-decoder.onnx.data");
  b.input("input_ids", onnx::TensorProto::INT64, {0, 0}, {"batch", "seq"});
  b.output("logits", onnx::TensorProto::FLOAT, {0, 0, vocab}, {"batch", "seq"});

  std::string embedW = b.weight("model.embed_tokens.weight", {vocab, hidden});
  std::string h0 =
      b.node("Gather", "model/embed_tokens", {embedW, "input_ids"});
  std::string two = b.scalar("const/two", 2.0f);
  std::string eps = b.scalar("const/eps", 1e-6f);
  std::string one = b.scalar("const/one", 1.0f);
  std::string scale = b.scalar("const/attn_scale", 2.8284271f);
  std::string split = b.shape("const/split_heads", {0, 0, heads, headDim});
  std::string merge = b.shape("const/merge_heads", {0, 0, hidden});

  const std::string l = "model.layers.0.";
  std::string n1 = rmsNorm(b, "layer0/input_layernorm", h0,
                           b.weight(l + "input_layernorm.weight", {hidden}), 0,
                           two, eps, one);
  auto project = [&](const std::string &in, const std::string &what,
                     int64_t rows, int64_t cols) {
    std::string name = "layer0/" + what;
    std::replace(name.begin(), name.end(), '.', '/');
    return b.node("MatMul", name,
                  {in, b.weight(l + what + ".weight", {rows, cols})});
  };
  auto heads4d = [&](const std::string &in, const std::string &name,
                     const std::vector<int64_t> &perm) {
    std::string r = b.node("Reshape", "layer0/self_attn/" + name + "_split",
                           {in, split});
    std::string t =
        b.node("Transpose", "layer0/self_attn/" + name + "_transpose", {r});
    b.intsAttr("perm", perm);
    return t;
  };
  std::string q = heads4d(project(n1, "self_attn.q_proj", hidden, hidden), "q",
                          {0, 2, 1, 3});
  std::string k = heads4d(project(n1, "self_attn.k_proj", hidden, hidden), "k",
                          {0, 2, 3, 1});
  std::string v = heads4d(project(n1, "self_attn.v_proj", hidden, hidden), "v",
                          {0, 2, 1, 3});
  std::string scores = b.node("MatMul", "layer0/self_attn/scores", {q, k});
  std::string scaled = b.node("Div", "layer0/self_attn/scale", {scores, scale});
  std::string probs = b.node("Softmax", "layer0/self_attn/softmax", {scaled});
  b.intAttr("axis", -1);
  std::string ctx = b.node("MatMul", "layer0/self_attn/context", {probs, v});
  std::string ctxT = b.node("Transpose", "layer0/self_attn/merge_transpose",
                            {ctx});
  b.intsAttr("perm", {0, 2, 1, 3});
  std::string merged =
      b.node("Reshape", "layer0/self_attn/merge_heads", {ctxT, merge});
  std::string attnOut = project(merged, "self_attn.o_proj", hidden, hidden);
  std::string h1 = b.node("Add", "layer0/attn_residual", {h0, attnOut});

  std::string n2 = rmsNorm(b, "layer0/post_attention_layernorm", h1,
                           b.weight(l + "post_attention_layernorm.weight",
                                    {hidden}),
                           1, two, eps, one);
  std::string gate = project(n2, "mlp.gate_proj", hidden, inter);
  std::string sig = b.node("Sigmoid", "layer0/mlp/sigmoid", {gate});
  std::string silu = b.node("Mul", "layer0/mlp/silu", {gate, sig});
  std::string up = project(n2, "mlp.up_proj", hidden, inter);
  std::string act = b.node("Mul", "layer0/mlp/gate_up", {silu, up});
  std::string down = project(act, "mlp.down_proj", inter, hidden);
  std::string h2 = b.node("Add", "layer0/mlp_residual", {h1, down});

  std::string nf = rmsNorm(b, "model/norm", h2,
                           b.weight("model.norm.weight", {hidden}), 2, two,
                           eps, one);
  std::string headW = b.weight("lm_head.weight", {hidden, vocab});
  b.node("MatMul", "lm_head", {nf, headW});
  g.mutable_node(g.node_size() - 1)->set_output(0, "logits");
  return writeFile(dir + "/tiny-decoder.onnx.data", b.externalBytes()) &&
         writeFile(dir + "/tiny-decoder.onnx", model.SerializeAsString());
}

/// Writes unknown-op.onnx: MatMul (inline weight) then com.example::FancyMixer.
bool writeUnknownOp(const std::string &dir) {
  onnx::ModelProto model;
  initModel(model, "unknown-op");
  onnx::OperatorSetIdProto *custom = model.add_opset_import();
  custom->set_domain("com.example");
  custom->set_version(1);
  onnx::GraphProto &g = *model.mutable_graph();
  GraphBuilder b(g, "");
  b.input("x", onnx::TensorProto::FLOAT, {1, 4});
  b.output("mixed/out", onnx::TensorProto::FLOAT, {1, 4});
  std::string y = b.node("MatMul", "proj", {"x", b.weight("proj.weight",
                                                          {4, 4}, false)});
  b.node("FancyMixer", "mixed", {y}, "com.example");
  return writeFile(dir + "/unknown-op.onnx", model.SerializeAsString());
}

/// Writes bad-external.onnx, whose weight's offset is past its data's end.
bool writeBadExternal(const std::string &dir) {
  onnx::ModelProto model;
  initModel(model, "bad-external");
  onnx::GraphProto &g = *model.mutable_graph();
  GraphBuilder b(g, "bad-external.onnx.data");
  b.input("x", onnx::TensorProto::FLOAT, {1, 4});
  b.output("proj/out", onnx::TensorProto::FLOAT, {1, 4});
  onnx::TensorProto *w = g.add_initializer();
  w->set_name("proj.weight");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->add_dims(4);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  GraphBuilder::addEntry(*w, "location", "bad-external.onnx.data");
  GraphBuilder::addEntry(*w, "offset", "4096");
  GraphBuilder::addEntry(*w, "length", "64");
  b.node("MatMul", "proj", {"x", "proj.weight"});
  return writeFile(dir + "/bad-external.onnx.data", std::string(64, '\0')) &&
         writeFile(dir + "/bad-external.onnx", model.SerializeAsString());
}

} // namespace

/// Writes every test model into argv[1]; exit 1 on a usage or write error.
int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make-tiny-onnx OUTPUT_DIR\n");
    return 1;
  }
  std::string dir = argv[1];
  bool ok = writeTinyDecoder(dir) && writeUnknownOp(dir) &&
            writeBadExternal(dir);
  return ok ? 0 : 1;
}
