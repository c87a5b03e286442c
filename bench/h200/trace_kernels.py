#!/usr/bin/env python3
"""The GPU kernels of a `train --profile` Chrome trace, summed per (launching
operator, input shapes, kernel): ms per step, calls per step and mean us, the
largest first. Finds where a step's time goes below the breakdown's kinds.
usage: trace_kernels.py TRACE.json STEPS [TOP]"""
import collections
import json
import sys

trace, steps = sys.argv[1], int(sys.argv[2])
top = int(sys.argv[3]) if len(sys.argv) > 3 else 60
events = json.load(open(trace))["traceEvents"]
ops = {}  # External id -> (operator, input dims)
for e in events:
    if e.get("cat") == "cpu_op":
        ext = e.get("args", {}).get("External id")
        if ext is not None:
            dims = e["args"].get("Input Dims") or []
            ops[ext] = (e["name"], str([d for d in dims if d])[:70])
total = collections.Counter()
calls = collections.Counter()
for e in events:
    if e.get("cat") != "kernel":
        continue
    op, dims = ops.get(e.get("args", {}).get("External id"), ("?", ""))
    key = (op, dims, e["name"][:90])
    total[key] += e.get("dur", 0)
    calls[key] += 1
all_us = sum(total.values())
print(f"kernel time {all_us / steps / 1e3:.2f} ms per step over {steps} steps")
print("| ms/step | calls/step | mean us | operator | input dims | kernel |")
print("|---:|---:|---:|---|---|---|")
for key, us in total.most_common(top):
    op, dims, kernel = key
    print(f"| {us / steps / 1e3:.3f} | {calls[key] / steps:.0f} | {us / calls[key]:.1f} | {op} | {dims} | {kernel} |")
