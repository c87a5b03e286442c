//===- ReportWriterHtml.cpp - the self-contained gaps.html page -*- C++ -*-===//
//
// One HTML file a person can open anywhere: inline CSS only, no script, no
// font or image, no network. It shows the verdict, parameter breakdowns as
// stacked bars, a per-layer strip and layer map (so the pattern of dense and
// MoE layers is visible), the components table, unknown config keys,
// manifest issues and notes. Every report string is HTML-escaped.
//
//===----------------------------------------------------------------------===//

#include "passes/ReportWriter.h"
#include "passes/ReportWriterInternal.h"

#include <algorithm>
#include <iterator>
#include <tuple>

namespace adapt {

using namespace report_detail;

namespace {

/// Most manifest issues listed in gaps.html, to keep the page light.
constexpr size_t kHtmlIssueRows = 1000;
/// Lists longer than this are folded into a closed <details>.
constexpr size_t kHtmlFoldRows = 20;

/// The statuses, worst first, for loops over all of them.
constexpr GapStatus kStatuses[] = {GapStatus::Missing, GapStatus::Partial,
                                   GapStatus::Supported, GapStatus::Excluded};

/// The page's stylesheet: system fonts only, light theme, status colours
/// shared by badges, layer cells and bars.
const char *const kHtmlStyle = R"css(
:root{--missing:#cf222e;--partial:#d4a72c;--supported:#2da44e;--excluded:#8c959f;
--none:#d0d7de;--ink:#1f2328;--muted:#59636e;--line:#d1d9e0;
--panel:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;background:#fff;color:var(--ink);
font:14px/1.5 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,
sans-serif}
main{max-width:1320px;margin:0 auto;padding:28px 32px 48px}
header{border-bottom:1px solid var(--line);padding-bottom:18px;
margin-bottom:22px}
h1{font-size:26px;margin:0 0 6px;display:flex;align-items:center;gap:12px;
flex-wrap:wrap}
h2{font-size:18px;margin:32px 0 12px;padding-bottom:6px;
border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:16px 0 8px;color:var(--muted);font-weight:600}
.meta{color:var(--muted);margin:2px 0}
.meta b{color:var(--ink);font-weight:600}
.summary{font-size:15px;margin:10px 0 0}
code,.mono{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,
monospace}
.badge{display:inline-block;border-radius:999px;padding:1px 10px;
font-size:12px;font-weight:600;color:#fff;white-space:nowrap;
line-height:20px}
.badge.missing{background:var(--missing)}
.badge.partial{background:var(--partial);color:#3b2300}
.badge.supported{background:var(--supported)}
.badge.excluded{background:var(--excluded)}
.badge.small{font-size:11px;padding:0 7px;line-height:18px;
margin:3px 2px 0 0}
.badge.zero{opacity:.35}
.verdict{font-size:13px;padding:3px 12px}
.verdict.ok{background:var(--supported)}
.verdict.gaps{background:var(--missing)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));
gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 14px;
background:var(--panel)}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;
letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600;margin-top:2px}
.bar{display:flex;height:26px;border-radius:6px;overflow:hidden;
border:1px solid var(--line);background:var(--panel)}
.bar span{display:block;height:100%;
border-right:1px solid rgba(255,255,255,.7)}
.bar span:last-child{border-right:0}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:8px 0 4px;
font-size:13px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:3px;
margin-right:6px;vertical-align:-1px}
.legend .num{color:var(--muted)}
.missing-bg{background:var(--missing)}
.partial-bg{background:var(--partial)}
.supported-bg{background:var(--supported)}
.excluded-bg{background:var(--excluded)}
.none-bg{background:#f0f2f4}
.layers{display:grid;gap:2px;align-items:center}
.layers .name{font-size:12px;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis;padding-right:10px}
.layers .cell{height:18px;border-radius:2px}
.layers .cell.none-bg:hover{outline:0}
.layers .cell:hover{outline:2px solid var(--ink);outline-offset:1px}
.layers .tick{font-size:10px;color:var(--muted);overflow:visible;
white-space:nowrap;height:14px}
.layers .overall{height:26px}
.layers .sep{grid-column:1/-1;height:6px}
table{border-collapse:collapse;width:100%;font-size:13px}
th{text-align:left;background:var(--panel);font-weight:600;
color:var(--muted);font-size:12px;text-transform:uppercase;
letter-spacing:.03em}
th,td{border-bottom:1px solid var(--line);padding:7px 10px;
vertical-align:top}
td.num,th.num{text-align:right;white-space:nowrap}
tr.missing td:first-child{box-shadow:inset 3px 0 var(--missing)}
tr.partial td:first-child{box-shadow:inset 3px 0 var(--partial)}
tr.supported td:first-child{box-shadow:inset 3px 0 var(--supported)}
td ul{margin:0;padding-left:18px}
td.why{min-width:240px}
.chip{display:inline-block;background:#eef1f4;border:1px solid var(--line);
border-radius:4px;padding:0 5px;margin:1px 2px 1px 0;font-size:11.5px;
white-space:nowrap}
.chip.block{background:#ffebe9;border-color:#ffcecb;color:#82071e}
.sub{color:var(--muted);font-size:12px}
.wrap{overflow-wrap:anywhere}
.scroll{overflow-x:auto}
details{border:1px solid var(--line);border-radius:8px;padding:8px 12px}
summary{cursor:pointer;font-weight:600}
.notes li{margin:4px 0}
footer{margin-top:36px;color:var(--muted);font-size:12px;
border-top:1px solid var(--line);padding-top:10px}
)css";

/// Colours for component kinds in the parameter bar, in order of size.
const char *const kPalette[] = {"#0969da", "#8250df", "#bf3989", "#1a7f37",
                                "#bc4c00", "#0598bc", "#9a6700", "#57606a",
                                "#6639ba", "#116329", "#a40e26", "#0550ae"};

/// Escaped `text`, or an en dash when it is empty.
std::string htmlOrDash(const std::string &text) {
  return text.empty() ? std::string("&ndash;") : htmlEscape(text);
}

/// A coloured status badge; `extra` adds classes ("small", "zero").
std::string htmlBadge(GapStatus status, const std::string &text,
                      const std::string &extra = "") {
  return "<span class=\"badge " + std::string(gapStatusName(status)) +
         (extra.empty() ? "" : " " + extra) + "\">" + text + "</span>";
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
    std::string name = htmlEscape(label);
    if (share > 0)
      bar += "<span style=\"width:" + formatFixed(100.0 * share, 3) +
             "%;background:" + colour + "\" title=\"" + name + ": " +
             formatParameterCount(value) + " (" + percent + ")\"></span>";
    legend += "<span title=\"" + groupThousands(value) +
              "\"><i style=\"background:" + colour + "\"></i>" + name +
              " <span class=\"num\">" + formatParameterCount(value) +
              " &middot; " + percent + "</span></span>";
  }
  return bar + "</div>\n" + legend + "</div>\n";
}

/// CSS class of a layer cell: the status colour, or none-bg for -1.
std::string cellClass(int rank) {
  if (rank < 0)
    return "none-bg";
  return std::string(gapStatusName(static_cast<GapStatus>(rank))) + "-bg";
}

/// The per-layer strip (worst status per decoder layer) and the layer map
/// (one row per component), so the layer pattern is visible at a glance.
std::string htmlLayerMap(const GapReport &report) {
  int64_t layers = decoderLayerCount(report);
  if (layers <= 0)
    return "<p class=\"sub\">No component names a decoder layer.</p>\n";
  auto count = static_cast<size_t>(layers);
  std::vector<int> worst(count, -1);
  std::vector<std::string> tips(count);
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
  int64_t step = std::max<int64_t>(5, (layers / 12 + 4) / 5 * 5);
  std::string html = "<div class=\"layers\" style=\"grid-template-columns:"
                     "200px repeat(" +
                     std::to_string(layers) +
                     ",minmax(0,1fr))\">\n<div class=\"name\"></div>";
  for (int64_t l = 0; l < layers; ++l)
    html += "<div class=\"tick\">" +
            (l % step == 0 ? std::to_string(l) : std::string()) + "</div>";
  html += "\n<div class=\"name\"><b>All components</b></div>";
  for (size_t l = 0; l < count; ++l) {
    std::string state =
        worst[l] < 0 ? "no component"
                     : gapStatusName(static_cast<GapStatus>(worst[l]));
    html += "<div class=\"cell overall " + cellClass(worst[l]) +
            "\" title=\"Layer " + std::to_string(l) + ": " + state + tips[l] +
            "\"></div>";
  }
  html += "\n<div class=\"sep\"></div>\n";
  for (const ComponentGap &c : report.components) {
    std::vector<bool> used(count, false);
    bool any = false;
    for (int64_t layer : c.layers)
      if (layer >= 0)
        used[static_cast<size_t>(layer)] = any = true;
    if (!any)
      continue;
    std::string id = htmlEscape(c.id);
    std::string on = "<div class=\"cell " +
                     cellClass(static_cast<int>(c.status)) + "\" title=\"";
    html += "<div class=\"name\" title=\"" + id + "\">" + id + "</div>";
    for (size_t l = 0; l < count; ++l)
      html += used[l] ? on + "Layer " + std::to_string(l) + ": " + id + " (" +
                            gapStatusName(c.status) + ")\"></div>"
                      : std::string("<div class=\"cell none-bg\"></div>");
    html += "\n";
  }
  html += "</div>\n<div class=\"legend\">";
  for (GapStatus status : kStatuses)
    html += "<span><i class=\"" + cellClass(static_cast<int>(status)) +
            "\"></i>" + gapStatusName(status) + "</span>";
  return html + "<span><i class=\"none-bg\"></i>not in layer</span></div>\n";
}

/// Wraps `body` in a closed <details> when `rows` is long, else returns it.
std::string htmlFold(const std::string &body, size_t rows,
                     const std::string &label) {
  if (rows <= kHtmlFoldRows)
    return body;
  return "<details><summary>" + label + "</summary>\n" + body +
         "</details>\n";
}

/// One row of the components table.
std::string htmlComponentRow(const ComponentGap &c) {
  std::string status = gapStatusName(c.status);
  std::string html = "<tr class=\"" + status + "\"><td>" +
                     htmlBadge(c.status, status) + "</td><td><code>" +
                     htmlEscape(c.id) + "</code><div class=\"sub\">" +
                     htmlEscape(c.op) + " &middot; ";
  html += c.registryEntry.empty()
              ? std::string("no registry entry")
              : "registry: " + htmlEscape(c.registryEntry);
  html += "</div></td><td>" + htmlEscape(c.variant);
  if (!c.features.empty()) {
    html += "<div>";
    for (const auto &[key, value] : c.features)
      html += "<span class=\"chip\">" + htmlEscape(key) + "=" +
              htmlEscape(value) + "</span>";
    html += "</div>";
  }
  std::string layers;
  for (char ch : formatLayerRanges(c.layers))
    layers += ch == ',' ? std::string(",<wbr>") : std::string(1, ch);
  html += "</td><td class=\"mono\">" + (layers.empty() ? "&ndash;" : layers) +
          "</td><td class=\"num\" title=\"" + groupThousands(c.parameters) +
          "\">" + formatParameterCount(c.parameters);
  if (c.activeParameters != c.parameters)
    html += "<div class=\"sub\">" + formatParameterCount(c.activeParameters) +
            " active</div>";
  html += "</td><td>";
  std::vector<std::string> words = blockedWords(c.blocks);
  for (const std::string &word : words)
    html += "<span class=\"chip block\">" + htmlEscape(word) + "</span>";
  if (words.empty())
    html += "<span class=\"sub\">nothing</span>";
  html += "</td><td class=\"why\">";
  if (c.reasons.empty())
    return html + "<span class=\"sub\">&ndash;</span></td></tr>\n";
  html += "<ul>";
  for (const std::string &reason : c.reasons)
    html += "<li>" + htmlEscape(reason) + "</li>";
  return html + "</ul></td></tr>\n";
}

/// The components table, worst status first.
std::string htmlComponents(const GapReport &report) {
  if (report.components.empty())
    return "<p class=\"sub\">No components.</p>\n";
  std::string html = "<div class=\"scroll\"><table>\n<tr><th>Status</th>"
                     "<th>Component</th><th>Variant</th><th>Layers</th>"
                     "<th class=\"num\">Parameters</th><th title=\"What the gap stops: forward, "
                     "backward, LoRA, and parallel layouts the runtime does not run this component "
                     "under yet (pipeline and context parallelism for every component until they "
                     "exist)\">Blocks</th>"
                     "<th>Why</th></tr>\n";
  for (const ComponentGap *c : worstFirst(report))
    html += htmlComponentRow(*c);
  return html + "</table></div>\n";
}

/// The unknown config keys table, folded when long.
std::string htmlUnknownKeys(const GapReport &report) {
  const auto &keys = report.unknownConfigKeys;
  if (keys.empty())
    return "<p class=\"sub\">None: every config key was understood.</p>\n";
  std::string table = "<div class=\"scroll\"><table>\n<tr><th>Key</th>"
                      "<th>Value</th><th>Possibly significant</th></tr>\n";
  for (const auto &[path, value] : keys) {
    const std::string hint = structuralHint(path);
    table += "<tr><td><code>" + htmlEscape(path) +
             "</code></td><td class=\"mono wrap\">" + htmlEscape(value) + "</td><td>" +
             (hint.empty() ? std::string("-") : "<b>yes</b>: " + htmlEscape(hint)) + "</td></tr>\n";
  }
  table += "</table></div>\n";
  return htmlFold(table, keys.size(),
                  std::to_string(keys.size()) + " unknown keys");
}

/// The manifest section: what was compared, then the disagreements.
std::string htmlManifest(const ManifestCheck &m) {
  if (!m.checked)
    return "<p class=\"sub\">Not checked: no weight index was found.</p>\n";
  std::string html = "<p class=\"meta\"><b>" + htmlOrDash(m.file) +
                     "</b> &middot; " + groupThousands(m.tensors) +
                     " tensors in manifest, " +
                     groupThousands(m.expectedTensors) +
                     " implied by the config &middot; " +
                     groupThousands(m.shards) + " shards, " +
                     groupThousands(m.headersRead) + " headers read</p>\n";
  if (m.issues.empty())
    return html + "<p>No disagreements between config and manifest.</p>\n";
  std::string table = "<div class=\"scroll\"><table>\n<tr><th>Kind</th>"
                      "<th>Tensor</th><th>Expected</th><th>Found</th></tr>\n";
  size_t shown = std::min(m.issues.size(), kHtmlIssueRows);
  for (size_t i = 0; i < shown; ++i) {
    const ManifestIssue &issue = m.issues[i];
    table += "<tr><td><span class=\"chip block\">" + htmlEscape(issue.kind) +
             "</span></td><td><code class=\"wrap\">" +
             htmlEscape(issue.tensor) + "</code></td><td class=\"mono\">" +
             htmlOrDash(issue.expected) + "</td><td class=\"mono\">" +
             htmlOrDash(issue.found) + "</td></tr>\n";
  }
  table += "</table></div>\n";
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

/// The header: title, verdict badge, model identity and the summary line.
std::string htmlHeader(const GapReport &report) {
  std::string verdict =
      report.hasGaps()
          ? "<span class=\"badge verdict gaps\">gaps found</span>"
          : "<span class=\"badge verdict ok\">no gaps</span>";
  return "<header>\n<h1>" + htmlEscape(modelTitle(report)) + " " + verdict +
         "</h1>\n<p class=\"meta\">model_type <b>" +
         htmlOrDash(report.modelType) + "</b> &middot; family <b>" +
         htmlOrDash(report.family) + "</b> &middot; source <code>" +
         htmlOrDash(report.source) + "</code></p>\n<p class=\"summary\">" +
         htmlEscape(report.summary) + "</p>\n</header>\n";
}

/// The row of headline cards: parameters, components, manifest, keys.
std::string htmlCards(const GapReport &report) {
  const ParameterCounts &p = report.parameters;
  const ManifestCheck &m = report.manifest;
  std::string html = "<section class=\"cards\">\n";
  auto card = [&html](const std::string &label, const std::string &value,
                      const std::string &sub) {
    html += "<div class=\"card\"><div class=\"label\">" + label +
            "</div><div class=\"value\">" + value +
            "</div><div class=\"sub\">" + sub + "</div></div>\n";
  };
  card("Total parameters", formatParameterCount(p.total),
       groupThousands(p.total));
  card("Active per token", formatParameterCount(p.active),
       formatParameterCount(p.activeWithMtp) + " with MTP");
  std::vector<int64_t> counts = statusCounts(report);
  std::string badges;
  for (GapStatus status : kStatuses) {
    int64_t n = counts[static_cast<size_t>(status)];
    badges += htmlBadge(status,
                        std::to_string(n) + " " + gapStatusName(status),
                        n == 0 ? "small zero" : "small") +
              " ";
  }
  card("Components", std::to_string(report.components.size()), badges);
  if (m.checked)
    card("Manifest", std::to_string(m.issues.size()) + " issues",
         groupThousands(m.tensors) + " tensors, " + groupThousands(m.shards) +
             " shards");
  else
    card("Manifest", "not checked", "no weight index");
  card("Unknown config keys", std::to_string(report.unknownConfigKeys.size()),
       "keys the parser did not interpret");
  return html + "</section>\n";
}

/// The parameter section: by component kind, by status, then the split.
std::string htmlParameters(const GapReport &report) {
  const ParameterCounts &p = report.parameters;
  std::vector<std::pair<std::string, int64_t>> kinds(p.byComponent.begin(),
                                                     p.byComponent.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto &a, const auto &b) {
                     return a.second > b.second;
                   });
  std::vector<std::tuple<std::string, int64_t, std::string>> parts;
  for (size_t i = 0; i < kinds.size(); ++i)
    parts.emplace_back(kinds[i].first, kinds[i].second,
                       kPalette[i % std::size(kPalette)]);
  std::string html = "<h2>Parameters</h2>\n<h3>By component kind</h3>\n" +
                     htmlStackedBar(parts);
  std::vector<int64_t> byStatus(std::size(kStatuses), 0);
  for (const ComponentGap &c : report.components)
    byStatus[static_cast<size_t>(c.status)] += c.parameters;
  parts.clear();
  for (GapStatus status : kStatuses)
    parts.emplace_back(gapStatusName(status),
                       byStatus[static_cast<size_t>(status)],
                       std::string("var(--") + gapStatusName(status) + ")");
  html += "<h3>By support status (component parameters)</h3>\n" +
          htmlStackedBar(parts);
  html += "<p class=\"sub\">Decoder " + formatParameterCount(p.decoder) +
          " (embedding " + formatParameterCount(p.embedding) + ", LM head " +
          formatParameterCount(p.lmHead) + ", non-embedding " +
          formatParameterCount(p.decoderNonEmbedding) + ") &middot; MTP " +
          formatParameterCount(p.mtp) + " &middot; encoders " +
          formatParameterCount(p.encoders) + "<br>Active " +
          formatParameterCount(p.active) + " (without embedding " +
          formatParameterCount(p.activeWithoutEmbedding) +
          ", non-embedding " + formatParameterCount(p.activeNonEmbedding) +
          ", with MTP " + formatParameterCount(p.activeWithMtp) + ")</p>\n";
  return html;
}

} // namespace

std::string renderGapsHtml(const GapReport &report) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
                     "<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
                     "content=\"width=device-width,initial-scale=1\">\n"
                     "<title>adapt gaps: " +
                     htmlEscape(modelTitle(report)) + "</title>\n<style>" +
                     kHtmlStyle + "</style>\n</head>\n<body>\n<main>\n";
  html += htmlHeader(report) + htmlCards(report) + htmlParameters(report);
  html += "<h2>Decoder layers</h2>\n<p class=\"sub\">One cell per layer, "
          "coloured by the worst status of the components in it; hover a "
          "cell for details.</p>\n" +
          htmlLayerMap(report);
  html += "<h2>Components</h2>\n" + htmlComponents(report);
  html += "<h2>Unknown config keys</h2>\n" + htmlUnknownKeys(report);
  html += "<h2>Manifest</h2>\n" + htmlManifest(report.manifest);
  if (!report.assumptions.empty()) {
    html += "<h2>Assumptions</h2>\n<p class=\"sub\">Features taken from the recognised family, not read "
            "from config.json.</p>\n<div class=\"scroll\"><table>\n<tr><th>Feature</th><th>Status</th>"
            "<th>Would be confirmed by</th><th>Why assumed</th></tr>\n";
    for (const ReportedAssumption &a : report.assumptions)
      html += "<tr><td>" + htmlEscape(a.feature) + "</td><td>" + htmlEscape(a.status) + "</td><td><code>" +
              htmlEscape(a.confirmBy) + "</code></td><td>" + htmlEscape(a.basis) + "</td></tr>\n";
    html += "</table></div>\n";
  }
  if (!report.notes.empty()) {
    html += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string &note : report.notes)
      html += "<li>" + htmlEscape(note) + "</li>\n";
    html += "</ul>\n";
  }
  return html + "<footer>Generated by <code>adapt gaps</code> &middot; "
                "gaps.json schema_version " +
         htmlEscape(report.schemaVersion) +
         "</footer>\n</main>\n</body>\n</html>\n";
}

std::string htmlEscape(const std::string &text) {
  std::string out;
  for (char c : sanitizeText(text)) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&#39;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

} // namespace adapt
