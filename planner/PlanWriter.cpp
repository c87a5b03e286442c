//===- PlanWriter.cpp - plan.json, plan.md and plan.html ------------------===//

#include "planner/PlanWriter.h"

#include "parser/AtomicFile.h"
#include "passes/ReportWriter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

namespace adapt::plan {

namespace {

using Json = nlohmann::ordered_json;
constexpr double kGiB = double(1ull << 30);
constexpr size_t kShown = 10; ///< Runners-up in plan.md and plan.html.

double gib(double bytes) { return bytes / kGiB; }

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

/// Memory categories in display order: (name, bytes).
std::vector<std::pair<std::string, double>> memoryParts(const MemoryEstimate &m) {
  return {{"frozen weights", m.weights}, {"routed experts", m.experts}, {"adapters + gradients", m.adapters},
          {"optimizer state", m.optimizer}, {"activations", m.activations}, {"buffers", m.buffers},
          {"CUDA context", m.context}};
}

/// Step-time parts in display order: (name, seconds).
std::vector<std::pair<std::string, double>> timeParts(const TimeEstimate &t) {
  return {{"compute", t.compute}, {"expert all-to-all", t.expertAllToAll}, {"TP all-reduce", t.tensorParallel},
          {"CP exchange", t.contextParallel}, {"gradient reduction", t.dataParallel}, {"pipeline bubble", t.bubble}};
}

Json layoutJson(const Layout &l) {
  return {{"tp", l.tp}, {"ep", l.ep}, {"pp", l.pp}, {"cp", l.cp}, {"dp", l.dp}, {"recompute", l.recompute},
          {"text", l.text()}};
}

Json candidateJson(const Candidate &c) {
  Json memory = Json::object(), time = Json::object();
  for (const auto &[name, bytes] : memoryParts(c.memory))
    memory[name] = bytes;
  memory["total"] = c.memory.total();
  for (const auto &[name, seconds] : timeParts(c.time))
    time[name] = seconds;
  time["total"] = c.time.total();
  return {{"layout", layoutJson(c.layout)}, {"fits", c.fits}, {"tokens_per_s", c.tokensPerSecond},
          {"memory_bytes", memory}, {"step_seconds", time}, {"verdict", c.verdict}};
}

/// The candidates shown: the chosen one and the next kShown.
std::vector<const Candidate *> shown(const Plan &plan) {
  std::vector<const Candidate *> out;
  for (size_t i = 0; i < plan.candidates.size() && out.size() <= kShown; ++i)
    out.push_back(&plan.candidates[i]);
  return out;
}

/// A horizontal stacked bar per candidate: one SVG.
std::string stackedBars(const std::vector<const Candidate *> &rows,
                        const std::function<std::vector<std::pair<std::string, double>>(const Candidate &)> &parts,
                        double scale, const std::string &unit, double limit) {
  static const char *colours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1"};
  const int rowHeight = 22, labelWidth = 230, barWidth = 560;
  double widest = limit;
  for (const Candidate *c : rows) {
    double sum = 0;
    for (const auto &p : parts(*c))
      sum += p.second;
    widest = std::max(widest, sum);
  }
  std::ostringstream s;
  const int height = int(rows.size()) * rowHeight + 30;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << labelWidth + barWidth + 90 << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Candidate &c = *rows[i];
    const int y = int(i) * rowHeight;
    s << "<text x=\"0\" y=\"" << y + 15 << "\">" << htmlEscape(c.layout.text()) << "</text>\n";
    double x = labelWidth, sum = 0;
    size_t k = 0;
    for (const auto &[name, value] : parts(c)) {
      const double w = widest > 0 ? value / widest * barWidth : 0;
      if (w > 0)
        s << "<rect x=\"" << fixed(x, 1) << "\" y=\"" << y + 3 << "\" width=\"" << fixed(w, 1) << "\" height=\""
          << rowHeight - 6 << "\" fill=\"" << colours[k % 7] << "\"><title>" << htmlEscape(name) << ": "
          << fixed(value * scale, 2) << " " << unit << "</title></rect>\n";
      x += w;
      sum += value;
      ++k;
    }
    s << "<text x=\"" << fixed(x + 4, 1) << "\" y=\"" << y + 15 << "\">" << fixed(sum * scale, 1) << " " << unit
      << "</text>\n";
  }
  if (limit > 0) {
    const double x = labelWidth + limit / widest * barWidth;
    s << "<line x1=\"" << fixed(x, 1) << "\" y1=\"0\" x2=\"" << fixed(x, 1) << "\" y2=\"" << height - 25
      << "\" stroke=\"#000\" stroke-dasharray=\"4 3\"/><text x=\"" << fixed(x + 3, 1) << "\" y=\"" << height - 10
      << "\">GPU memory</text>\n";
  }
  s << "</svg>\n";
  std::ostringstream legend;
  legend << "<p class=\"legend\">";
  size_t k = 0;
  if (!rows.empty())
    for (const auto &p : parts(*rows.front()))
      legend << "<span style=\"background:" << colours[k++ % 7] << "\"></span>" << htmlEscape(p.first) << " ";
  legend << "</p>\n";
  return legend.str() + s.str();
}

std::string verdictLine(const Plan &plan) {
  if (plan.chosen < 0)
    return "No layout fits. " + plan.refusal + ".";
  const Candidate &c = plan.candidates[size_t(plan.chosen)];
  return c.layout.text() + ": " + fixed(c.tokensPerSecond / 1000.0, 1) + "K tokens/s, " +
         fixed(gib(c.memory.total()), 1) + " GiB on the busiest GPU, " + fixed(c.time.total(), 3) + " s per step.";
}

} // namespace

std::string renderPlanJson(const Plan &plan) {
  const PlanRequest &r = plan.request;
  const ModelFacts &f = plan.facts;
  const Hardware &h = *plan.hardware;
  Json j;
  j["schema_version"] = "1";
  j["model"] = {{"name", f.name},
                {"layers", f.layers},
                {"hidden", f.hidden},
                {"total_parameters", f.totalParameters},
                {"active_parameters", f.activeParameters},
                {"expert_parameters", f.expertParameters},
                {"moe_layers", f.moeLayers},
                {"experts", f.experts},
                {"top_k", f.topK},
                {"softmax_layers", f.softmaxLayers},
                {"sparse_layers", f.sparseLayers},
                {"delta_rule_layers", f.deltaRuleLayers},
                {"lightning_layers", f.lightningLayers},
                {"delta_rule_runs", f.deltaRuleRuns},
                {"lora_parameters", f.attentionAdapter + f.expertAdapter + f.mlpAdapter}};
  j["request"] = {{"gpus", r.gpus},           {"gpus_per_node", r.gpusPerNode},
                  {"gpu_memory_bytes", r.gpuMemoryBytes > 0 ? r.gpuMemoryBytes : h.memoryBytes},
                  {"memory_headroom", kMemoryHeadroom},
                  {"seq_len", r.seqLen},      {"global_batch", r.globalBatch},
                  {"micro_batch", r.microBatch}, {"lora_rank", r.loraRank},
                  {"lora_attention", r.loraAttention}, {"lora_experts", r.loraExperts}, {"lora_mlp", r.loraMlp},
                  {"weights_dtype", r.fp8Weights ? "fp8" : "bf16"}};
  j["hardware"] = {{"name", h.name},
                   {"bf16_flops", h.bf16Flops},
                   {"intra_node_bytes_per_s", h.intraNodeBytesPerS},
                   {"inter_node_bytes_per_s", h.interNodeBytesPerS},
                   {"layer_efficiency", h.layerEfficiency},
                   {"head_efficiency", h.headEfficiency},
                   {"activation_scale", h.activationScale}};
  j["rules"] = plan.rules;
  j["layouts_considered"] = plan.layoutsConsidered;
  j["chosen"] = plan.chosen >= 0 ? candidateJson(plan.candidates[size_t(plan.chosen)]) : Json(nullptr);
  j["refusal"] = plan.chosen >= 0 ? Json(nullptr) : Json(plan.refusal);
  j["suggestions"] = plan.suggestions;
  Json all = Json::array();
  for (const Candidate &c : plan.candidates)
    all.push_back(candidateJson(c));
  j["candidates"] = std::move(all);
  return j.dump(2) + "\n";
}

std::string renderPlanMarkdown(const Plan &plan) {
  const PlanRequest &r = plan.request;
  std::ostringstream md;
  md << "# Plan: " << plan.facts.name << " on " << r.gpus << " GPUs\n\n";
  md << verdictLine(plan) << "\n\n";
  md << "Request: " << r.gpus << " GPUs (" << r.gpusPerNode << " per node), sequences of " << r.seqLen
     << " tokens, global batch " << r.globalBatch << ", micro-batch " << r.microBatch << ", LoRA rank " << r.loraRank
     << ", " << (r.fp8Weights ? "FP8" : "bf16") << " frozen weights. " << plan.layoutsConsidered
     << " layouts considered; a layout fits when its estimate is at most 90 % of the GPU's memory.\n\n";
  if (plan.chosen < 0) {
    md << "What would fit:\n\n";
    for (const std::string &s : plan.suggestions)
      md << "- " << s << "\n";
    md << "\n";
  }
  md << "| layout | fits | tokens/s | GiB per GPU | weights | experts | adapters+optimizer | activations | step s | "
        "compute | all-to-all | TP | CP | DP | bubble | verdict |\n";
  md << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Candidate *c : shown(plan)) {
    const MemoryEstimate &m = c->memory;
    const TimeEstimate &t = c->time;
    md << "| " << c->layout.text() << " | " << (c->fits ? "yes" : "no") << " | " << fixed(c->tokensPerSecond, 0)
       << " | " << fixed(gib(m.total()), 1) << " | " << fixed(gib(m.weights), 1) << " | " << fixed(gib(m.experts), 1)
       << " | " << fixed(gib(m.adapters + m.optimizer), 1) << " | " << fixed(gib(m.activations), 1) << " | "
       << fixed(t.total(), 3) << " | " << fixed(t.compute, 3) << " | " << fixed(t.expertAllToAll, 3) << " | "
       << fixed(t.tensorParallel, 3) << " | " << fixed(t.contextParallel, 3) << " | " << fixed(t.dataParallel, 3)
       << " | " << fixed(t.bubble, 3) << " | " << c->verdict << " |\n";
  }
  md << "\nRules:\n\n";
  for (const std::string &rule : plan.rules)
    md << "- " << rule << "\n";
  md << "\nEstimates from `planner/Hardware.cpp` (" << plan.hardware->name
     << "; each constant names its source), checked against H200 measurements in docs/performance.md.\n";
  return md.str();
}

std::string renderPlanHtml(const Plan &plan) {
  const double memory = plan.request.gpuMemoryBytes > 0 ? plan.request.gpuMemoryBytes : plan.hardware->memoryBytes;
  std::vector<const Candidate *> rows = shown(plan);
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>adapt plan: " << htmlEscape(plan.facts.name)
    << "</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
       "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,td:last-child"
       "{text-align:left}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 10px}"
       ".verdict{font-size:1.2em;padding:.5em;background:"
    << (plan.chosen >= 0 ? "#e6f4ea" : "#fde7e9") << "}</style></head><body>\n";
  h << "<h1>Plan: " << htmlEscape(plan.facts.name) << " on " << plan.request.gpus << " GPUs</h1>\n";
  h << "<p class=\"verdict\">" << htmlEscape(verdictLine(plan)) << "</p>\n";
  if (plan.chosen < 0) {
    h << "<ul>";
    for (const std::string &s : plan.suggestions)
      h << "<li>" << htmlEscape(s) << "</li>";
    h << "</ul>\n";
  }
  h << "<h2>Memory on the busiest GPU (GiB)</h2>\n"
    << stackedBars(rows, [](const Candidate &c) { return memoryParts(c.memory); }, 1.0 / kGiB, "GiB", memory);
  h << "<h2>Step time (s)</h2>\n"
    << stackedBars(rows, [](const Candidate &c) { return timeParts(c.time); }, 1.0, "s", 0.0);
  h << "<h2>Layouts</h2>\n<table><tr><th>layout</th><th>fits</th><th>tokens/s</th><th>GiB</th><th>step s</th>"
       "<th>verdict</th></tr>\n";
  for (const Candidate *c : rows)
    h << "<tr><td>" << htmlEscape(c->layout.text()) << "</td><td>" << (c->fits ? "yes" : "no") << "</td><td>"
      << fixed(c->tokensPerSecond, 0) << "</td><td>" << fixed(gib(c->memory.total()), 1) << "</td><td>"
      << fixed(c->time.total(), 3) << "</td><td>" << htmlEscape(c->verdict) << "</td></tr>\n";
  h << "</table>\n<h2>Rules</h2>\n<ul>";
  for (const std::string &rule : plan.rules)
    h << "<li>" << htmlEscape(rule) << "</li>";
  h << "</ul>\n</body></html>\n";
  return h.str();
}

bool writePlan(const Plan &plan, const std::string &dir, std::string &error) {
  std::vector<std::pair<std::string, std::string>> files;
  try {
    files = {{"plan.json", renderPlanJson(plan)}, {"plan.md", renderPlanMarkdown(plan)},
             {"plan.html", renderPlanHtml(plan)}};
  } catch (const std::exception &e) {
    error = std::string("cannot render the plan: ") + e.what();
    return false;
  }
  return writeFilesAtomically(dir, files, error);
}

} // namespace adapt::plan
