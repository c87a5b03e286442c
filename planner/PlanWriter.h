//===- PlanWriter.h - plan.json, plan.md and plan.html ----------*- C++ -*-===//
//
// The three files `adapt plan --out DIR` writes (schema: docs/plan.md).
// Rendering is deterministic: the same plan gives the same bytes.
//
//===----------------------------------------------------------------------===//
#ifndef ADAPT_PLANNER_PLANWRITER_H
#define ADAPT_PLANNER_PLANWRITER_H

#include "planner/Planner.h"

#include <string>

namespace adapt::plan {

/// plan.json: request, model figures, hardware constants, the chosen layout
/// and every candidate (best first) with memory and time by category.
std::string renderPlanJson(const Plan &plan);

/// plan.md: the verdict, the chosen layout's memory and time, and the ten
/// best runners-up with why each lost.
std::string renderPlanMarkdown(const Plan &plan);

/// plan.html: one self-contained page (inline CSS and SVG, no script) with
/// memory per rank by category and the step time by part, for the chosen
/// layout and its runners-up.
std::string renderPlanHtml(const Plan &plan);

/// Writes the three files into \p dir atomically; false with \p error on failure.
bool writePlan(const Plan &plan, const std::string &dir, std::string &error);

} // namespace adapt::plan

#endif // ADAPT_PLANNER_PLANWRITER_H
