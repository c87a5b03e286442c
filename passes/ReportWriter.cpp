//===- ReportWriter.cpp - gaps.json, gaps.md and gaps.html writers -*- C++ -*-===//
//
// Three renderers over one GapReport plus an atomic writer. All report
// strings come from user files (config keys, tensor names), so each format
// escapes them fully: JSON through nlohmann with invalid UTF-8 replaced,
// Markdown with backslash escapes and no raw newlines in table cells, HTML
// with the five entity escapes. Nothing here reads the clock or the
// environment, so output depends on the report alone.
//
//===----------------------------------------------------------------------===//

#include "passes/ReportWriter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <map>
#include <system_error>
#include <tuple>

#include <fcntl.h>
#include <unistd.h>

namespace adapt {
namespace {

using Json = nlohmann::ordered_json;

/// Most manifest issues listed in gaps.md; gaps.json keeps all of them.
constexpr size_t kMarkdownIssueRows = 50;
/// Most manifest issues listed in gaps.html, to keep the page light.
constexpr size_t kHtmlIssueRows = 1000;
/// Lists longer than this are folded into a closed <details> in gaps.html.
constexpr size_t kHtmlFoldRows = 20;

/// Appends code point `cp` to `out` as UTF-8.
void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// Returns `text` as valid UTF-8 without control characters other than tab
/// and newline: bad bytes and controls become U+FFFD, "\r\n" and "\r" become
/// "\n". Markdown and HTML renderers would otherwise pass them through.
std::string sanitizeText(const std::string &text) {
  std::string out;
  out.reserve(text.size());
  const auto *bytes = reinterpret_cast<const unsigned char *>(text.data());
  size_t size = text.size();
  for (size_t i = 0; i < size;) {
    unsigned char lead = bytes[i];
    if (lead == '\r') {
      out += '\n';
      i += (i + 1 < size && bytes[i + 1] == '\n') ? 2 : 1;
      continue;
    }
    if (lead < 0x80) {
      if ((lead < 0x20 && lead != '\t' && lead != '\n') || lead == 0x7F)
        appendUtf8(out, 0xFFFD);
      else
        out += static_cast<char>(lead);
      ++i;
      continue;
    }
    size_t length = lead >= 0xF8   ? 0
                    : lead >= 0xF0 ? 4
                    : lead >= 0xE0 ? 3
                    : lead >= 0xC0 ? 2
                                   : 0;
    uint32_t cp = length == 4 ? lead & 0x07 : length == 3 ? lead & 0x0F : lead & 0x1F;
    bool valid = length != 0 && i + length <= size;
    for (size_t k = 1; valid && k < length; ++k) {
      valid = (bytes[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (bytes[i + k] & 0x3F);
    }
    static const uint32_t minimum[5] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && cp >= minimum[length] && cp <= 0x10FFFF &&
            !(cp >= 0xD800 && cp <= 0xDFFF) && !(cp >= 0x80 && cp < 0xA0);
    if (!valid) {
      appendUtf8(out, 0xFFFD);
      ++i;
      continue;
    }
    out.append(text, i, length);
    i += length;
  }
  return out;
}

/// Escapes `text` for HTML text and quoted attribute values.
std::string htmlEscape(const std::string &text) {
  std::string out;
  for (char c : sanitizeText(text)) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&#39;"; break;
    default: out += c;
    }
  }
  return out;
}

/// Escapes `text` for one line of Markdown (a table cell or a list item):
/// inline-markup characters get a backslash, newlines become <br> so a cell
/// never spans lines, and a leading character that would start a block
/// (heading, list, quote) is escaped.
std::string markdownEscape(const std::string &text) {
  std::string clean = sanitizeText(text);
  std::string out;
  for (size_t i = 0; i < clean.size(); ++i) {
    char c = clean[i];
    if (c == '\n') {
      out += "<br>";
      continue;
    }
    if (std::strchr("\\`*_[]<>|&~#!", c) ||
        (i == 0 && std::strchr("+-=", c)))
      out += '\\';
    out += c;
  }
  size_t digits = 0;
  while (digits < out.size() && out[digits] >= '0' && out[digits] <= '9')
    ++digits;
  if (digits > 0 && digits < out.size() &&
      (out[digits] == '.' || out[digits] == ')'))
    out.insert(digits, "\\");
  return out.empty() ? std::string(" ") : out;
}

/// "1,234,567": the exact count with thousands separators.
std::string groupThousands(int64_t count) {
  std::string digits = std::to_string(count < 0 ? -(count + 1) + uint64_t(1)
                                                : uint64_t(count));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return count < 0 ? "-" + out : out;
}

/// Formats `value` with `decimals` digits after the point, C locale style.
std::string formatFixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

/// Components in report order, stably sorted worst status first.
std::vector<const ComponentGap *> worstFirst(const GapReport &report) {
  std::vector<const ComponentGap *> sorted;
  for (const ComponentGap &component : report.components)
    sorted.push_back(&component);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ComponentGap *a, const ComponentGap *b) {
                     return a->status < b->status;
                   });
  return sorted;
}

/// Number of components with each status, indexed by GapStatus.
std::vector<int64_t> statusCounts(const GapReport &report) {
  std::vector<int64_t> counts(3, 0);
  for (const ComponentGap &component : report.components)
    ++counts[static_cast<size_t>(component.status)];
  return counts;
}

/// What a component's gap blocks, as short words ("forward", "LoRA", "tp").
std::vector<std::string> blockedWords(const BlockedCapabilities &blocks) {
  std::vector<std::string> words;
  if (blocks.forward)
    words.push_back("forward");
  if (blocks.backward)
    words.push_back("backward");
  if (blocks.lora)
    words.push_back("LoRA");
  for (const std::string &layout : blocks.parallelLayouts)
    words.push_back(layout);
  return words;
}

/// Decoder layers covered by the report: the highest layer index plus one.
int64_t decoderLayerCount(const GapReport &report) {
  int64_t highest = -1;
  for (const ComponentGap &component : report.components)
    for (int64_t layer : component.layers)
      highest = std::max(highest, layer);
  return highest + 1;
}

/// The name shown in titles: architecture, else model type, else source.
std::string modelTitle(const GapReport &report) {
  if (!report.architecture.empty())
    return report.architecture;
  if (!report.modelType.empty())
    return report.modelType;
  return report.source.empty() ? std::string("model") : report.source;
}

/// Manifest issue counts per kind, sorted by kind, as "missing 3, shape 1".
std::string issueKindSummary(const ManifestCheck &manifest) {
  std::map<std::string, int64_t> byKind;
  for (const ManifestIssue &issue : manifest.issues)
    ++byKind[issue.kind];
  std::string out;
  for (const auto &[kind, count] : byKind)
    out += (out.empty() ? "" : ", ") + kind + " " + std::to_string(count);
  return out;
}

} // namespace

std::string formatLayerRanges(const std::vector<int64_t> &layers) {
  std::vector<int64_t> sorted;
  for (int64_t layer : layers)
    if (layer >= 0)
      sorted.push_back(layer);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t start = 0; start < sorted.size();) {
    size_t end = start;
    while (end + 1 < sorted.size() && sorted[end + 1] == sorted[end] + 1)
      ++end;
    if (!out.empty())
      out += ',';
    if (end - start >= 2) {
      out += std::to_string(sorted[start]) + "-" + std::to_string(sorted[end]);
    } else {
      for (size_t i = start; i <= end; ++i)
        out += (i == start ? "" : ",") + std::to_string(sorted[i]);
    }
    start = end + 1;
  }
  return out;
}

std::string formatParameterCount(int64_t count) {
  if (count > -1000000 && count < 1000000)
    return groupThousands(count);
  static const char *const units[] = {"M", "B", "T", "P", "E"};
  double magnitude = count < 0 ? -static_cast<double>(count)
                               : static_cast<double>(count);
  size_t unit = 0;
  double scaled = magnitude / 1e6;
  while (unit + 1 < std::size(units) && scaled >= 999.995) {
    scaled /= 1000.0;
    ++unit;
  }
  std::string text = formatFixed(scaled, 2);
  if (text.back() == '0')
    text.pop_back();
  return (count < 0 ? "-" : "") + text + units[unit];
}

std::string renderGapsJson(const GapReport &report) {
  Json root = Json::object();
  root["schema_version"] = report.schemaVersion;
  root["source"] = report.source;
  Json model = Json::object();
  model["model_type"] = report.modelType;
  model["architecture"] = report.architecture;
  model["family"] = report.family;
  root["model"] = model;
  root["summary"] = report.summary;
  root["has_gaps"] = report.hasGaps();
  std::vector<int64_t> counts = statusCounts(report);
  Json statusJson = Json::object();
  for (GapStatus status :
       {GapStatus::Missing, GapStatus::Partial, GapStatus::Supported})
    statusJson[gapStatusName(status)] = counts[static_cast<size_t>(status)];
  root["status_counts"] = statusJson;

  const ParameterCounts &p = report.parameters;
  Json params = Json::object();
  params["total"] = p.total;
  params["active"] = p.active;
  params["decoder"] = p.decoder;
  params["embedding"] = p.embedding;
  params["lm_head"] = p.lmHead;
  params["mtp"] = p.mtp;
  params["encoders"] = p.encoders;
  params["active_with_mtp"] = p.activeWithMtp;
  Json byComponent = Json::object();
  for (const auto &[kind, count] : p.byComponent)
    byComponent[kind] = count;
  params["by_component"] = byComponent;
  root["parameters"] = params;

  Json components = Json::array();
  for (const ComponentGap &c : report.components) {
    Json item = Json::object();
    item["id"] = c.id;
    item["op"] = c.op;
    item["variant"] = c.variant;
    Json features = Json::object();
    for (const auto &[key, value] : c.features)
      features[key] = value;
    item["features"] = features;
    item["status"] = gapStatusName(c.status);
    item["reasons"] = c.reasons;
    item["layers"] = c.layers;
    item["parameters"] = c.parameters;
    item["active_parameters"] = c.activeParameters;
    Json blocks = Json::object();
    blocks["forward"] = c.blocks.forward;
    blocks["backward"] = c.blocks.backward;
    blocks["lora"] = c.blocks.lora;
    blocks["parallel_layouts"] = c.blocks.parallelLayouts;
    item["blocks"] = blocks;
    item["registry_entry"] = c.registryEntry;
    components.push_back(item);
  }
  root["components"] = components;

  Json unknown = Json::array();
  for (const auto &[path, value] : report.unknownConfigKeys) {
    Json item = Json::object();
    item["path"] = path;
    item["value"] = value;
    unknown.push_back(item);
  }
  root["unknown_config_keys"] = unknown;

  const ManifestCheck &m = report.manifest;
  Json manifest = Json::object();
  manifest["checked"] = m.checked;
  manifest["file"] = m.file;
  manifest["tensors"] = m.tensors;
  manifest["expected_tensors"] = m.expectedTensors;
  manifest["shards"] = m.shards;
  manifest["headers_read"] = m.headersRead;
  Json issues = Json::array();
  for (const ManifestIssue &issue : m.issues) {
    Json item = Json::object();
    item["kind"] = issue.kind;
    item["tensor"] = issue.tensor;
    item["expected"] = issue.expected;
    item["found"] = issue.found;
    issues.push_back(item);
  }
  manifest["issues"] = issues;
  root["manifest"] = manifest;
  root["notes"] = report.notes;
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string renderGapsMarkdown(const GapReport &report) {
  std::string md;
  const ParameterCounts &p = report.parameters;
  md += "# adapt gaps: " + markdownEscape(modelTitle(report)) + "\n\n";
  md += report.hasGaps() ? "**Gaps found.** " : "**No gaps.** ";
  md += markdownEscape(report.summary.empty() ? std::string("(no summary)")
                                               : report.summary) + "\n\n";
  md += "- Source: " + markdownEscape(report.source) + "\n";
  md += "- Model type: " + markdownEscape(report.modelType) +
        "; architecture: " + markdownEscape(report.architecture) +
        "; family: " + markdownEscape(report.family) + "\n";
  md += "- Schema version: " + markdownEscape(report.schemaVersion) + "\n\n";

  md += "## Parameters\n\n| Part | Parameters | Exact |\n|---|---:|---:|\n";
  const std::pair<const char *, int64_t> rows[] = {
      {"Total", p.total},         {"Active per token", p.active},
      {"Active with MTP", p.activeWithMtp},
      {"Decoder", p.decoder},     {"Embedding", p.embedding},
      {"LM head", p.lmHead},      {"MTP", p.mtp},
      {"Encoders", p.encoders}};
  for (const auto &[name, count] : rows)
    md += std::string("| ") + name + " | " + formatParameterCount(count) +
          " | " + groupThousands(count) + " |\n";
  if (!p.byComponent.empty()) {
    md += "\n| Component kind | Parameters | Exact |\n|---|---:|---:|\n";
    for (const auto &[kind, count] : p.byComponent)
      md += "| " + markdownEscape(kind) + " | " + formatParameterCount(count) +
            " | " + groupThousands(count) + " |\n";
  }

  md += "\n## Components\n\n";
  if (report.components.empty()) {
    md += "No components.\n";
  } else {
    md += "| Status | Component | Op | Variant | Layers | Parameters | "
          "Blocks | Why |\n|---|---|---|---|---|---:|---|---|\n";
    for (const ComponentGap *c : worstFirst(report)) {
      std::string status = gapStatusName(c->status);
      if (c->status != GapStatus::Supported)
        status = "**" + status + "**";
      std::string layers = formatLayerRanges(c->layers);
      std::string blocked;
      for (const std::string &word : blockedWords(c->blocks))
        blocked += (blocked.empty() ? "" : ", ") + markdownEscape(word);
      std::string why;
      for (const std::string &reason : c->reasons)
        why += (why.empty() ? "" : "<br>") + markdownEscape(reason);
      std::string params = formatParameterCount(c->parameters);
      if (c->activeParameters != c->parameters)
        params += " (" + formatParameterCount(c->activeParameters) + " active)";
      md += "| " + status + " | " + markdownEscape(c->id) + " | " +
            markdownEscape(c->op) + " | " + markdownEscape(c->variant) +
            " | " + (layers.empty() ? "-" : layers) + " | " + params + " | " +
            (blocked.empty() ? "-" : blocked) + " | " +
            (why.empty() ? "-" : why) + " |\n";
    }
  }

  md += "\n## Unknown config keys\n\n";
  if (report.unknownConfigKeys.empty()) {
    md += "None.\n";
  } else {
    md += "| Key | Value |\n|---|---|\n";
    for (const auto &[path, value] : report.unknownConfigKeys)
      md += "| " + markdownEscape(path) + " | " + markdownEscape(value) +
            " |\n";
  }

  const ManifestCheck &m = report.manifest;
  md += "\n## Manifest\n\n";
  if (!m.checked) {
    md += "Not checked (no weight index found).\n";
  } else {
    md += "- File: " + markdownEscape(m.file) + "\n";
    md += "- Tensors: " + groupThousands(m.tensors) + " in manifest, " +
          groupThousands(m.expectedTensors) + " implied by the config\n";
    md += "- Shards: " + groupThousands(m.shards) + " (" +
          groupThousands(m.headersRead) + " headers read)\n\n";
    if (m.issues.empty()) {
      md += "No disagreements.\n";
    } else {
      md += std::to_string(m.issues.size()) + " issues (" +
            issueKindSummary(m) + ").\n\n";
      md += "| Kind | Tensor | Expected | Found |\n|---|---|---|---|\n";
      size_t shown = std::min(m.issues.size(), kMarkdownIssueRows);
      for (size_t i = 0; i < shown; ++i) {
        const ManifestIssue &issue = m.issues[i];
        md += "| " + markdownEscape(issue.kind) + " | " +
              markdownEscape(issue.tensor) + " | " +
              markdownEscape(issue.expected) + " | " +
              markdownEscape(issue.found) + " |\n";
      }
      if (m.issues.size() > shown)
        md += "\n... and " + std::to_string(m.issues.size() - shown) +
              " more (all listed in gaps.json).\n";
    }
  }

  if (!report.notes.empty()) {
    md += "\n## Notes\n\n";
    for (const std::string &note : report.notes)
      md += "- " + markdownEscape(note) + "\n";
  }
  return md;
}

namespace {

/// The page's stylesheet: system fonts only, light theme, status colours
/// shared by badges, layer cells and bars.
const char *const kHtmlStyle = R"css(
:root{--missing:#cf222e;--partial:#d4a72c;--supported:#2da44e;--none:#d0d7de;
--ink:#1f2328;--muted:#59636e;--line:#d1d9e0;--panel:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;background:#fff;color:var(--ink);font:14px/1.5 -apple-system,
"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1320px;margin:0 auto;padding:28px 32px 48px}
header{border-bottom:1px solid var(--line);padding-bottom:18px;margin-bottom:22px}
h1{font-size:26px;margin:0 0 6px;display:flex;align-items:center;gap:12px;flex-wrap:wrap}
h2{font-size:18px;margin:32px 0 12px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:16px 0 8px;color:var(--muted);font-weight:600}
.meta{color:var(--muted);margin:2px 0}.meta b{color:var(--ink);font-weight:600}
.summary{font-size:15px;margin:10px 0 0}
code,.mono{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.badge{display:inline-block;border-radius:999px;padding:1px 10px;font-size:12px;
font-weight:600;color:#fff;white-space:nowrap;line-height:20px}
.badge.missing{background:var(--missing)}.badge.partial{background:var(--partial);color:#3b2300}
.badge.supported{background:var(--supported)}
.verdict{font-size:13px;padding:3px 12px}.verdict.ok{background:var(--supported)}
.verdict.gaps{background:var(--missing)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 14px;background:var(--panel)}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600;margin-top:2px}
.card .sub{color:var(--muted);font-size:12px}
.bar{display:flex;height:26px;border-radius:6px;overflow:hidden;border:1px solid var(--line);
background:var(--panel)}
.bar span{display:block;height:100%;border-right:1px solid rgba(255,255,255,.7)}
.bar span:last-child{border-right:0}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:8px 0 4px;font-size:13px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:3px;margin-right:6px;
vertical-align:-1px}
.legend .num{color:var(--muted)}
.missing-bg{background:var(--missing)}.partial-bg{background:var(--partial)}
.supported-bg{background:var(--supported)}.none-bg{background:var(--none)}
.layers{display:grid;gap:2px;align-items:center}
.layers .name{font-size:12px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;
padding-right:10px}
.layers .cell{height:18px;border-radius:2px}
.layers .cell.empty{background:#f0f2f4}
.layers .tick{font-size:10px;color:var(--muted);overflow:visible;white-space:nowrap;height:14px}
.layers .overall{height:26px}
.layers .sep{grid-column:1/-1;height:6px}
table{border-collapse:collapse;width:100%;font-size:13px}
th{text-align:left;background:var(--panel);font-weight:600;color:var(--muted);font-size:12px;
text-transform:uppercase;letter-spacing:.03em}
th,td{border-bottom:1px solid var(--line);padding:7px 10px;vertical-align:top}
td.num,th.num{text-align:right;white-space:nowrap}
tr.missing td:first-child{box-shadow:inset 3px 0 var(--missing)}
tr.partial td:first-child{box-shadow:inset 3px 0 var(--partial)}
tr.supported td:first-child{box-shadow:inset 3px 0 var(--supported)}
td ul{margin:0;padding-left:18px}
.chip{display:inline-block;background:#eef1f4;border:1px solid var(--line);border-radius:4px;
padding:0 5px;margin:1px 2px 1px 0;font-size:11.5px;white-space:nowrap}
.chip.block{background:#ffebe9;border-color:#ffcecb;color:#82071e}
.sub{color:var(--muted);font-size:12px}
.wrap{word-break:break-all}
details{border:1px solid var(--line);border-radius:8px;padding:8px 12px}
summary{cursor:pointer;font-weight:600}
.notes li{margin:4px 0}
footer{margin-top:36px;color:var(--muted);font-size:12px;border-top:1px solid var(--line);
padding-top:10px}
)css";

/// Colours for component kinds in the parameter bar, in order of size.
const char *const kPalette[] = {"#0969da", "#8250df", "#bf3989", "#1a7f37",
                                "#bc4c00", "#0598bc", "#9a6700", "#57606a",
                                "#6639ba", "#116329", "#a40e26", "#0550ae"};

/// A coloured status badge.
std::string htmlBadge(GapStatus status) {
  std::string name = gapStatusName(status);
  return "<span class=\"badge " + name + "\">" + name + "</span>";
}

/// One stacked bar with a legend; `parts` are (label, value, css colour).
std::string htmlStackedBar(
    const std::vector<std::tuple<std::string, int64_t, std::string>> &parts) {
  double total = 0;
  for (const auto &part : parts)
    total += static_cast<double>(std::max<int64_t>(std::get<1>(part), 0));
  if (total <= 0)
    return "<p class=\"sub\">No parameters counted.</p>\n";
  std::string bar = "<div class=\"bar\">";
  std::string legend = "<div class=\"legend\">";
  for (const auto &[label, value, colour] : parts) {
    double share = static_cast<double>(std::max<int64_t>(value, 0)) / total;
    std::string percent = formatFixed(100.0 * share, 1) + "%";
    std::string tip = htmlEscape(label) + ": " + formatParameterCount(value) +
                      " (" + percent + ")";
    if (share > 0)
      bar += "<span style=\"width:" + formatFixed(100.0 * share, 3) +
             "%;background:" + colour + "\" title=\"" + tip + "\"></span>";
    legend += "<span title=\"" + groupThousands(value) + "\"><i style=\"background:" +
              colour + "\"></i>" + htmlEscape(label) + " <span class=\"num\">" +
              formatParameterCount(value) + " &middot; " + percent +
              "</span></span>";
  }
  return bar + "</div>\n" + legend + "</div>\n";
}

/// The per-layer strip (worst status per decoder layer) and the layer map
/// (one row per component), so the layer pattern is visible at a glance.
std::string htmlLayerMap(const GapReport &report) {
  int64_t layers = decoderLayerCount(report);
  if (layers <= 0)
    return "<p class=\"sub\">No component names a decoder layer.</p>\n";
  std::vector<int> worst(static_cast<size_t>(layers), -1);
  std::vector<std::string> tips(static_cast<size_t>(layers));
  for (const ComponentGap &c : report.components) {
    for (int64_t layer : c.layers) {
      if (layer < 0)
        continue;
      int rank = static_cast<int>(c.status);
      int &slot = worst[static_cast<size_t>(layer)];
      slot = slot < 0 ? rank : std::min(slot, rank);
      tips[static_cast<size_t>(layer)] +=
          "\n" + htmlEscape(c.id) + ": " + gapStatusName(c.status);
    }
  }
  auto cellClass = [](int rank) {
    return rank < 0 ? std::string("empty")
                    : std::string(gapStatusName(static_cast<GapStatus>(rank))) +
                          "-bg";
  };
  std::string html = "<div class=\"layers\" style=\"grid-template-columns:"
                     "200px repeat(" + std::to_string(layers) +
                     ",minmax(0,1fr))\">\n<div class=\"name\"></div>";
  for (int64_t l = 0; l < layers; ++l)
    html += "<div class=\"tick\">" +
            (l % 5 == 0 ? std::to_string(l) : std::string()) + "</div>";
  html += "\n<div class=\"name\"><b>All components</b></div>";
  for (int64_t l = 0; l < layers; ++l) {
    int rank = worst[static_cast<size_t>(l)];
    html += "<div class=\"cell overall " + cellClass(rank) + "\" title=\"Layer " +
            std::to_string(l) + ": " +
            (rank < 0 ? "no component"
                      : gapStatusName(static_cast<GapStatus>(rank))) +
            tips[static_cast<size_t>(l)] + "\"></div>";
  }
  html += "\n<div class=\"sep\"></div>\n";
  for (const ComponentGap &c : report.components) {
    std::vector<bool> used(static_cast<size_t>(layers), false);
    bool any = false;
    for (int64_t layer : c.layers)
      if (layer >= 0)
        used[static_cast<size_t>(layer)] = any = true;
    if (!any)
      continue;
    std::string id = htmlEscape(c.id);
    html += "<div class=\"name\" title=\"" + id + "\">" + id + "</div>";
    for (int64_t l = 0; l < layers; ++l)
      html += used[static_cast<size_t>(l)]
                  ? "<div class=\"cell " + cellClass(int(c.status)) +
                        "\" title=\"Layer " + std::to_string(l) + ": " + id +
                        " (" + gapStatusName(c.status) + ")\"></div>"
                  : std::string("<div class=\"cell empty\"></div>");
    html += "\n";
  }
  return html + "</div>\n";
}

/// Wraps `body` in a closed <details> when `rows` is long, else returns it.
std::string htmlFold(const std::string &body, size_t rows,
                     const std::string &label) {
  if (rows <= kHtmlFoldRows)
    return body;
  return "<details><summary>" + label + "</summary>\n" + body + "</details>\n";
}

/// The components table, worst status first.
std::string htmlComponents(const GapReport &report) {
  if (report.components.empty())
    return "<p class=\"sub\">No components.</p>\n";
  std::string html =
      "<table>\n<tr><th>Status</th><th>Component</th><th>Variant</th>"
      "<th>Layers</th><th class=\"num\">Parameters</th><th>Blocks</th>"
      "<th>Why</th></tr>\n";
  for (const ComponentGap *c : worstFirst(report)) {
    std::string status = gapStatusName(c->status);
    html += "<tr class=\"" + status + "\"><td>" + htmlBadge(c->status) +
            "</td><td><code>" + htmlEscape(c->id) + "</code><div class=\"sub\">" +
            htmlEscape(c->op) + (c->registryEntry.empty()
                                     ? std::string(" &middot; no registry entry")
                                     : " &middot; registry: " +
                                           htmlEscape(c->registryEntry)) +
            "</div></td><td>" + htmlEscape(c->variant);
    if (!c->features.empty()) {
      html += "<div>";
      for (const auto &[key, value] : c->features)
        html += "<span class=\"chip\">" + htmlEscape(key) + "=" +
                htmlEscape(value) + "</span>";
      html += "</div>";
    }
    std::string layers = formatLayerRanges(c->layers);
    html += "</td><td class=\"mono wrap\">" +
            (layers.empty() ? std::string("&ndash;") : layers) +
            "</td><td class=\"num\" title=\"" + groupThousands(c->parameters) +
            "\">" + formatParameterCount(c->parameters);
    if (c->activeParameters != c->parameters)
      html += "<div class=\"sub\">" + formatParameterCount(c->activeParameters) +
              " active</div>";
    html += "</td><td>";
    std::vector<std::string> words = blockedWords(c->blocks);
    for (const std::string &word : words)
      html += "<span class=\"chip block\">" + htmlEscape(word) + "</span>";
    if (words.empty())
      html += "<span class=\"sub\">nothing</span>";
    html += "</td><td>";
    if (c->reasons.empty()) {
      html += "<span class=\"sub\">&ndash;</span>";
    } else {
      html += "<ul>";
      for (const std::string &reason : c->reasons)
        html += "<li>" + htmlEscape(reason) + "</li>";
      html += "</ul>";
    }
    html += "</td></tr>\n";
  }
  return html + "</table>\n";
}

/// The manifest section: what was compared, then the disagreements.
std::string htmlManifest(const ManifestCheck &m) {
  if (!m.checked)
    return "<p class=\"sub\">Not checked: no weight index was found.</p>\n";
  std::string html = "<p class=\"meta\"><b>" + htmlEscape(m.file) + "</b> &middot; " +
                     groupThousands(m.tensors) + " tensors in manifest, " +
                     groupThousands(m.expectedTensors) +
                     " implied by the config &middot; " + groupThousands(m.shards) +
                     " shards, " + groupThousands(m.headersRead) +
                     " headers read</p>\n";
  if (m.issues.empty())
    return html + "<p>No disagreements between config and manifest.</p>\n";
  std::string table = "<table>\n<tr><th>Kind</th><th>Tensor</th><th>Expected"
                      "</th><th>Found</th></tr>\n";
  size_t shown = std::min(m.issues.size(), kHtmlIssueRows);
  for (size_t i = 0; i < shown; ++i) {
    const ManifestIssue &issue = m.issues[i];
    table += "<tr><td><span class=\"chip block\">" + htmlEscape(issue.kind) +
             "</span></td><td><code class=\"wrap\">" + htmlEscape(issue.tensor) +
             "</code></td><td class=\"mono\">" + htmlEscape(issue.expected) +
             "</td><td class=\"mono\">" + htmlEscape(issue.found) + "</td></tr>\n";
  }
  table += "</table>\n";
  if (m.issues.size() > shown)
    table += "<p class=\"sub\">&hellip; and " +
             std::to_string(m.issues.size() - shown) +
             " more, all listed in gaps.json.</p>\n";
  std::string label = std::to_string(m.issues.size()) + " issues (" +
                      htmlEscape(issueKindSummary(m)) + ")";
  if (m.issues.size() <= kHtmlFoldRows)
    html += "<p>" + label + "</p>\n";
  return html + htmlFold(table, m.issues.size(), label);
}

} // namespace

std::string renderGapsHtml(const GapReport &report) {
  const ParameterCounts &p = report.parameters;
  std::vector<int64_t> counts = statusCounts(report);
  std::string title = htmlEscape(modelTitle(report));
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
                     "<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
                     "content=\"width=device-width,initial-scale=1\">\n"
                     "<title>adapt gaps: " + title + "</title>\n<style>" +
                     kHtmlStyle + "</style>\n</head>\n<body>\n<main>\n<header>\n";
  html += "<h1>" + title +
          (report.hasGaps()
               ? std::string(" <span class=\"badge verdict gaps\">gaps found</span>")
               : std::string(" <span class=\"badge verdict ok\">no gaps</span>")) +
          "</h1>\n";
  html += "<p class=\"meta\">model_type <b>" + htmlEscape(report.modelType) +
          "</b> &middot; family <b>" + htmlEscape(report.family) +
          "</b> &middot; source <code>" + htmlEscape(report.source) + "</code></p>\n";
  html += "<p class=\"summary\">" + htmlEscape(report.summary) + "</p>\n</header>\n";

  html += "<section class=\"cards\">\n";
  auto card = [&](const std::string &label, const std::string &value,
                  const std::string &sub) {
    html += "<div class=\"card\"><div class=\"label\">" + label +
            "</div><div class=\"value\">" + value + "</div><div class=\"sub\">" +
            sub + "</div></div>\n";
  };
  card("Total parameters", formatParameterCount(p.total), groupThousands(p.total));
  card("Active per token", formatParameterCount(p.active),
       formatParameterCount(p.activeWithMtp) + " with MTP");
  std::string statusLine;
  for (GapStatus status :
       {GapStatus::Missing, GapStatus::Partial, GapStatus::Supported})
    statusLine += std::to_string(counts[static_cast<size_t>(status)]) + " " +
                  htmlBadge(status) + " ";
  card("Components", std::to_string(report.components.size()), statusLine);
  card("Manifest",
       report.manifest.checked ? std::to_string(report.manifest.issues.size()) +
                                     " issues"
                               : std::string("not checked"),
       report.manifest.checked
           ? groupThousands(report.manifest.tensors) + " tensors, " +
                 groupThousands(report.manifest.shards) + " shards"
           : std::string("no weight index"));
  card("Unknown config keys", std::to_string(report.unknownConfigKeys.size()),
       "keys the parser did not interpret");
  html += "</section>\n";

  html += "<h2>Parameters</h2>\n<h3>By component kind</h3>\n";
  std::vector<std::pair<std::string, int64_t>> kinds(p.byComponent.begin(),
                                                     p.byComponent.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto &a, const auto &b) { return a.second > b.second; });
  std::vector<std::tuple<std::string, int64_t, std::string>> parts;
  for (size_t i = 0; i < kinds.size(); ++i)
    parts.emplace_back(kinds[i].first, kinds[i].second,
                       kPalette[i % std::size(kPalette)]);
  html += htmlStackedBar(parts);
  html += "<h3>By support status (component parameters)</h3>\n";
  std::vector<int64_t> byStatus(3, 0);
  for (const ComponentGap &c : report.components)
    byStatus[static_cast<size_t>(c.status)] += c.parameters;
  parts.clear();
  for (GapStatus status :
       {GapStatus::Missing, GapStatus::Partial, GapStatus::Supported})
    parts.emplace_back(gapStatusName(status), byStatus[static_cast<size_t>(status)],
                       std::string("var(--") + gapStatusName(status) + ")");
  html += htmlStackedBar(parts);
  html += "<p class=\"sub\">Decoder " + formatParameterCount(p.decoder) +
          " (embedding " + formatParameterCount(p.embedding) + ", LM head " +
          formatParameterCount(p.lmHead) + ") &middot; MTP " +
          formatParameterCount(p.mtp) + " &middot; encoders " +
          formatParameterCount(p.encoders) + "</p>\n";

  html += "<h2>Decoder layers</h2>\n<p class=\"sub\">One cell per layer, "
          "coloured by the worst status of the components in it; hover a cell "
          "for details.</p>\n" + htmlLayerMap(report);
  html += "<div class=\"legend\"><span><i class=\"missing-bg\"></i>missing</span>"
          "<span><i class=\"partial-bg\"></i>partial</span><span><i "
          "class=\"supported-bg\"></i>supported</span></div>\n";

  html += "<h2>Components</h2>\n" + htmlComponents(report);

  html += "<h2>Unknown config keys</h2>\n";
  if (report.unknownConfigKeys.empty()) {
    html += "<p class=\"sub\">None: every config key was understood.</p>\n";
  } else {
    std::string table = "<table>\n<tr><th>Key</th><th>Value</th></tr>\n";
    for (const auto &[path, value] : report.unknownConfigKeys)
      table += "<tr><td><code>" + htmlEscape(path) +
               "</code></td><td class=\"mono wrap\">" + htmlEscape(value) +
               "</td></tr>\n";
    table += "</table>\n";
    html += htmlFold(table, report.unknownConfigKeys.size(),
                     std::to_string(report.unknownConfigKeys.size()) +
                         " unknown keys");
  }

  html += "<h2>Manifest</h2>\n" + htmlManifest(report.manifest);
  if (!report.notes.empty()) {
    html += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string &note : report.notes)
      html += "<li>" + htmlEscape(note) + "</li>\n";
    html += "</ul>\n";
  }
  html += "<footer>Generated by <code>adapt gaps</code> &middot; "
          "gaps.json schema_version " + htmlEscape(report.schemaVersion) +
          "</footer>\n</main>\n</body>\n</html>\n";
  return html;
}

namespace {

/// Writes all of `data` to `fd`, retrying short writes and EINTR.
bool writeAll(int fd, const std::string &data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

/// Creates `path` with `data`, flushed to disk; on failure sets `error`.
bool writeSynced(const std::string &path, const std::string &data,
                 std::string &error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  bool ok = writeAll(fd, data) && ::fsync(fd) == 0;
  int savedErrno = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    savedErrno = errno;
  }
  if (!ok)
    error = "cannot write " + path + ": " + std::strerror(savedErrno);
  return ok;
}

} // namespace

bool writeGapReport(const GapReport &report, const std::string &dir,
                    std::string &error) {
  std::vector<std::pair<std::string, std::string>> files;
  try {
    files = {{"gaps.json", renderGapsJson(report)},
             {"gaps.md", renderGapsMarkdown(report)},
             {"gaps.html", renderGapsHtml(report)}};
  } catch (const std::exception &e) {
    error = std::string("cannot render the gap report: ") + e.what();
    return false;
  }
  std::error_code ec;
  std::filesystem::path root(dir.empty() ? std::string(".") : dir);
  std::filesystem::create_directories(root, ec);
  if (ec || !std::filesystem::is_directory(root, ec)) {
    error = "cannot create directory " + root.string() + ": " +
            (ec ? ec.message() : std::string("not a directory"));
    return false;
  }
  std::string suffix = ".tmp." + std::to_string(::getpid());
  std::vector<std::string> temps;
  auto cleanup = [&temps] {
    for (const std::string &temp : temps)
      ::unlink(temp.c_str());
  };
  for (const auto &[name, data] : files) {
    std::string temp = (root / ("." + name + suffix)).string();
    temps.push_back(temp);
    if (!writeSynced(temp, data, error)) {
      cleanup();
      return false;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::string target = (root / files[i].first).string();
    if (::rename(temps[i].c_str(), target.c_str()) != 0) {
      error = "cannot rename " + temps[i] + " to " + target + ": " +
              std::strerror(errno);
      cleanup();
      return false;
    }
  }
  int dirFd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  return true;
}

} // namespace adapt
