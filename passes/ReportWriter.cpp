//===- ReportWriter.cpp - gaps.json, gaps.md and file writing --*- C++ -*-===//
//
// The JSON and Markdown renderers, the shared text helpers and the atomic
// writer (the HTML page lives in ReportWriterHtml.cpp). All report strings
// come from user files (config keys, tensor names), so each format escapes
// them fully: JSON through nlohmann with invalid UTF-8 replaced, Markdown
// with backslash escapes or code spans and no raw newline in a table cell.
// Nothing here reads the clock or the environment, so output depends on
// the report alone.
//
//===----------------------------------------------------------------------===//

#include "passes/ReportWriter.h"
#include "parser/AtomicFile.h"
#include "passes/ReportWriterInternal.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <map>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace adapt {
namespace report_detail {

/// Appends code point `cp` to `out` as UTF-8: a lead byte holding the high
/// bits, then one continuation byte per further 6 bits.
static void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
    return;
  }
  int continuations = cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
  static const uint32_t leadMarks[] = {0, 0xC0, 0xE0, 0xF0};
  out += static_cast<char>(leadMarks[continuations] | (cp >> (6 * continuations)));
  for (int shift = 6 * (continuations - 1); shift >= 0; shift -= 6)
    out += static_cast<char>(0x80 | ((cp >> shift) & 0x3F));
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
    uint32_t cp = length == 4   ? lead & 0x07
                  : length == 3 ? lead & 0x0F
                                : lead & 0x1F;
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
  std::vector<int64_t> counts(4, 0);
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

} // namespace report_detail

using namespace report_detail;

namespace {

using Json = nlohmann::ordered_json;

/// Most manifest issues listed in gaps.md; gaps.json keeps all of them.
constexpr size_t kMarkdownIssueRows = 50;

/// Appends `value` as JSON indented by `depth` levels of two spaces, like
/// nlohmann's dump(2) except that an array holding only numbers or booleans
/// (layer lists) stays on one line. Scalars go through nlohmann, which
/// escapes strings and replaces invalid UTF-8 with U+FFFD.
void appendJson(const Json &value, size_t depth, std::string &out) {
  if (!value.is_structured() || value.empty()) {
    out += value.dump(-1, ' ', false, Json::error_handler_t::replace);
    return;
  }
  bool flat = value.is_array() &&
              std::all_of(value.begin(), value.end(), [](const Json &item) {
                return item.is_number() || item.is_boolean();
              });
  if (flat) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i)
      out += (i ? ", " : "") + value[i].dump();
    out += ']';
    return;
  }
  std::string inner(2 * (depth + 1), ' ');
  out += value.is_array() ? "[\n" : "{\n";
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    out += (first ? "" : ",\n") + inner;
    first = false;
    if (value.is_object())
      out += Json(it.key()).dump(-1, ' ', false,
                                 Json::error_handler_t::replace) +
             ": ";
    appendJson(*it, depth + 1, out);
  }
  out += "\n" + std::string(2 * depth, ' ') + (value.is_array() ? "]" : "}");
}

/// Escapes `text` for one line of Markdown (a table cell or a list item):
/// inline-markup characters get a backslash, newlines become <br> so a cell
/// never spans lines, and a leading character that would start a block
/// (heading, list, quote) is escaped. An underscore between two ASCII
/// letters or digits stays bare: CommonMark never reads it as emphasis.
std::string markdownEscape(const std::string &text) {
  std::string clean = sanitizeText(text);
  std::string out;
  for (size_t i = 0; i < clean.size(); ++i) {
    char c = clean[i];
    if (c == '\n') {
      out += "<br>";
      continue;
    }
    auto isWord = [&](size_t at) {
      return at < clean.size() &&
             std::isalnum(static_cast<unsigned char>(clean[at]));
    };
    bool intraword = c == '_' && i > 0 && isWord(i - 1) && isWord(i + 1);
    if ((std::strchr("\\`*_[]<>|&~#!", c) && !intraword) ||
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

/// Renders `text` as a Markdown code span, for identifiers (ids, ops, tensor
/// names, keys, shapes) that read badly with backslashes. Inside a span
/// nothing is markup, so only a table pipe needs a backslash (GFM strips it
/// before reading the span); `inTable` false leaves pipes alone. Text with
/// angle brackets, backticks or line breaks is escaped as prose instead, so
/// no raw tag ever reaches the file.
std::string markdownCode(const std::string &text, bool inTable = true) {
  std::string clean = sanitizeText(text);
  if (clean.find_first_of("<>`\n\t") != std::string::npos)
    return markdownEscape(text);
  if (clean.empty())
    return " ";
  std::string body;
  for (char c : clean)
    body += (c == '|' && inTable) ? std::string("\\|") : std::string(1, c);
  bool pad = body.front() == ' ' || body.back() == ' ';
  return pad ? "` " + body + " `" : "`" + body + "`";
}

/// One Markdown table row of \p cells, each already escaped: "| a | b |\n".
std::string markdownRow(std::initializer_list<std::string> cells) {
  std::string row = "|";
  for (const std::string &cell : cells)
    row += " " + cell + " |";
  return row + "\n";
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
  // The objects list their keys in the schema's order (docs/gaps-schema.md).
  std::vector<int64_t> counts = statusCounts(report);
  Json statusJson = Json::object();
  for (GapStatus status :
       {GapStatus::Missing, GapStatus::Partial, GapStatus::Supported, GapStatus::Excluded})
    statusJson[gapStatusName(status)] = counts[static_cast<size_t>(status)];

  const ParameterCounts &p = report.parameters;
  Json byComponent = Json::object();
  for (const auto &[kind, count] : p.byComponent)
    byComponent[kind] = count;
  Json params = {{"total", p.total}, {"active", p.active}, {"decoder", p.decoder},
                 {"embedding", p.embedding}, {"lm_head", p.lmHead}, {"mtp", p.mtp},
                 {"encoders", p.encoders}, {"active_with_mtp", p.activeWithMtp},
                 {"active_without_embedding", p.activeWithoutEmbedding},
                 {"active_non_embedding", p.activeNonEmbedding},
                 {"decoder_non_embedding", p.decoderNonEmbedding}, {"by_component", byComponent}};

  Json components = Json::array();
  for (const ComponentGap &c : report.components) {
    Json features = Json::object();
    for (const auto &[key, value] : c.features)
      features[key] = value;
    const BlockedCapabilities &blocked = c.blocks;
    Json blocks = {{"forward", blocked.forward}, {"backward", blocked.backward},
                   {"lora", blocked.lora}, {"parallel_layouts", blocked.parallelLayouts}};
    components.push_back(Json{{"id", c.id}, {"op", c.op}, {"variant", c.variant},
                              {"features", features}, {"status", gapStatusName(c.status)},
                              {"reasons", c.reasons}, {"layers", c.layers},
                              {"parameters", c.parameters},
                              {"active_parameters", c.activeParameters}, {"blocks", blocks},
                              {"registry_entry", c.registryEntry}, {"next_step", c.nextStep}});
  }

  Json unknown = Json::array();
  for (const auto &[path, value] : report.unknownConfigKeys) {
    const std::string hint = structuralHint(path);
    unknown.push_back(Json{{"path", path}, {"value", value},
                           {"possibly_significant", !hint.empty()}, {"why", hint}});
  }

  const ManifestCheck &m = report.manifest;
  Json issues = Json::array();
  for (const ManifestIssue &issue : m.issues)
    issues.push_back(Json{{"kind", issue.kind}, {"tensor", issue.tensor},
                          {"expected", issue.expected}, {"found", issue.found}});
  Json manifest = {{"checked", m.checked}, {"file", m.file}, {"tensors", m.tensors},
                   {"expected_tensors", m.expectedTensors}, {"shards", m.shards},
                   {"headers_read", m.headersRead}, {"issues", issues}};

  Json assumptions = Json::array();
  for (const ReportedAssumption &a : report.assumptions)
    assumptions.push_back(Json{{"feature", a.feature}, {"basis", a.basis},
                               {"confirm_by", a.confirmBy}, {"status", a.status}});

  Json root = {{"schema_version", report.schemaVersion},
               {"source", report.source},
               {"model", {{"model_type", report.modelType},
                          {"architecture", report.architecture},
                          {"family", report.family}}},
               {"summary", report.summary},
               {"has_gaps", report.hasGaps()},
               {"status_counts", statusJson},
               {"parameters", params},
               {"components", components},
               {"unknown_config_keys", unknown},
               {"manifest", manifest},
               {"notes", report.notes},
               {"assumptions", assumptions}};
  std::string out;
  appendJson(root, 0, out);
  return out + "\n";
}

std::string renderGapsMarkdown(const GapReport &report) {
  std::string md;
  const ParameterCounts &p = report.parameters;
  md += "# adapt gaps: " + markdownEscape(modelTitle(report)) + "\n\n";
  md += report.hasGaps() ? "**Gaps found.** " : "**No gaps.** ";
  md += markdownEscape(report.summary.empty() ? std::string("(no summary)")
                                               : report.summary) + "\n\n";
  md += "- Source: " + markdownCode(report.source, false) + "\n";
  md += "- Model type: " + markdownCode(report.modelType, false) +
        "; architecture: " + markdownCode(report.architecture, false) +
        "; family: " + markdownCode(report.family, false) + "\n";
  md += "- Schema version: " + markdownEscape(report.schemaVersion) + "\n\n";

  md += "## Parameters\n\n| Part | Parameters | Exact |\n|---|---:|---:|\n";
  const std::pair<const char *, int64_t> rows[] = {
      {"Total", p.total},
      {"Active per token", p.active},
      {"Active with MTP", p.activeWithMtp},
      {"Active without embedding", p.activeWithoutEmbedding},
      {"Active non-embedding", p.activeNonEmbedding},
      {"Decoder", p.decoder},
      {"Decoder non-embedding", p.decoderNonEmbedding},
      {"Embedding", p.embedding},
      {"LM head", p.lmHead},
      {"MTP", p.mtp},
      {"Encoders", p.encoders}};
  for (const auto &[name, count] : rows)
    md += markdownRow({name, formatParameterCount(count), groupThousands(count)});
  if (!p.byComponent.empty()) {
    md += "\n| Component kind | Parameters | Exact |\n|---|---:|---:|\n";
    for (const auto &[kind, count] : p.byComponent)
      md += markdownRow({markdownCode(kind), formatParameterCount(count), groupThousands(count)});
  }

  md += "\n## Components\n\n";
  if (report.components.empty()) {
    md += "No components.\n";
  } else {
    md += "*Blocks* says what the gap stops: `forward` (the model cannot run), `backward` (no "
          "training through it), `LoRA` (no adapters on it), and the parallel layouts the runtime "
          "does not run the component under yet (docs/parallel.md; a missing component blocks every "
          "layout it would take part in: `data_parallel`, `tensor_parallel`, `pipeline_parallel`, "
          "`expert_parallel` for MoE, `context_parallel` for token mixers).\n\n";
    md += "| Status | Component | Op | Variant | Layers | Parameters | "
          "Blocks | Why |\n|---|---|---|---|---|---:|---|---|\n";
    for (const ComponentGap *c : worstFirst(report)) {
      std::string status = gapStatusName(c->status);
      if (c->status == GapStatus::Missing || c->status == GapStatus::Partial)
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
      md += markdownRow({status, markdownCode(c->id), markdownCode(c->op),
                         markdownEscape(c->variant), layers.empty() ? "-" : layers, params,
                         blocked.empty() ? "-" : blocked, why.empty() ? "-" : why});
    }
  }

  md += "\n## Unknown config keys\n\n";
  if (report.unknownConfigKeys.empty()) {
    md += "None.\n";
  } else {
    md += "Nothing in adapt reads these keys. A key whose name reads like a size, count, layer "
          "list, kind or sharing switch is marked *possibly significant*: check it against the "
          "model's reference code before trusting the parameter count or training it.\n\n";
    md += "| Key | Value | Possibly significant |\n|---|---|---|\n";
    for (const auto &[path, value] : report.unknownConfigKeys) {
      const std::string hint = structuralHint(path);
      md += markdownRow({markdownCode(path), markdownCode(value),
                         hint.empty() ? std::string("-") : "**yes**: " + markdownEscape(hint)});
    }
  }

  const ManifestCheck &m = report.manifest;
  md += "\n## Manifest\n\n";
  if (!m.checked) {
    md += "Not checked (no weight index found).\n";
  } else {
    md += "- File: " + markdownCode(m.file, false) + "\n";
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
        md += markdownRow({markdownEscape(issue.kind), markdownCode(issue.tensor),
                           markdownCode(issue.expected), markdownCode(issue.found)});
      }
      if (m.issues.size() > shown)
        md += "\n... and " + std::to_string(m.issues.size() - shown) +
              " more (all listed in gaps.json).\n";
    }
  }

  bool anyNext = false;
  for (const ComponentGap &c : report.components)
    if (!c.nextStep.empty()) {
      if (!anyNext)
        md += "\n## What to do next\n\n";
      anyNext = true;
      md += "- " + markdownCode(c.id) + ": " + markdownEscape(c.nextStep) + "\n";
    }

  if (!report.assumptions.empty()) {
    md += "\n## Assumptions\n\nFeatures taken from the recognised family, not read from config.json; "
          "*confirmed* means the manifest lists the tensor that shows it.\n\n"
          "| Feature | Status | Would be confirmed by | Why assumed |\n|---|---|---|---|\n";
    for (const ReportedAssumption &a : report.assumptions)
      md += markdownRow({markdownEscape(a.feature), markdownEscape(a.status),
                         markdownCode(a.confirmBy), markdownEscape(a.basis)});
  }

  if (!report.notes.empty()) {
    md += "\n## Notes\n\n";
    for (const std::string &note : report.notes)
      md += "- " + markdownEscape(note) + "\n";
  }
  return md;
}

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
  return writeFilesAtomically(dir, files, error);
}

} // namespace adapt
