"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass`
(a report taken with `--set full`) and prints, for each kernel in it, the
share of stall samples by reason and the instructions that hold the most,
each with its text. Session 57 wrote it for the `--print-source cuda` page,
whose export (Nsight Compute 2025 on the H100s) turned out to carry the
source text alone; the SASS page carries the samples, and
bench/h200/ncu_lines.py gives the per-line view through the report's own
Python interface. The columns are found by name (Nsight Compute's wording
varies by version): the samples column is the first whose name has "Warp
Stall Sampling (All" or "# Samples", the reasons are the columns named
"stall_*" (or "... Stall Reason ...") when present. When neither is found it
prints the header it saw, so that the next reader can adapt the names.

usage: python3 bench/h200/ncu_hotspots.py SOURCE.csv [TOP]
"""
import csv
import sys
from collections import defaultdict


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
    rows = list(csv.reader(open(path, newline="", errors="replace")))
    header_at = next((i for i, r in enumerate(rows) if any("Source" == c or c.startswith("Source") for c in r)), None)
    if header_at is None:
        print(f"ncu_hotspots: no header row with a Source column in {path}; first rows: {rows[:3]}")
        return 1
    header = rows[header_at]
    samples = next((i for i, n in enumerate(header) if "Warp Stall Sampling (All" in n or n == "# Samples"), None)
    if samples is None:
        print(f"ncu_hotspots: no samples column; header: {header}")
        return 1
    source = next(i for i, n in enumerate(header) if n == "Source" or n.startswith("Source"))
    line_col = next((i for i, n in enumerate(header) if n in ("#", "Line", "# Line")), None)
    kernel_col = next((i for i, n in enumerate(header) if n in ("Kernel Name", "Function Name", "Function")), None)
    reasons = [i for i, n in enumerate(header) if n.startswith("stall_") or "Stall Reason" in n]
    per_kernel = defaultdict(list)
    named = [r[0].strip() for r in rows[:header_at] if len(r) == 1 and r[0].strip()]
    kernel = named[-1] if named else "(one kernel)"
    for r in rows[header_at + 1:]:
        if len(r) != len(header):
            # Reports with several kernels put each kernel's name on a line of its own.
            if len(r) == 1 and r[0].strip():
                kernel = r[0].strip()
            continue
        name = r[kernel_col] if kernel_col is not None and r[kernel_col] else kernel
        per_kernel[name].append(r)
    for name, lines in per_kernel.items():
        total = sum(number(r[samples]) for r in lines) or 1.0
        print(f"== {name[:110]}: {int(total)} stall samples")
        if reasons:
            shares = sorted(((sum(number(r[i]) for r in lines), header[i]) for i in reasons), reverse=True)
            print("   by reason: " + ", ".join(f"{n} {100 * v / total:.0f}%" for v, n in shares[:6] if v > 0))
        for r in sorted(lines, key=lambda r: -number(r[samples]))[:top]:
            where = r[line_col] if line_col is not None else "?"
            print(f"   {100 * number(r[samples]) / total:5.1f}%  line {where:>5}  {r[source].strip()[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
