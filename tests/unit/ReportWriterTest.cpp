//===- ReportWriterTest.cpp - tests of the gaps.* writers ------*- C++ -*-===//
//
// Builds a DeepSeek-V3-like GapReport (61 decoder layers, MLA attention,
// three dense layers then sigmoid-routed MoE that the library lacks) and
// checks what the writers make of it: the JSON round-trips with the fields
// of docs/gaps-schema.md, output is deterministic, hostile strings are
// escaped in all three formats, and writeGapReport is atomic and fails
// cleanly.
//
//===----------------------------------------------------------------------===//

#include "passes/ReportWriter.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace adapt {
namespace {

namespace fs = std::filesystem;

/// A reason string that tries to break out of every format at once.
const std::string kHostile = "</script><b>\"&'|";

/// DeepSeek-V3 shapes, so the parameter figures are the real ones.
constexpr int64_t kHidden = 7168, kVocab = 129280, kLayers = 61, kDense = 3;
constexpr int64_t kMla = 7168 * 1536 + 1536 + 1536 * 128 * 192 +
                         7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168;
constexpr int64_t kDenseMlp = 3 * kHidden * 18432;
constexpr int64_t kExpert = 3 * kHidden * 2048;
constexpr int64_t kRouter = 256 * kHidden + 256;
constexpr int64_t kMoe = 257 * kExpert + kRouter;
constexpr int64_t kMoeActive = 9 * kExpert + kRouter;
constexpr int64_t kNorms = kLayers * 2 * kHidden + kHidden;
constexpr int64_t kEmbedding = kVocab * kHidden;
constexpr int64_t kMoeLayers = kLayers - kDense;
constexpr int64_t kDecoder = kEmbedding * 2 + kLayers * kMla +
                             kDense * kDenseMlp + kMoeLayers * kMoe + kNorms;
constexpr int64_t kActive = kEmbedding * 2 + kLayers * kMla +
                            kDense * kDenseMlp + kMoeLayers * kMoeActive +
                            kNorms;
constexpr int64_t kMtp = 11'500'000'000;

/// Layer indices first..last inclusive.
std::vector<int64_t> range(int64_t first, int64_t last) {
  std::vector<int64_t> layers;
  for (int64_t l = first; l <= last; ++l)
    layers.push_back(l);
  return layers;
}

/// A supported component with the given id, op, layers and size.
ComponentGap supported(const std::string &id, const std::string &op,
                       std::vector<int64_t> layers, int64_t params) {
  ComponentGap c;
  c.id = id;
  c.op = op;
  c.variant = id;
  c.status = GapStatus::Supported;
  c.layers = std::move(layers);
  c.parameters = c.activeParameters = params;
  c.registryEntry = id;
  return c;
}

/// The DeepSeek-V3-like report every test starts from.
GapReport deepSeekReport() {
  GapReport r;
  r.source = "/models/DeepSeek-V3";
  r.modelType = "deepseek_v3";
  r.architecture = "DeepseekV3ForCausalLM";
  r.family = "deepseek";
  r.summary = "6 components: 4 supported, 1 partial, 1 missing";
  r.parameters.decoder = kDecoder;
  r.parameters.embedding = kEmbedding;
  r.parameters.lmHead = kEmbedding;
  r.parameters.mtp = kMtp;
  r.parameters.total = kDecoder + kMtp;
  r.parameters.active = kActive;
  r.parameters.activeWithMtp = kActive + 1'000'000'000;
  r.parameters.activeWithoutEmbedding = kActive - kEmbedding;
  r.parameters.activeNonEmbedding = kActive - 2 * kEmbedding;
  r.parameters.decoderNonEmbedding = kDecoder - 2 * kEmbedding;
  r.parameters.byComponent = {{"attention", kLayers * kMla},
                              {"embedding", kEmbedding},
                              {"lm_head", kEmbedding},
                              {"mlp", kDense * kDenseMlp},
                              {"moe", kMoeLayers * kMoe},
                              {"norm", kNorms}};
  r.components.push_back(supported("embedding", "adapt.embedding", {-1},
                                   kEmbedding));
  ComponentGap mla = supported("attention.mla", "adapt.attention",
                               range(0, kLayers - 1), kLayers * kMla);
  mla.variant = "MLA, q_lora_rank 1536, kv_lora_rank 512, rope 64 (yarn)";
  mla.features = {{"kind", "mla"}, {"rope", "yarn"}, {"q_lora_rank", "1536"}};
  mla.status = GapStatus::Partial;
  mla.reasons = {"no backward kernel for absorbed MLA", kHostile};
  mla.blocks.backward = true;
  mla.blocks.lora = true;
  mla.blocks.parallelLayouts = {"cp"};
  r.components.push_back(mla);
  r.components.push_back(supported("mlp.swiglu", "adapt.mlp",
                                   range(0, kDense - 1), kDense * kDenseMlp));
  ComponentGap moe;
  moe.id = "moe.sigmoid.grouped.bias";
  moe.op = "adapt.moe";
  moe.variant = "256 routed + 1 shared, top-8, sigmoid, 8 groups (top 4)";
  moe.features = {{"scoring", "sigmoid"}, {"n_group", "8"},
                  {"topk_group", "4"}, {"correction_bias", "true"}};
  moe.status = GapStatus::Missing;
  moe.reasons = {"sigmoid scoring with group-limited routing is not in the "
                 "registry",
                 "e_score_correction_bias has no kernel"};
  moe.layers = range(kDense, kLayers - 1);
  moe.parameters = kMoeLayers * kMoe;
  moe.activeParameters = kMoeLayers * kMoeActive;
  moe.blocks.forward = moe.blocks.backward = moe.blocks.lora = true;
  moe.blocks.parallelLayouts = {"ep", "tp"};
  r.components.push_back(moe);
  r.components.push_back(supported("norm.rms", "adapt.rms_norm",
                                   range(0, kLayers - 1), kNorms));
  r.components.push_back(supported("lm_head", "adapt.linear", {-1},
                                   kEmbedding));
  r.unknownConfigKeys = {{"quantization_config.fmt", "\"e4m3\""},
                         {"ep_size", "1"}};
  r.manifest.checked = true;
  r.manifest.file = "model.safetensors.index.json";
  r.manifest.tensors = 91991;
  r.manifest.expectedTensors = 91990;
  r.manifest.shards = 163;
  r.manifest.headersRead = 2;
  r.manifest.issues = {{"extra", "model.layers.61.eh_proj.weight", "",
                        "[7168, 14336]"},
                       {"dtype", "model.layers.3.mlp.experts.0.up_proj.weight",
                        "bf16", "f8_e4m3"}};
  r.notes = {"layer 61 is the MTP module; counted under parameters.mtp"};
  return r;
}

/// Reads a whole file.
std::string slurp(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

/// A fresh empty directory under the system temp folder.
fs::path freshDir() {
  std::string pattern =
      (fs::temp_directory_path() / "adapt-rw-XXXXXX").string();
  char *made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return fs::path(pattern);
}

TEST(GapReportTest, StatusNamesAndVerdict) {
  EXPECT_STREQ(gapStatusName(GapStatus::Missing), "missing");
  EXPECT_STREQ(gapStatusName(GapStatus::Partial), "partial");
  EXPECT_STREQ(gapStatusName(GapStatus::Supported), "supported");
  GapReport r;
  EXPECT_FALSE(r.hasGaps());
  r.components.push_back(supported("a", "adapt.a", {0}, 1));
  EXPECT_FALSE(r.hasGaps());
  r.manifest.issues.push_back({"missing", "w", "[1]", ""});
  EXPECT_TRUE(r.hasGaps());
  r.manifest.issues.clear();
  r.components[0].status = GapStatus::Partial;
  EXPECT_TRUE(r.hasGaps());
}

TEST(ReportWriterTest, LayerRanges) {
  EXPECT_EQ(formatLayerRanges({}), "");
  EXPECT_EQ(formatLayerRanges({-1}), "");
  EXPECT_EQ(formatLayerRanges(range(3, 60)), "3-60");
  EXPECT_EQ(formatLayerRanges({0, 4, 8}), "0,4,8");
  EXPECT_EQ(formatLayerRanges({0, 1}), "0,1");
  EXPECT_EQ(formatLayerRanges({7}), "7");
  EXPECT_EQ(formatLayerRanges({12, 5, 3, 4, 4, 10, 11, 20, -1}),
            "3-5,10-12,20");
}

TEST(ReportWriterTest, ParameterCounts) {
  EXPECT_EQ(formatParameterCount(671'026'419'200), "671.03B");
  EXPECT_EQ(formatParameterCount(671'000'000'000), "671.0B");
  EXPECT_EQ(formatParameterCount(37'500'000), "37.5M");
  EXPECT_EQ(formatParameterCount(1234), "1,234");
  EXPECT_EQ(formatParameterCount(0), "0");
  EXPECT_EQ(formatParameterCount(999'999), "999,999");
  EXPECT_EQ(formatParameterCount(1'000'000), "1.0M");
  EXPECT_EQ(formatParameterCount(999'999'999), "1.0B");
  EXPECT_EQ(formatParameterCount(1'200'000'000'000), "1.2T");
  EXPECT_EQ(formatParameterCount(-1234), "-1,234");
  EXPECT_EQ(formatParameterCount(std::numeric_limits<int64_t>::max()),
            "9.22E");
  EXPECT_EQ(formatParameterCount(std::numeric_limits<int64_t>::min()),
            "-9.22E");
}

TEST(ReportWriterTest, JsonRoundTripsDocumentedFields) {
  GapReport report = deepSeekReport();
  std::string text = renderGapsJson(report);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.rfind("{\n  \"schema_version\": \"1\",\n", 0), 0u);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  // Layer lists stay on one line; everything else is nlohmann's dump(2).
  EXPECT_NE(text.find("\"layers\": [0, 1, 2],"), std::string::npos);
  EXPECT_NE(text.find("      \"layers\": [-1],\n"), std::string::npos);
  GapReport noLayers = report;
  for (ComponentGap &c : noLayers.components)
    c.layers.clear();
  std::string plain = renderGapsJson(noLayers);
  EXPECT_EQ(plain, nlohmann::ordered_json::parse(plain).dump(2) + "\n");

  std::vector<std::string> keys;
  for (const auto &item : j.items())
    keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "schema_version", "source", "model", "summary",
                      "has_gaps", "status_counts", "parameters", "components",
                      "unknown_config_keys", "manifest", "notes", "assumptions"}));
  EXPECT_EQ(j["source"], "/models/DeepSeek-V3");
  EXPECT_EQ(j["model"]["model_type"], "deepseek_v3");
  EXPECT_EQ(j["model"]["architecture"], "DeepseekV3ForCausalLM");
  EXPECT_EQ(j["model"]["family"], "deepseek");
  EXPECT_EQ(j["summary"], report.summary);
  EXPECT_EQ(j["has_gaps"], true);
  EXPECT_EQ(j["status_counts"]["missing"], 1);
  EXPECT_EQ(j["status_counts"]["partial"], 1);
  EXPECT_EQ(j["status_counts"]["supported"], 4);

  const auto &p = j["parameters"];
  EXPECT_EQ(p["total"].get<int64_t>(), kDecoder + kMtp);
  EXPECT_EQ(p["active"].get<int64_t>(), kActive);
  EXPECT_EQ(p["decoder"].get<int64_t>(), kDecoder);
  EXPECT_EQ(p["embedding"].get<int64_t>(), kEmbedding);
  EXPECT_EQ(p["lm_head"].get<int64_t>(), kEmbedding);
  EXPECT_EQ(p["mtp"].get<int64_t>(), kMtp);
  EXPECT_EQ(p["encoders"].get<int64_t>(), 0);
  EXPECT_EQ(p["active_with_mtp"].get<int64_t>(), kActive + 1'000'000'000);
  EXPECT_EQ(p["active_without_embedding"].get<int64_t>(),
            kActive - kEmbedding);
  EXPECT_EQ(p["active_non_embedding"].get<int64_t>(), kActive - 2 * kEmbedding);
  EXPECT_EQ(p["decoder_non_embedding"].get<int64_t>(),
            kDecoder - 2 * kEmbedding);
  EXPECT_EQ(p["by_component"]["moe"].get<int64_t>(), kMoeLayers * kMoe);
  EXPECT_EQ(p["by_component"].size(), 6u);
  // The real model: about 671B in the decoder, about 37B active.
  EXPECT_EQ(formatParameterCount(kDecoder), "671.03B");
  EXPECT_EQ(formatParameterCount(kActive).substr(0, 2), "37");

  ASSERT_EQ(j["components"].size(), 6u);
  const auto &moe = j["components"][3];
  keys.clear();
  for (const auto &item : moe.items())
    keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "id", "op", "variant", "features", "status", "reasons",
                      "layers", "parameters", "active_parameters", "blocks",
                      "registry_entry", "next_step"}));
  EXPECT_EQ(moe["id"], "moe.sigmoid.grouped.bias");
  EXPECT_EQ(moe["op"], "adapt.moe");
  EXPECT_EQ(moe["status"], "missing");
  EXPECT_EQ(moe["features"]["n_group"], "8");
  EXPECT_EQ(moe["reasons"].size(), 2u);
  EXPECT_EQ(moe["layers"].size(), 58u);
  EXPECT_EQ(moe["layers"].front(), 3);
  EXPECT_EQ(moe["layers"].back(), 60);
  EXPECT_EQ(moe["parameters"].get<int64_t>(), kMoeLayers * kMoe);
  EXPECT_EQ(moe["active_parameters"].get<int64_t>(), kMoeLayers * kMoeActive);
  EXPECT_EQ(moe["blocks"]["forward"], true);
  EXPECT_EQ(moe["blocks"]["backward"], true);
  EXPECT_EQ(moe["blocks"]["lora"], true);
  EXPECT_EQ(moe["blocks"]["parallel_layouts"],
            nlohmann::ordered_json::array({"ep", "tp"}));
  EXPECT_EQ(moe["registry_entry"], "");
  EXPECT_EQ(j["components"][1]["status"], "partial");
  EXPECT_EQ(j["components"][1]["reasons"][1], kHostile);
  EXPECT_EQ(j["components"][0]["layers"], nlohmann::ordered_json::array({-1}));

  ASSERT_EQ(j["unknown_config_keys"].size(), 2u);
  EXPECT_EQ(j["unknown_config_keys"][0]["path"], "quantization_config.fmt");
  EXPECT_EQ(j["unknown_config_keys"][0]["value"], "\"e4m3\"");
  EXPECT_EQ(j["unknown_config_keys"][0]["possibly_significant"], false);
  EXPECT_EQ(j["unknown_config_keys"][1]["possibly_significant"], true); // ep_size: a size
  const auto &m = j["manifest"];
  EXPECT_EQ(m["checked"], true);
  EXPECT_EQ(m["file"], "model.safetensors.index.json");
  EXPECT_EQ(m["tensors"], 91991);
  EXPECT_EQ(m["expected_tensors"], 91990);
  EXPECT_EQ(m["shards"], 163);
  EXPECT_EQ(m["headers_read"], 2);
  ASSERT_EQ(m["issues"].size(), 2u);
  EXPECT_EQ(m["issues"][1]["kind"], "dtype");
  EXPECT_EQ(m["issues"][1]["expected"], "bf16");
  EXPECT_EQ(m["issues"][1]["found"], "f8_e4m3");
  EXPECT_EQ(j["notes"].size(), 1u);
}

TEST(ReportWriterTest, RenderingIsDeterministic) {
  GapReport report = deepSeekReport();
  EXPECT_EQ(renderGapsJson(report), renderGapsJson(deepSeekReport()));
  EXPECT_EQ(renderGapsMarkdown(report), renderGapsMarkdown(deepSeekReport()));
  EXPECT_EQ(renderGapsHtml(report), renderGapsHtml(deepSeekReport()));
}

TEST(ReportWriterTest, HostileStringsAreEscaped) {
  GapReport report = deepSeekReport();
  report.components[0].id = kHostile;
  report.components[0].reasons = {"line one\nline two | " + kHostile};
  report.notes.push_back("# not a heading " + kHostile);
  report.notes.push_back("bad utf8 \xff\xfe and nul \x01");
  report.unknownConfigKeys.push_back({kHostile, kHostile});

  nlohmann::json j = nlohmann::json::parse(renderGapsJson(report));
  EXPECT_EQ(j["components"][0]["id"], kHostile);
  EXPECT_EQ(j["components"][1]["reasons"][1], kHostile);
  EXPECT_EQ(j["unknown_config_keys"][2]["value"], kHostile);
  EXPECT_NE(j["notes"][2].get<std::string>().find("\xEF\xBF\xBD"),
            std::string::npos);

  std::string md = renderGapsMarkdown(report);
  EXPECT_EQ(md.find("</script>"), std::string::npos);
  EXPECT_EQ(md.find("<b>"), std::string::npos);
  EXPECT_NE(md.find("\\</script\\>\\<b\\>\"\\&'\\|"), std::string::npos);
  EXPECT_EQ(md.find("\n# not a heading"), std::string::npos);
  EXPECT_EQ(md.find("line one\n"), std::string::npos);
  // Every components row keeps exactly nine unescaped pipes (eight cells).
  std::istringstream lines(md);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    if (line.find("adapt.") == std::string::npos || line[0] != '|')
      continue;
    int pipes = 0;
    for (size_t i = 0; i < line.size(); ++i)
      if (line[i] == '|' && (i == 0 || line[i - 1] != '\\'))
        ++pipes;
    EXPECT_EQ(pipes, 9) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 6);

  std::string html = renderGapsHtml(report);
  EXPECT_EQ(html.find("</script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>\""), std::string::npos);
  EXPECT_EQ(html.find("\"&'"), std::string::npos);
  EXPECT_NE(html.find("&lt;/script&gt;&lt;b&gt;&quot;&amp;&#39;|"),
            std::string::npos);
  EXPECT_EQ(html.find('\x01'), std::string::npos);
  EXPECT_EQ(html.find('\xff'), std::string::npos);
}

TEST(ReportWriterTest, MarkdownLayoutAndCaps) {
  GapReport report = deepSeekReport();
  for (int i = 0; i < 120; ++i)
    report.manifest.issues.push_back(
        {"missing", "model.layers." + std::to_string(i) + ".w", "[1]", ""});
  std::string md = renderGapsMarkdown(report);
  EXPECT_EQ(md.rfind("# adapt gaps: DeepseekV3ForCausalLM\n", 0), 0u);
  EXPECT_NE(md.find("| Total | 682.53B |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 3-60 |"), std::string::npos);
  EXPECT_NE(md.find("| `moe.sigmoid.grouped.bias` | `adapt.moe` |"),
            std::string::npos);
  EXPECT_NE(md.find("`deepseek_v3`"), std::string::npos);
  EXPECT_NE(md.find("q_lora_rank 1536"), std::string::npos);
  EXPECT_NE(md.find("| 0-60 |"), std::string::npos);
  EXPECT_NE(md.find("... and 72 more"), std::string::npos);
  // Worst status first: the missing MoE row precedes the partial MLA row.
  EXPECT_LT(md.find("moe.sigmoid"), md.find("attention.mla"));
  EXPECT_LT(md.find("attention.mla"), md.find("norm.rms"));
  nlohmann::json j = nlohmann::json::parse(renderGapsJson(report));
  EXPECT_EQ(j["manifest"]["issues"].size(), 122u);
}

TEST(ReportWriterTest, HtmlIsSelfContained) {
  GapReport report = deepSeekReport();
  for (int i = 0; i < 40; ++i)
    report.manifest.issues.push_back(
        {"shape", "t" + std::to_string(i), "[2]", "[3]"});
  std::string html = renderGapsHtml(report);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char *external : {"http://", "https://", "<script", "<link",
                               "@import", "url(", "<img"})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  size_t cells = 0;
  for (size_t at = html.find("cell overall"); at != std::string::npos;
       at = html.find("cell overall", at + 1))
    ++cells;
  EXPECT_EQ(cells, static_cast<size_t>(kLayers));
  EXPECT_NE(html.find("title=\"Layer 3: missing"), std::string::npos);
  EXPECT_NE(html.find("title=\"Layer 0: partial"), std::string::npos);
  EXPECT_NE(html.find("<details>"), std::string::npos);
  EXPECT_NE(html.find("badge missing"), std::string::npos);
}

TEST(ReportWriterTest, WritesAtomicallyAndLeavesNoTemporaries) {
  fs::path root = freshDir();
  fs::path out = root / "nested" / "out";
  GapReport report = deepSeekReport();
  std::string error;
  ASSERT_TRUE(writeGapReport(report, out.string(), error)) << error;
  report.summary = "second run";
  ASSERT_TRUE(writeGapReport(report, out.string(), error)) << error;
  std::vector<std::string> names;
  for (const auto &entry : fs::directory_iterator(out))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"gaps.html", "gaps.json",
                                             "gaps.md"}));
  EXPECT_EQ(slurp(out / "gaps.json"), renderGapsJson(report));
  EXPECT_EQ(slurp(out / "gaps.md"), renderGapsMarkdown(report));
  EXPECT_EQ(slurp(out / "gaps.html"), renderGapsHtml(report));
  fs::remove_all(root);
}

TEST(ReportWriterTest, UnwritableDirectoryIsAnError) {
  fs::path root = freshDir();
  fs::path file = root / "plain-file";
  std::ofstream(file) << "x";
  std::string error;
  EXPECT_FALSE(
      writeGapReport(deepSeekReport(), (file / "out").string(), error));
  EXPECT_NE(error.find("plain-file"), std::string::npos) << error;
  size_t entries = 0;
  for (const auto &entry : fs::directory_iterator(root)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
  fs::remove_all(root);
}

TEST(ReportWriterTest, JsonMatchesPublishedSchema) {
  fs::path here = fs::path(__FILE__).parent_path();
  fs::path script = here / "check_gaps_schema.py";
  fs::path schema = here / ".." / ".." / "docs" / "gaps.schema.json";
  if (!fs::exists(script) || !fs::exists(schema) ||
      std::system("python3 -c pass >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "schema checker, schema or python3 not available";
  fs::path root = freshDir();
  GapReport report = deepSeekReport();
  report.notes.push_back(kHostile);
  std::ofstream(root / "gaps.json") << renderGapsJson(report);
  std::ofstream(root / "empty.json") << renderGapsJson(GapReport());
  for (const char *name : {"gaps.json", "empty.json"}) {
    std::string command = "python3 '" + script.string() + "' '" +
                          schema.string() + "' '" + (root / name).string() +
                          "'";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
  fs::remove_all(root);
}

} // namespace
} // namespace adapt

// Unknown keys whose names read like structure are flagged for a human; the
// names below are real unknown keys of shared configs (Hunyuan-A13B's
// cross-layer attention sharing, Ming's feature switches) or bookkeeping.
TEST(ReportWriterTest, UnknownKeysThatLookStructuralAreFlagged) {
  for (const char *key : {"cla_share_factor", "vit_mapping_type", "vision_config.num_layers",
                          "full_attn_layers", "audio_config.tie_word_embeddings",
                          "llm_config.use_interleaved_frame_timestamp", "index_head_dim"})
    EXPECT_FALSE(adapt::structuralHint(key).empty()) << key;
  for (const char *key : {"quantization_config.fmt", "pool_type_name", "vit_remove_prenorm",
                          "transformers_version", "initializer_range"})
    EXPECT_TRUE(adapt::structuralHint(key).empty()) << key;
}
