//===- RunReport.cpp - a run's curves as a page people look at ------------===//

#include "runtime/RunReport.h"
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
  svg << "<figure><svg width='" << width << "' height='" << height << "' role='img'><title>"
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
    svg << "<polyline fill='none' stroke-width='1.5' stroke='" << colours[s % 5] << "' points='";
    for (auto [x, y] : series[s].second)
      svg << number(px(x), "%.1f") << "," << number(py(y), "%.1f") << " ";
    svg << "'/><text x='" << width - 200 << "' y='" << top + 14 * (s + 1) << "' font-size='11' fill='"
        << colours[s % 5] << "'>" << escaped(series[s].first) << "</text>";
  }
  svg << "</svg></figure>";
  return svg.str();
}

/// One row of cells per entry of ROWS, shaded by value (a heat map table).
std::string heatTable(const std::string &title, const std::string &rowName,
                      const std::vector<std::vector<double>> &rows) {
  double top = 0;
  for (const auto &row : rows)
    for (double v : row)
      top = std::max(top, v);
  std::ostringstream html;
  html << "<h3>" << escaped(title) << "</h3><table class='heat'>";
  for (size_t r = 0; r < rows.size(); ++r) {
    html << "<tr><th>" << escaped(rowName) << " " << r << "</th>";
    for (double v : rows[r]) {
      int shade = top > 0 ? static_cast<int>(255 - 200 * v / top) : 255;
      html << "<td style='background:rgb(" << shade << "," << shade << ",255)' title='" << number(v)
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
  html << lineChart("loss", {{"loss", curve("loss")}});
  html << lineChart("gradient norm (before clipping)", {{"grad_norm", curve("grad_norm")}});
  html << lineChart("learning rate", {{"lr", curve("lr")}});
  html << lineChart("tokens/s", {{"tokens_per_s", curve("tokens_per_s")}});
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
  html << "</body></html>\n";
  writeFileAtomic(joinPath(outDir, "metrics.html"), html.str());
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
