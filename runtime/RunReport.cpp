//===- RunReport.cpp - a run's curves as a page people look at ------------===//

#include "runtime/RunReport.h"
#include "runtime/Errors.h"
#include "runtime/FileSystem.h"
#include "runtime/Json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <sys/resource.h>
#ifdef ADAPT_WITH_CUDA_MEMORY
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace adapt::rt {

namespace {

std::string number(double value, const char *format = "%.4g") {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string escaped(const std::string &text) {
  std::string out;
  for (char c : text)
    out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return out;
}

/// A line chart of (step, value) series as inline SVG.
std::string lineChart(const std::string &title, const std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> &series) {
  const double width = 560, height = 220, left = 60, bottom = 30, top = 26;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto &[name, points] : series)
    for (auto [x, y] : points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream svg;
  // The plotted points as data (for programs and tests): {"name": [[step, value], ...]}.
  svg << "<figure data-chart='" << escaped(title) << "' data-series='{";
  for (size_t s = 0; s < series.size(); ++s) {
    svg << (s ? "," : "") << "\"" << escaped(series[s].first) << "\":[";
    for (size_t i = 0; i < series[s].second.size(); ++i)
      svg << (i ? "," : "") << "[" << number(series[s].second[i].first, "%.17g") << ","
          << number(series[s].second[i].second, "%.9g") << "]";
    svg << "]";
  }
  svg << "}'><svg width='" << width << "' height='" << height << "' role='img'><title>"
      << escaped(title) << "</title><text x='" << left << "' y='16' font-weight='bold'>" << escaped(title)
      << "</text>";
  if (!std::isfinite(x0)) {
    svg << "<text x='" << left << "' y='60'>no data</text></svg></figure>";
    return svg.str();
  }
  if (x1 == x0)
    x1 = x0 + 1;
  if (y1 == y0)
    y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.01);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (width - left - 10); };
  auto py = [&](double y) { return height - bottom - (y - y0) / (y1 - y0) * (height - bottom - top); };
  svg << "<line x1='" << left << "' y1='" << height - bottom << "' x2='" << width - 10 << "' y2='"
      << height - bottom << "' stroke='#888'/><line x1='" << left << "' y1='" << top << "' x2='" << left
      << "' y2='" << height - bottom << "' stroke='#888'/>"
      << "<text x='4' y='" << top + 4 << "' font-size='11'>" << number(y1) << "</text>"
      << "<text x='4' y='" << height - bottom << "' font-size='11'>" << number(y0) << "</text>"
      << "<text x='" << left << "' y='" << height - 8 << "' font-size='11'>step " << number(x0, "%.0f")
      << "</text><text x='" << width - 70 << "' y='" << height - 8 << "' font-size='11'>step "
      << number(x1, "%.0f") << "</text>";
  const char *colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  for (size_t s = 0; s < series.size(); ++s) {
    // One point alone (an eval at the end) is a dot; more are a line with dots.
    svg << "<polyline fill='none' stroke-width='1.5' stroke='" << colours[s % 5] << "' points='";
    for (auto [x, y] : series[s].second)
      svg << number(px(x), "%.1f") << "," << number(py(y), "%.1f") << " ";
    svg << "'/>";
    if (series[s].second.size() <= 50)
      for (auto [x, y] : series[s].second)
        svg << "<circle r='2.5' fill='" << colours[s % 5] << "' cx='" << number(px(x), "%.1f") << "' cy='"
            << number(py(y), "%.1f") << "'/>";
    svg << "<text x='" << width - 200 << "' y='" << top + 14 * (s + 1) << "' font-size='11' fill='"
        << colours[s % 5] << "'>" << escaped(series[s].first) << "</text>";
  }
  svg << "</svg></figure>";
  return svg.str();
}

/// One row of cells per entry of ROWS, shaded by value (a heat map table);
/// \p columns, when given, head the columns.
std::string heatTable(const std::string &title, const std::string &rowName,
                      const std::vector<std::vector<double>> &rows, const std::vector<std::string> &columns = {}) {
  double top = 0;
  for (const auto &row : rows)
    for (double v : row)
      top = std::max(top, v);
  std::ostringstream html;
  html << "<h3>" << escaped(title) << "</h3><table class='heat' data-heat='" << escaped(title) << "'>";
  if (!columns.empty()) {
    html << "<tr><th></th>";
    for (const std::string &c : columns)
      html << "<th>" << escaped(c) << "</th>";
    html << "</tr>";
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    html << "<tr><th>" << escaped(rowName) << " " << r << "</th>";
    for (double v : rows[r]) {
      int shade = top > 0 ? static_cast<int>(255 - 200 * v / top) : 255;
      html << "<td style='background:rgb(" << shade << "," << shade << ",255)' title='" << number(v, "%.9g")
           << "'>" << number(v, "%.0f") << "</td>";
    }
    html << "</tr>";
  }
  html << "</table>";
  return html.str();
}

std::vector<std::vector<double>> matrix(const JsonValue *value) {
  std::vector<std::vector<double>> out;
  if (!value || !value->isArray())
    return out;
  for (const JsonValue &row : value->asArray()) {
    std::vector<double> cells;
    if (row.isArray())
      for (const JsonValue &cell : row.asArray())
        cells.push_back(cell.isNumber() ? cell.asDouble() : 0.0);
    if (!cells.empty())
      out.push_back(std::move(cells));
  }
  return out;
}

/// How many steps an expert-load-over-time table shows, and how many MoE
/// layers get one (evenly spaced; a 48-layer, 128-expert model would
/// otherwise make a page of megabytes).
constexpr size_t kLoadColumns = 40, kLoadLayers = 12;

/// Per MoE layer (up to kLoadLayers of them), the share of its routed tokens
/// (%) each expert received at up to kLoadColumns evenly spaced steps: how
/// the load moves as the adapter trains.
std::string expertLoadOverTime(const std::vector<JsonValue> &lines) {
  std::vector<size_t> withLoad;
  for (size_t i = 0; i < lines.size(); ++i)
    if (!matrix(lines[i].find("expert_load")).empty())
      withLoad.push_back(i);
  if (withLoad.empty())
    return "";
  std::vector<size_t> picked;
  const size_t n = withLoad.size(), columns = std::min(n, kLoadColumns);
  for (size_t c = 0; c < columns; ++c)
    picked.push_back(withLoad[columns == 1 ? n - 1 : c * (n - 1) / (columns - 1)]);
  std::vector<std::vector<std::vector<double>>> loads; // [column][layer][expert]
  std::vector<std::string> steps;
  for (size_t i : picked) {
    loads.push_back(matrix(lines[i].find("expert_load")));
    steps.push_back(number(lines[i].find("step")->asDouble(), "%.0f"));
  }
  const size_t layers = loads.back().size();
  std::vector<size_t> shown;
  for (size_t l = 0; l < layers; ++l)
    if (!loads.back()[l].empty())
      shown.push_back(l);
  if (shown.size() > kLoadLayers) {
    std::vector<size_t> spaced;
    for (size_t j = 0; j < kLoadLayers; ++j)
      spaced.push_back(shown[j * (shown.size() - 1) / (kLoadLayers - 1)]);
    shown = spaced;
  }
  std::ostringstream html;
  html << "<h2>Expert load over time</h2><p>Share of each MoE layer's routed tokens per expert (%), at "
       << columns << " of " << n << " steps" << (shown.size() < layers ? ", for evenly spaced layers" : "")
       << ".</p>";
  for (size_t l : shown) {
    const size_t experts = loads.back()[l].size();
    std::vector<std::vector<double>> rows(experts, std::vector<double>(picked.size(), 0.0));
    for (size_t c = 0; c < picked.size(); ++c) {
      if (l >= loads[c].size() || loads[c][l].size() != experts)
        continue;
      double total = 0;
      for (double v : loads[c][l])
        total += v;
      for (size_t e = 0; e < experts; ++e)
        rows[e][c] = total > 0 ? 100.0 * loads[c][l][e] / total : 0.0;
    }
    html << heatTable("layer " + std::to_string(l) + ": expert load (%) by step", "expert", rows, steps);
  }
  return html.str();
}

/// The kernel ledger's tally (OUT/kernels.json, written on a GPU;
/// runtime/KernelLedger.h) as a table: each guarded op's calls that ran its
/// CUDA kernel, were switched off or were refused, sites with refusals
/// first. Empty without a readable file.
std::string kernelTable(const std::string &outDir) {
  JsonValue ledger;
  try {
    ledger = readJsonFile(joinPath(outDir, "kernels.json"));
  } catch (const RuntimeError &) { // none (a CPU run) or unreadable: no table
    return "";
  }
  const JsonValue *sites = ledger.find("sites");
  if (!sites || !sites->isObject())
    return "";
  auto count = [](const JsonValue &site, const char *key) {
    const JsonValue *v = site.find(key);
    return v && v->isInt() ? v->asInt() : int64_t(0);
  };
  std::vector<const std::pair<std::string, JsonValue> *> rows;
  for (const auto &entry : sites->asObject())
    rows.push_back(&entry);
  std::stable_sort(rows.begin(), rows.end(), [&](const auto *a, const auto *b) {
    return (count(a->second, "refused") > 0) > (count(b->second, "refused") > 0);
  });
  std::ostringstream html;
  html << "<h2>CUDA kernels</h2><p>Which guarded ops ran their CUDA kernel, over the eager steps (a captured CUDA "
          "graph replays them without asking). A refused call ran the LibTorch composition: its shapes, dtypes or "
          "layout are not the kernel's. Source: kernels.json.</p><table class='heat'><tr><th>op</th><th>kernel</th>"
          "<th>switched off</th><th>refused</th><th>first refused input</th></tr>";
  for (const auto *row : rows) {
    const JsonValue *first = row->second.find("first_refused");
    html << "<tr><th>" << escaped(row->first) << "</th><td>" << count(row->second, "kernel") << "</td><td>"
         << count(row->second, "switched_off") << "</td><td>" << count(row->second, "refused") << "</td><td>"
         << (first && first->isString() ? escaped(first->asString()) : "") << "</td></tr>";
  }
  html << "</table>";
  return html.str();
}

} // namespace

void writeRunReport(const std::string &outDir) {
  std::ifstream in(joinPath(outDir, "metrics.jsonl"));
  std::vector<JsonValue> lines;
  std::string text;
  while (std::getline(in, text)) {
    try {
      JsonValue line = parseJson(text, "metrics.jsonl");
      if (line.isObject() && line.find("step"))
        lines.push_back(std::move(line));
    } catch (const std::exception &) {
    }
  }
  auto curve = [&](const char *key) {
    std::vector<std::pair<double, double>> points;
    for (const JsonValue &line : lines) {
      const JsonValue *v = line.find(key);
      if (v && v->isNumber())
        points.push_back({line.find("step")->asDouble(), v->asDouble()});
    }
    return points;
  };
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>adapt run: " << escaped(outDir)
       << "</title><style>body{font-family:sans-serif;margin:2em}figure{display:inline-block;margin:0 1em 1em 0}"
          "table.heat{border-collapse:collapse;font-size:10px}table.heat td,table.heat th{border:1px solid #ddd;"
          "padding:1px 3px;text-align:right}</style></head><body><h1>Training run</h1><p>"
       << escaped(outDir) << ": " << lines.size() << " steps";
  if (!lines.empty())
    if (const JsonValue *layout = lines.back().find("layout"); layout && layout->isString())
      html << ", layout " << escaped(layout->asString());
  html << ". Source: metrics.jsonl (one line per step).</p>";
  // The eval loss from the untrained adapter's (step 0) on.
  std::vector<std::pair<double, double>> evalCurve = curve("eval_loss");
  if (!lines.empty())
    if (const JsonValue *v = lines.front().find("eval_loss_untrained"); v && v->isNumber())
      evalCurve.insert(evalCurve.begin(), {0.0, v->asDouble()});
  if (evalCurve.empty())
    html << lineChart("loss", {{"loss", curve("loss")}});
  else
    html << lineChart("loss", {{"loss", curve("loss")}, {"eval loss", evalCurve}});
  html << lineChart("gradient norm (before clipping)", {{"grad_norm", curve("grad_norm")}});
  html << lineChart("learning rate", {{"lr", curve("lr")}});
  html << lineChart("tokens/s", {{"tokens_per_s", curve("tokens_per_s")}});
  if (!curve("mfu").empty())
    html << lineChart("MFU (3 x forward FLOPs of the active parameters + attention, over the peak)",
                      {{"mfu", curve("mfu")}});
  if (!curve("allreduce_s").empty())
    html << lineChart("collectives per step (s)", {{"gradient all-reduce", curve("allreduce_s")},
                                                   {"expert all-to-all", curve("alltoall_s")},
                                                   {"tensor-parallel all-reduce", curve("tp_allreduce_s")}});
  if (!lines.empty()) {
    const JsonValue &last = lines.back();
    auto load = matrix(last.find("expert_load"));
    if (!load.empty() && !load.front().empty())
      html << heatTable("expert load, last step (tokens per routed expert)", "layer", load);
    auto perRank = matrix(last.find("expert_load_per_ep_rank"));
    if (!perRank.empty())
      html << heatTable("expert load per expert-parallel rank, last step (tokens)", "layer", perRank);
    for (const char *key : {"peak_host_gib", "peak_device_gib"})
      if (const JsonValue *memory = last.find(key); memory && memory->isArray()) {
        html << "<h3>" << (key[5] == 'h' ? "peak host memory per rank (GiB)" : "peak device memory per rank (GiB)")
             << "</h3><table class='heat'><tr>";
        int rank = 0;
        for (const JsonValue &v : memory->asArray())
          html << "<td>rank " << rank++ << ": " << number(v.isNumber() ? v.asDouble() : 0, "%.2f") << "</td>";
        html << "</tr></table>";
      }
  }
  html << expertLoadOverTime(lines);
  html << kernelTable(outDir);
  html << "</body></html>\n";
  writeFileAtomic(joinPath(outDir, "report.html"), html.str());
}

double peakHostGiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0); // kB -> GiB
}

double peakDeviceGiB(int deviceIndex) {
#ifdef ADAPT_WITH_CUDA_MEMORY
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(deviceIndex));
  return static_cast<double>(
             stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
         (1024.0 * 1024.0 * 1024.0);
#else
  (void)deviceIndex;
  return 0.0;
#endif
}

} // namespace adapt::rt
