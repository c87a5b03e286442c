"""flash-linear-attention 0.6's chunk_gated_delta_rule (Triton), forward and
forward+backward, on the shapes the C++ bench times for our chunked op.

Prints one JSON line per shape, with the same fields as
`long_context --delta-rule B H T DK DV`. Inputs as there: bf16, q and k
L2-normalised outside the op, a scalar log-decay per head and token (fp32),
beta in (0, 1), chunk 64, the default 1/sqrt(dk) scale.

FLA 0.6 refuses its gated backward on Hopper with Triton >= 3.4 and < 3.7.1
(its issue #640: that Triton miscompiles one kernel into wrong gradients);
the H200 image has Triton 3.6, and the fixes (Triton 3.7.1, or tilelang with
its dependencies) are larger than what can travel to it. With
--bypass-triton-guard the guard is switched off so the backward's *time* can
be measured (its gradients are not used or trusted); rows say so.

--per-channel times fla's chunk_kda (Kimi delta attention: a log decay per key
channel, [B, T, H, DK]) instead, as `long_context --delta-rule ... --per-channel`.

--lightning times fla's chunk_simple_gla with a fixed log decay per head
(g_gamma; what fla's own chunk_lightning_attn calls) on the inputs of
`long_context --lightning B H T D BLOCK`: MiniMax-M1's slopes for layer 1 of
80 (runtime/Lightning.cpp's lightningSlopes), no score scale, q and k
randn x 0.1, v randn, bf16. No delta rule and no beta: DK must equal DV.

usage: python3 bench/h200/fla_delta_rule.py [--bypass-triton-guard] [--per-channel | --lightning] B H T DK DV [...]
"""
import json
import sys

import torch
import torch.nn.functional as F
from fla.ops.gated_delta_rule import chunk_gated_delta_rule


def timed(fn, iters=3):
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], torch.cuda.max_memory_allocated() / 2**30


def lightning_slopes(heads, layer=1, layers=80):
    """MiniMax-M1's decay rates, as runtime/Lightning.cpp's lightningSlopes."""
    base = 1.0 / 2.0 ** (8.0 / heads)
    factor = 1.0 - layer / (layers - 1.0 + 1e-5) + 1e-5
    rates = torch.tensor([base ** (h + 1) for h in range(heads)], dtype=torch.float32)
    return (rates.double() * factor).float()


def lightning_rows(argv):
    """One JSON line per B H T D D: fla's simple GLA with MiniMax's decays."""
    from fla.ops.simple_gla import chunk_simple_gla
    for i in range(0, len(argv), 5):
        B, H, T, DK, DV = map(int, argv[i:i + 5])
        if DK != DV:
            sys.exit(f"--lightning: expected DK == DV, found {DK} and {DV}")
        dev = dict(device="cuda", dtype=torch.bfloat16)
        q = (torch.randn(B, T, H, DK, **dev) * 0.1).requires_grad_()
        k = (torch.randn(B, T, H, DK, **dev) * 0.1).requires_grad_()
        v = torch.randn(B, T, H, DV, **dev).requires_grad_()
        g_gamma = -lightning_slopes(H).cuda()
        do = torch.randn(B, T, H, DV, **dev)

        def forward():
            with torch.no_grad():
                chunk_simple_gla(q, k, v, g_gamma=g_gamma, scale=1.0)

        def forward_backward():
            out, _ = chunk_simple_gla(q, k, v, g_gamma=g_gamma, scale=1.0)
            out.backward(do)

        fwd, _ = timed(forward)
        both, peak = timed(forward_backward)
        print(json.dumps({"op": "fla.chunk_simple_gla(lightning)", "B": B, "H": H, "T": T, "d": DK,
                          "forward_ms": round(fwd, 3), "forward_backward_ms": round(both, 3),
                          "ns_per_token": round(both * 1e6 / (B * T), 1), "peak_gib": round(peak, 3)}), flush=True)


def main(argv):
    bypass = "--bypass-triton-guard" in argv
    per_channel = "--per-channel" in argv
    lightning = "--lightning" in argv
    argv = [a for a in argv if a not in ("--bypass-triton-guard", "--per-channel", "--lightning")]
    if len(argv) == 0 or len(argv) % 5 or (per_channel and lightning):
        sys.exit(__doc__)
    if lightning:
        return lightning_rows(argv)
    op = chunk_gated_delta_rule
    if per_channel:
        from fla.ops.kda import chunk_kda as op
    if bypass:
        import fla.ops.common.chunk_o as chunk_o
        chunk_o.TRITON_ABOVE_3_7_1 = True
    torch.manual_seed(0)
    for i in range(0, len(argv), 5):
        B, H, T, DK, DV = map(int, argv[i:i + 5])
        dev = dict(device="cuda", dtype=torch.bfloat16)
        q = F.normalize(torch.randn(B, T, H, DK, **dev), dim=-1).requires_grad_()
        k = F.normalize(torch.randn(B, T, H, DK, **dev), dim=-1).requires_grad_()
        v = torch.randn(B, T, H, DV, **dev).requires_grad_()
        g = F.logsigmoid(torch.randn(B, T, H, *([DK] if per_channel else []), device="cuda")).requires_grad_()
        beta = torch.rand(B, T, H, **dev).sigmoid().requires_grad_()
        do = torch.randn(B, T, H, DV, **dev)

        def forward():
            with torch.no_grad():
                op(q, k, v, g, beta)

        def forward_backward():
            out, _ = op(q, k, v, g, beta)
            out.backward(do)

        fwd, _ = timed(forward)
        both, peak = timed(forward_backward)
        print(json.dumps({"op": "fla.chunk_kda" if per_channel else "fla.chunk_gated_delta_rule", "B": B, "H": H, "T": T, "dk": DK, "dv": DV,
                          "forward_ms": round(fwd, 3), "forward_backward_ms": round(both, 3),
                          "ns_per_token": round(both * 1e6 / (B * T), 1), "peak_gib": round(peak, 3),
                          "backward_guard_bypassed": bypass}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
