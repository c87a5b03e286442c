//===- OnnxModelTest.cpp - ONNX reader and component mapping tests --------===//
//
// Reads the models tests/tools/MakeTinyOnnx.cpp wrote into tests/data/onnx/,
// feeds hand-made ModelProto bytes with broken storage to parseOnnxModel, and
// checks the component mapping on both the files and hand-built graphs.
//
//===----------------------------------------------------------------------===//
#include "parser/OnnxModel.h"

#ifndef ONNX_ML
#error "build with -DONNX_ML=1 -DONNX_NAMESPACE=onnx (ONNX::onnx_proto's flags)"
#endif
#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>

#include <unistd.h>

using namespace adapt;

namespace {

/// Folder of the committed test models.
const std::string kDataDir = ADAPT_SOURCE_DIR "/tests/data/onnx/";

/// Components of `kind`, graph order.
std::vector<OnnxComponent> ofKind(const std::vector<OnnxComponent> &all,
                                  const std::string &kind) {
  std::vector<OnnxComponent> out;
  for (const OnnxComponent &c : all)
    if (c.kind == kind)
      out.push_back(c);
  return out;
}

/// Element count of one initializer.
int64_t numel(const OnnxTensorInfo &t) {
  int64_t n = 1;
  for (int64_t d : t.shape)
    n *= d;
  return n;
}

/// Sum of `parameters` over `components`.
int64_t totalParameters(const std::vector<OnnxComponent> &components) {
  int64_t sum = 0;
  for (const OnnxComponent &c : components)
    sum += c.parameters;
  return sum;
}

/// A serialized one-initializer model ("w", F32 [4,4]) after `edit`.
std::string modelWith(const std::function<void(onnx::TensorProto &)> &edit) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  onnx::TensorProto &t = *model.mutable_graph()->add_initializer();
  t.set_name("w");
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(4);
  t.add_dims(4);
  edit(t);
  return model.SerializeAsString();
}

/// Makes `t` external: `location` (+ offset/length when not empty).
void setExternal(onnx::TensorProto &t, const std::string &location,
                 const std::string &offset, const std::string &length) {
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char *key, const std::string &value) {
    onnx::StringStringEntryProto *e = t.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  if (!offset.empty())
    add("offset", offset);
  if (!length.empty())
    add("length", length);
}

/// parseOnnxModel on `bytes` with external data under tests/data/onnx.
Result<OnnxGraph> parseHere(const std::string &bytes) {
  return parseOnnxModel(bytes, "crafted.onnx", kDataDir);
}

/// A node for hand-built graphs.
OnnxNode node(const std::string &name, const std::string &op,
              std::vector<std::string> inputs,
              std::vector<std::string> outputs,
              const std::string &domain = "") {
  return OnnxNode{name, op, domain, std::move(inputs), std::move(outputs)};
}

/// An F32 initializer for hand-built graphs.
OnnxTensorInfo weight(const std::string &name, std::vector<int64_t> shape) {
  OnnxTensorInfo t;
  t.name = name;
  t.dtype = "F32";
  t.shape = std::move(shape);
  return t;
}

TEST(OnnxModelTest, ReadsTinyDecoderGraph) {
  Result<OnnxGraph> g = readOnnxModel(kDataDir + "tiny-decoder.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message();
  EXPECT_EQ(g->irVersion, 8);
  EXPECT_EQ(g->opset, 17);
  EXPECT_EQ(g->producer, "adapt-make-tiny-onnx 1");
  EXPECT_EQ(g->nodes.size(), 52u);
  EXPECT_EQ(g->nodes.front().opType, "Gather");
  EXPECT_EQ(g->nodes.back().name, "lm_head");
  ASSERT_EQ(g->inputs.size(), 1u);
  EXPECT_EQ(g->inputs[0].name, "input_ids");
  EXPECT_EQ(g->inputs[0].dtype, "I64");
  EXPECT_EQ(g->inputs[0].shape, (std::vector<int64_t>{-1, -1}));
  ASSERT_EQ(g->outputs.size(), 1u);
  EXPECT_EQ(g->outputs[0].dtype, "F32");
  EXPECT_EQ(g->outputs[0].shape, (std::vector<int64_t>{-1, -1, 64}));
}

TEST(OnnxModelTest, TinyDecoderInitializersAreExternal) {
  Result<OnnxGraph> g = readOnnxModel(kDataDir + "tiny-decoder.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message();
  ASSERT_EQ(g->initializers.size(), 12u);
  const OnnxTensorInfo &embed = g->initializers.front();
  EXPECT_EQ(embed.name, "model.embed_tokens.weight");
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(g->initializers.back().name, "lm_head.weight");
  EXPECT_EQ(g->initializers.back().shape, (std::vector<int64_t>{16, 64}));
  uint64_t end = 0;
  for (const OnnxTensorInfo &t : g->initializers) {
    EXPECT_EQ(t.dtype, "F32") << t.name;
    EXPECT_TRUE(t.external) << t.name;
    EXPECT_EQ(t.externalFile, "tiny-decoder.onnx.data") << t.name;
    EXPECT_EQ(t.offset, end) << t.name;
    EXPECT_EQ(t.length, uint64_t(numel(t)) * 4) << t.name;
    end = t.offset + t.length;
  }
  EXPECT_EQ(end,
            std::filesystem::file_size(kDataDir + "tiny-decoder.onnx.data"));
}

TEST(OnnxModelTest, MapsTinyDecoderComponents) {
  Result<OnnxGraph> g = readOnnxModel(kDataDir + "tiny-decoder.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::vector<OnnxComponent> all = mapOnnxGraph(*g);

  std::vector<OnnxComponent> embed = ofKind(all, "embedding");
  ASSERT_EQ(embed.size(), 1u);
  EXPECT_EQ(embed[0].weights,
            std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(embed[0].parameters, 64 * 16);

  std::vector<OnnxComponent> norms = ofKind(all, "rms_norm");
  ASSERT_EQ(norms.size(), 3u);
  EXPECT_EQ(norms[0].opType, "Pow+ReduceMean+Add+Sqrt+Reciprocal+Mul+Mul");
  EXPECT_EQ(norms[1].opType, "Pow+ReduceMean+Add+Sqrt+Div+Mul");
  EXPECT_EQ(norms[2].opType, "Pow+ReduceMean+Add+Sqrt+Div+Mul+Mul");
  EXPECT_EQ(norms[1].weights,
            std::vector<std::string>{
                "model.layers.0.post_attention_layernorm.weight"});
  EXPECT_EQ(norms[2].parameters, 16);

  std::vector<OnnxComponent> linears = ofKind(all, "linear");
  ASSERT_EQ(linears.size(), 7u);
  std::vector<std::string> linearNames;
  for (const OnnxComponent &c : linears) {
    ASSERT_EQ(c.nodes.size(), 1u);
    linearNames.push_back(c.nodes[0]);
  }
  EXPECT_EQ(linearNames,
            (std::vector<std::string>{
                "layer0/self_attn/q_proj", "layer0/self_attn/k_proj",
                "layer0/self_attn/v_proj", "layer0/self_attn/o_proj",
                "layer0/mlp/gate_proj", "layer0/mlp/up_proj",
                "layer0/mlp/down_proj"}));
  EXPECT_EQ(linears[4].parameters, 16 * 32);

  std::vector<OnnxComponent> head = ofKind(all, "lm_head");
  ASSERT_EQ(head.size(), 1u);
  EXPECT_EQ(head[0].weights, std::vector<std::string>{"lm_head.weight"});

  std::vector<OnnxComponent> attention = ofKind(all, "attention");
  ASSERT_EQ(attention.size(), 1u);
  EXPECT_EQ(attention[0].opType, "MatMul+Div+Softmax+MatMul");
  EXPECT_EQ(attention[0].nodes,
            (std::vector<std::string>{
                "layer0/self_attn/scores", "layer0/self_attn/scale",
                "layer0/self_attn/softmax", "layer0/self_attn/context"}));
  EXPECT_TRUE(ofKind(all, "softmax").empty());

  std::vector<OnnxComponent> act = ofKind(all, "activation");
  ASSERT_EQ(act.size(), 1u);
  EXPECT_EQ(act[0].opType, "Sigmoid+Mul");
  EXPECT_EQ(act[0].nodes.size(), 2u);
  EXPECT_TRUE(ofKind(all, "unmapped").empty());

  std::map<std::string, size_t> glue;
  for (const char *kind : {"shape", "elementwise"})
    for (const OnnxComponent &c : ofKind(all, kind))
      glue[c.opType] += c.nodes.size();
  EXPECT_EQ(glue, (std::map<std::string, size_t>{
                      {"Add", 2}, {"Constant", 6}, {"Mul", 1},
                      {"Reshape", 4}, {"Transpose", 4}}));

  std::multiset<std::string> seen;
  for (const OnnxComponent &c : all)
    seen.insert(c.nodes.begin(), c.nodes.end());
  EXPECT_EQ(seen.size(), g->nodes.size());
  for (const OnnxNode &n : g->nodes)
    EXPECT_EQ(seen.count(n.name), 1u) << n.name;
  int64_t sum = 0;
  for (const OnnxTensorInfo &t : g->initializers)
    sum += numel(t);
  EXPECT_EQ(sum, 4656);
  EXPECT_EQ(totalParameters(all), sum);
}

TEST(OnnxModelTest, UnknownOpIsUnmapped) {
  Result<OnnxGraph> g = readOnnxModel(kDataDir + "unknown-op.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message();
  ASSERT_EQ(g->initializers.size(), 1u);
  EXPECT_FALSE(g->initializers[0].external);
  EXPECT_EQ(g->nodes.size(), 2u);
  std::vector<OnnxComponent> all = mapOnnxGraph(*g);
  std::vector<OnnxComponent> unmapped = ofKind(all, "unmapped");
  ASSERT_EQ(unmapped.size(), 1u);
  EXPECT_EQ(unmapped[0].opType, "FancyMixer");
  EXPECT_EQ(unmapped[0].domain, "com.example");
  EXPECT_EQ(unmapped[0].nodes, std::vector<std::string>{"mixed"});
  EXPECT_EQ(unmapped[0].reason,
            "no library op for ONNX com.example::FancyMixer");
  EXPECT_EQ(totalParameters(all), 16);
}

TEST(OnnxModelTest, BadExternalNamesFileAndInitializer) {
  Result<OnnxGraph> g = readOnnxModel(kDataDir + "bad-external.onnx");
  ASSERT_FALSE(g.ok());
  std::string message = g.error().message();
  EXPECT_NE(g.error().file.find("bad-external.onnx"), std::string::npos);
  EXPECT_NE(message.find("bad-external.onnx.data"), std::string::npos)
      << message;
  EXPECT_NE(message.find("proj.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("4096"), std::string::npos) << message;
}

TEST(OnnxModelTest, TruncatedFileIsInputError) {
  std::ifstream in(kDataDir + "tiny-decoder.onnx", std::ios::binary);
  std::string bytes(37, '\0');
  ASSERT_TRUE(in.read(&bytes[0], 37));
  std::string name =
      "adapt-truncated-" + std::to_string(::getpid()) + ".onnx";
  std::string path =
      (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  Result<OnnxGraph> g = readOnnxModel(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().file, path);
  EXPECT_FALSE(g.error().expected.empty());
}

TEST(OnnxModelTest, MissingFileOrFolderOrGarbage) {
  EXPECT_FALSE(readOnnxModel(kDataDir + "no-such.onnx").ok());
  EXPECT_FALSE(readOnnxModel(kDataDir).ok());
  EXPECT_FALSE(parseHere("").ok());
  EXPECT_FALSE(parseHere("{\"not\": \"onnx\"}").ok());
  onnx::ModelProto noGraph;
  noGraph.set_ir_version(8);
  Result<OnnxGraph> g = parseHere(noGraph.SerializeAsString());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().field, "graph");
}

TEST(OnnxModelTest, RejectsEscapingOrMissingExternalData) {
  for (const char *location :
       {"../onnx/tiny-decoder.onnx.data", "/etc/passwd", "sub/../../x.data",
        "C:\\weights.bin", ""}) {
    Result<OnnxGraph> g = parseHere(modelWith([&](onnx::TensorProto &t) {
      setExternal(t, location, "0", "64");
    }));
    ASSERT_FALSE(g.ok()) << location;
    EXPECT_EQ(g.error().field,
              "graph.initializer[0] 'w'.external_data.location");
  }
  Result<OnnxGraph> missing = parseHere(modelWith([](onnx::TensorProto &t) {
    setExternal(t, "absent.data", "0", "64");
  }));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().expected.find("absent.data"), std::string::npos);
}

TEST(OnnxModelTest, ChecksExternalOffsetAndLength) {
  auto external = [](const std::string &offset, const std::string &length) {
    return parseHere(modelWith([&](onnx::TensorProto &t) {
      setExternal(t, "tiny-decoder.onnx.data", offset, length);
    }));
  };
  Result<OnnxGraph> ok = external("64", "64");
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->initializers[0].offset, 64u);
  Result<OnnxGraph> implicit = external("", "");
  ASSERT_TRUE(implicit.ok()) << implicit.error().message();
  EXPECT_EQ(implicit->initializers[0].length, 64u);
  EXPECT_FALSE(external("18446744073709551615", "64").ok());
  EXPECT_FALSE(external("18600", "64").ok());
  EXPECT_FALSE(external("12abc", "64").ok());
  EXPECT_FALSE(external("-1", "64").ok());
  Result<OnnxGraph> wrongLength = external("0", "60");
  ASSERT_FALSE(wrongLength.ok());
  EXPECT_EQ(wrongLength.error().field,
            "graph.initializer[0] 'w'.external_data.length");
}

TEST(OnnxModelTest, ChecksTypesDimsAndInlineSizes) {
  Result<OnnxGraph> badType = parseHere(
      modelWith([](onnx::TensorProto &t) { t.set_data_type(99); }));
  ASSERT_FALSE(badType.ok());
  EXPECT_EQ(badType.error().field, "graph.initializer[0] 'w'.data_type");
  EXPECT_NE(badType.error().expected.find("99"), std::string::npos);
  Result<OnnxGraph> negative = parseHere(modelWith([](onnx::TensorProto &t) {
    t.set_dims(1, -4);
    t.set_raw_data(std::string(64, '\0'));
  }));
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.error().field, "graph.initializer[0] 'w'.dims[1]");
  EXPECT_FALSE(parseHere(modelWith([](onnx::TensorProto &t) {
                 t.set_raw_data(std::string(63, '\0'));
               })).ok());
  EXPECT_FALSE(parseHere(modelWith([](onnx::TensorProto &t) {
                 t.add_float_data(1.0f);
               })).ok());
  std::pair<int, const char *> names[] = {{onnx::TensorProto::BFLOAT16, "BF16"},
                                          {onnx::TensorProto::FLOAT16, "F16"},
                                          {17, "F8_E4M3"},
                                          {19, "F8_E5M2"},
                                          {22, "I4"}};
  for (auto [code, name] : names) {
    Result<OnnxGraph> g = parseHere(modelWith([&](onnx::TensorProto &t) {
      t.set_data_type(code);
      t.set_raw_data(std::string(code == 22 ? 8 : code >= 17 ? 16 : 32, '\0'));
    }));
    ASSERT_TRUE(g.ok()) << name << ": " << g.error().message();
    EXPECT_EQ(g->initializers[0].dtype, name);
  }
}

TEST(OnnxModelTest, MapsLibraryOpsAndTiedEmbeddings) {
  OnnxGraph g;
  g.initializers = {weight("E", {100, 8}), weight("W", {8, 8}),
                    weight("b", {8}), weight("ln", {8}), weight("Wq", {8, 8}),
                    weight("qb", {8})};
  g.nodes = {
      node("emb", "Gather", {"E", "ids"}, {"h0"}),
      node("ln", "LayerNormalization", {"h0", "ln"}, {"h1"}),
      node("gemm", "Gemm", {"h1", "W", "b"}, {"h2"}),
      node("q", "MatMul", {"h2", "Wq"}, {"q0"}),
      node("qbias", "Add", {"q0", "qb"}, {"q1"}),
      node("rope", "RotaryEmbedding", {"q1", "pos"}, {"q2"}, "com.microsoft"),
      node("gqa", "GroupQueryAttention", {"q2"}, {"a"}, "com.microsoft"),
      node("norm", "SkipSimplifiedLayerNormalization", {"a", "h2", "ln"},
           {"n"}, "com.microsoft"),
      node("route", "TopK", {"n", "k"}, {"vals", "idx"}),
      node("relu", "Relu", {"n"}, {"r"}),
      node("foo", "Foo", {"r"}, {"f"}),
      node("bmm", "MatMul", {"f", "r"}, {"m"}),
      node("eT", "Transpose", {"E"}, {"Et"}),
      node("head", "MatMul", {"m", "Et"}, {"logits0"}),
      node("cast", "Cast", {"logits0"}, {"logits"})};
  g.outputs = {weight("logits", {})};
  std::vector<OnnxComponent> all = mapOnnxGraph(g);
  std::map<std::string, std::vector<std::string>> kinds;
  for (const OnnxComponent &c : all)
    kinds[c.kind].insert(kinds[c.kind].end(), c.nodes.begin(), c.nodes.end());
  using Names = std::vector<std::string>;
  EXPECT_EQ(kinds["embedding"], Names{"emb"});
  EXPECT_EQ(kinds["layer_norm"], Names{"ln"});
  EXPECT_EQ(kinds["linear"], (Names{"gemm", "q", "qbias"}));
  EXPECT_EQ(kinds["rotary"], Names{"rope"});
  EXPECT_EQ(kinds["attention"], Names{"gqa"});
  EXPECT_EQ(kinds["rms_norm"], Names{"norm"});
  EXPECT_EQ(kinds["moe_gate"], Names{"route"});
  EXPECT_EQ(kinds["activation"], Names{"relu"});
  EXPECT_EQ(kinds["lm_head"], (Names{"eT", "head"}));
  EXPECT_EQ(kinds["shape"], Names{"cast"});
  EXPECT_EQ(kinds["unmapped"], (Names{"foo", "bmm"}));
  for (const OnnxComponent &c : ofKind(all, "unmapped"))
    EXPECT_EQ(c.reason.rfind("no library op for ONNX ai.onnx::" + c.opType, 0),
              0u)
        << c.reason;
  OnnxComponent head = ofKind(all, "lm_head")[0];
  EXPECT_EQ(head.weights, Names{"E"});
  EXPECT_EQ(head.parameters, 0); // Tied: counted in the embedding.
  EXPECT_EQ(ofKind(all, "embedding")[0].parameters, 800);
  EXPECT_EQ(totalParameters(all), 800 + 64 + 8 + 8 + 64 + 8);
}

TEST(OnnxModelTest, RecognisesRmsNormThroughCasts) {
  OnnxGraph g;
  g.initializers = {weight("w16", {8}), weight("two", {}), weight("eps", {})};
  g.nodes = {node("up", "Cast", {"x"}, {"xf"}),
             node("pow", "Pow", {"xf", "two"}, {"p"}),
             node("mean", "ReduceMean", {"p"}, {"m"}),
             node("add", "Add", {"m", "eps"}, {"a"}),
             node("sqrt", "Sqrt", {"a"}, {"s"}),
             node("inv", "Reciprocal", {"s"}, {"r"}),
             node("norm", "Mul", {"xf", "r"}, {"n"}),
             node("down", "Cast", {"n"}, {"n16"}),
             node("wcast", "Cast", {"w16"}, {"w"}),
             node("scale", "Mul", {"w", "n16"}, {"y"}),
             node("pow2", "Pow", {"y", "y"}, {"z"}),
             node("mean2", "ReduceMean", {"z"}, {"zm"})};
  std::vector<OnnxComponent> all = mapOnnxGraph(g);
  std::vector<OnnxComponent> norms = ofKind(all, "rms_norm");
  ASSERT_EQ(norms.size(), 1u);
  EXPECT_EQ(norms[0].opType, "Pow+ReduceMean+Add+Sqrt+Reciprocal+Mul+Cast+Mul");
  EXPECT_EQ(norms[0].nodes.size(), 9u); // Also the weight's Cast "wcast".
  EXPECT_EQ(norms[0].weights, (std::vector<std::string>{"two", "eps", "w16"}));
  EXPECT_EQ(norms[0].parameters, 10);
  EXPECT_EQ(ofKind(all, "unmapped").size(), 2u); // Pow by a non-constant.
}

TEST(OnnxModelTest, AggregatesGlueAndSkipsResidualHeads) {
  OnnxGraph g;
  g.initializers = {weight("W", {8, 8})};
  std::string value = "x";
  for (int i = 0; i < 3000; ++i) {
    std::string id = std::to_string(i);
    g.nodes.push_back(node("r" + id, "Reshape", {value, "s"}, {"r" + id}));
    g.nodes.push_back(node("a" + id, "Add", {"r" + id, value}, {"a" + id}));
    value = "a" + id;
  }
  g.nodes.push_back(node("down", "MatMul", {value, "W"}, {"d"}));
  g.nodes.push_back(node("residual", "Add", {"d", value}, {"y"}));
  g.outputs = {weight("y", {})};
  std::vector<OnnxComponent> all = mapOnnxGraph(g);
  EXPECT_EQ(all.size(), 3u);
  EXPECT_TRUE(ofKind(all, "lm_head").empty());
  ASSERT_EQ(ofKind(all, "elementwise").size(), 1u);
  EXPECT_EQ(ofKind(all, "elementwise")[0].nodes.size(), 3001u);
}

TEST(OnnxModelTest, ToleratesCyclesAndDanglingNames) {
  OnnxGraph g;
  g.initializers = {weight("W", {2, 2})};
  g.nodes = {node("a", "Transpose", {"b"}, {"a"}),
             node("b", "Transpose", {"a"}, {"b"}),
             node("p", "Pow", {"q", "two"}, {"p"}),
             node("q", "ReduceMean", {"p"}, {"q"}),
             node("m", "MatMul", {"m", "a"}, {"m"}),
             node("s", "Softmax", {"m"}, {}),
             node("e", "", {}, {})};
  g.outputs = {weight("m", {}), weight("nowhere", {})};
  std::vector<OnnxComponent> all = mapOnnxGraph(g);
  size_t nodes = 0;
  for (const OnnxComponent &c : all)
    nodes += c.nodes.size();
  EXPECT_EQ(nodes, g.nodes.size());
}

} // namespace
