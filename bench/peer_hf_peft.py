#!/usr/bin/env python3
"""The peer for training benchmarks: transformers + PEFT on the same model,
same LoRA, same batch, same GPU. Prints one JSON line with tokens/s and peak
memory, measured like adapt's trainer measures itself (steps after warm-up,
synchronised wall clock).

usage: peer_hf_peft.py MODEL_DIR --batch B --seq-len T --steps N
       [--rank R --alpha A --targets q_proj,k_proj,v_proj,o_proj --experts]
       [--bypass-fla-triton-guard]

Linear attention (Qwen3-Next, Kimi-Linear) uses flash-linear-attention's
Triton kernels when `fla` imports (transformers' own choice), else
transformers' torch fallback; the JSON line says which ("linear_attention").
fla 0.6 refuses its gated backward on Hopper with Triton 3.4-3.7.0 (its issue
#640, wrong gradients from one miscompiled kernel); --bypass-fla-triton-guard
switches the guard off so the step's *time* can be measured, and the line
says so ("fla_guard_bypassed").
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    ap.add_argument("--experts", action="store_true", help="also LoRA on routed experts")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--bypass-fla-triton-guard", action="store_true")
    args = ap.parse_args()
    try:
        import fla.ops.common.chunk_o as chunk_o
        linear_attention = "fla"
        if args.bypass_fla_triton_guard:
            chunk_o.TRITON_ABOVE_3_7_1 = True
    except ImportError:
        linear_attention = "torch"
    import peft
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 attn_implementation=args.attn).cuda()
    params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] if args.experts else None
    cfg = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=args.targets.split(","),
                          target_parameters=params)
    model = peft.get_peft_model(model, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, vocab, (args.batch, args.seq_len), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"peer": "transformers+peft", "tokens_per_s": args.batch * args.seq_len / median,
                      "median_step_s": median, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "loss": float(loss), "linear_attention": linear_attention,
                      "fla_guard_bypassed": linear_attention == "fla" and args.bypass_fla_triton_guard}))


if __name__ == "__main__":
    main()
