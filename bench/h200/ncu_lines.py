"""Where a kernel's warps wait, by source line, read from an Nsight Compute report.

Session 57's `--page source --csv --print-source cuda` export carried the
source text alone (columns "Line No", "Source"; no samples), so this reads the
report through Nsight Compute's own Python interface (ncu_report, shipped in
its extras/python folder) instead: every metric that has one value per
instruction address (the warp-state samples smsp__pcsamp_*, the executed
instructions and the shared-memory wavefronts) is summed per CUDA source line
through the report's address -> (file, line) map, and the lines holding the
most stall samples are printed with their text, their reasons and their
instruction counts.

usage: python3 bench/h200/ncu_lines.py REPORT.ncu-rep [TOP]
       (NCU_PYTHON=<ncu>/extras/python; bench/h200_kimi_hotspots.sh sets it)
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.environ.get("NCU_PYTHON", ""))
try:
    import ncu_report
except ImportError as err:
    print(f"ncu_lines: no ncu_report module ({err}); set NCU_PYTHON to <ncu>/extras/python")
    sys.exit(1)


def per_address(action, name):
    """{address: value} for an instanced metric keyed by instruction address."""
    metric = action.metric_by_name(name)
    if metric is None or not metric.has_correlation_ids():
        return {}
    ids = metric.correlation_ids()
    return {ids.as_uint64(i): metric.as_double(i) for i in range(metric.num_instances())}


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
    context = ncu_report.load_report(path)
    for r in range(context.num_ranges()):
        block = context.range_by_idx(r)
        for a in range(block.num_actions()):
            action = block.action_by_idx(a)
            names = [n for n in action.metric_names() if action.metric_by_name(n).has_correlation_ids()]
            stalls = [n for n in names if n.startswith("smsp__pcsamp_warps_issue_stalled_") and not n.endswith("_not_issued")]
            counts = [n for n in names if n in ("inst_executed", "smsp__sass_inst_executed", "sass__inst_executed")]
            shared = [n for n in names if "shared" in n and "wavefront" in n]
            if not stalls:
                print(f"== {action.name()[:100]}: no per-address stall samples; per-address metrics: {names[:40]}")
                continue
            line_of, text = {}, {}
            by_line = defaultdict(lambda: defaultdict(float))
            for name in stalls + counts + shared:
                for address, value in per_address(action, name).items():
                    if address not in line_of:
                        info = action.source_info(address)
                        line_of[address] = (os.path.basename(info.file_name()), info.line()) if info else ("?", 0)
                    by_line[line_of[address]][name] += value
            total = sum(v for line in by_line.values() for n, v in line.items() if n in stalls) or 1.0
            reasons = defaultdict(float)
            for line in by_line.values():
                for n in stalls:
                    reasons[n.replace("smsp__pcsamp_warps_issue_stalled_", "")] += line.get(n, 0.0)
            print(f"== {action.name()[:100]}: {int(total)} stall samples")
            print("   by reason: " + ", ".join(f"{n} {100 * v / total:.0f}%"
                                               for n, v in sorted(reasons.items(), key=lambda x: -x[1])[:7] if v))
            files = {}
            ranked = sorted(by_line.items(), key=lambda kv: -sum(kv[1].get(n, 0.0) for n in stalls))
            for (file, line), values in ranked[:top]:
                if file not in files:
                    found = next((os.path.join(root, file) for root in ("runtime/cuda", ".") if
                                  os.path.exists(os.path.join(root, file))), None)
                    files[file] = open(found).read().split("\n") if found else []
                source = files[file][line - 1].strip() if 0 < line <= len(files[file]) else ""
                share = sum(values.get(n, 0.0) for n in stalls) / total
                lead = sorted(((values.get(n, 0.0), n.replace("smsp__pcsamp_warps_issue_stalled_", ""))
                               for n in stalls), reverse=True)[:2]
                extra = " ".join(f"{n.split('__')[-1][:18]}={values[n]:.0f}" for n in counts + shared if values.get(n))
                print(f"   {100 * share:5.1f}%  {file}:{line:<4} [{', '.join(f'{n} {v:.0f}' for v, n in lead if v)}] "
                      f"{extra}\n          {source[:120]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
