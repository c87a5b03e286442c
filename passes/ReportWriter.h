//===- ReportWriter.h - gaps.json, gaps.md and gaps.html writer -*- C++ -*-===//
//
// Turns a GapReport into the three files `adapt gaps --out DIR` leaves:
// gaps.json (stable schema, docs/gaps-schema.md, read by tools and agents),
// gaps.md (for a pull request or a terminal) and gaps.html (one
// self-contained page for a person). Rendering is pure and deterministic:
// the same report always gives byte-identical files, so reports can be
// diffed and cached. Writing is atomic per file.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PASSES_REPORTWRITER_H
#define ADAPT_PASSES_REPORTWRITER_H

#include "passes/GapReport.h"

#include <cstdint>
#include <string>
#include <vector>

namespace adapt {

/// Compresses layer indices into "3-60", "0,4,8" or "0-2,5,7-9" so that
/// tables stay short. Sorts and deduplicates first; negative entries (the
/// "no layer" marker -1) are skipped; runs of three or more consecutive
/// layers become "a-b", shorter runs are listed. Returns "" when no layer
/// index remains.
std::string formatLayerRanges(const std::vector<int64_t> &layers);

/// Formats a parameter count for people: "671.03B", "37.5M", "1.2T" at and
/// above a million (two decimals, one trailing zero dropped, so "671.0B"),
/// "1,234" below it. Negative counts keep their sign.
std::string formatParameterCount(int64_t count);

/// Renders the report as gaps.json: 2-space indented, keys in the fixed
/// order of docs/gaps-schema.md, arrays of numbers (layer lists) on one
/// line, invalid UTF-8 replaced by U+FFFD, ending in a newline. Same report,
/// same bytes.
std::string renderGapsJson(const GapReport &report);

/// Renders the report as gaps.md: summary, parameter table, components
/// sorted worst status first, unknown config keys, manifest issues (at most
/// 50 rows; gaps.json keeps all) and notes. Every report string is escaped
/// so it can neither break a table nor inject markup.
std::string renderGapsMarkdown(const GapReport &report);

/// Renders the report as one self-contained gaps.html (inline CSS, no
/// script, font or network access): header and verdict, parameter bars,
/// per-layer strip and map, components table, unknown keys, manifest issues
/// and notes. Every report string is HTML-escaped.
std::string renderGapsHtml(const GapReport &report);

/// Escapes \p text for HTML text and quoted attribute values (& < > " '),
/// after replacing invalid UTF-8 with U+FFFD: the one escaper of the
/// compiler's HTML pages (gap reports, plans).
std::string htmlEscape(const std::string &text);

/// Renders all three files and writes DIR/gaps.json, DIR/gaps.md and
/// DIR/gaps.html, creating DIR (and its parents) if needed. Each file is
/// written to a temporary name in DIR, fsynced and renamed over the target,
/// so an interrupted run leaves either the old or the new file, never half
/// of one. Returns false with a one-line `error` (and no temporary files
/// left) when anything fails; never throws.
bool writeGapReport(const GapReport &report, const std::string &dir,
                    std::string &error);

} // namespace adapt

#endif // ADAPT_PASSES_REPORTWRITER_H
