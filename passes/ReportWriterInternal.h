//===- ReportWriterInternal.h - helpers shared by the writers ---*- C++ -*-===//
//
// Text and counting helpers that ReportWriter.cpp (JSON, Markdown, files)
// and ReportWriterHtml.cpp (the HTML page) both use, so the two renderers
// agree on numbers, ordering and sanitising. Not part of the public API:
// include ReportWriter.h instead.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PASSES_REPORTWRITERINTERNAL_H
#define ADAPT_PASSES_REPORTWRITERINTERNAL_H

#include "passes/GapReport.h"

#include <cstdint>
#include <string>
#include <vector>

namespace adapt {
namespace report_detail {

/// Returns `text` as valid UTF-8 without control characters other than tab
/// and newline: bad bytes and controls become U+FFFD, "\r\n" and "\r"
/// become "\n". Markdown and HTML would otherwise pass them through.
std::string sanitizeText(const std::string &text);

/// "1,234,567": the exact count with thousands separators.
std::string groupThousands(int64_t count);

/// Formats `value` with `decimals` digits after the point, C locale style.
std::string formatFixed(double value, int decimals);

/// Components in report order, stably sorted worst status first.
std::vector<const ComponentGap *> worstFirst(const GapReport &report);

/// Number of components with each status, indexed by GapStatus.
std::vector<int64_t> statusCounts(const GapReport &report);

/// What a component's gap blocks, as short words ("forward", "LoRA", "tp").
std::vector<std::string> blockedWords(const BlockedCapabilities &blocks);

/// Decoder layers covered by the report: the highest layer index plus one.
int64_t decoderLayerCount(const GapReport &report);

/// The name shown in titles: architecture, else model type, else source.
std::string modelTitle(const GapReport &report);

/// Manifest issue counts per kind, sorted by kind: "missing 3, shape 1".
std::string issueKindSummary(const ManifestCheck &manifest);

} // namespace report_detail
} // namespace adapt

#endif // ADAPT_PASSES_REPORTWRITERINTERNAL_H
