#!/usr/bin/env python3
"""Loss alignment and the PEFT round trip (validation/loss_alignment.py),
like a user runs it: `adapt tiny` -> `adapt build` -> 50 fp32 steps of our
trainer against transformers + PEFT on the same batches and initial adapter.

Bounds and their grounds (docs/validation.md#numerical-bounds):
- routing is forced to the reference's choice in the compared run, since tiny
  random models have near-tied router scores (a gap of ~1.7e-6 was measured)
  and a last-bit difference between CPUs sends a token elsewhere; unforced,
  the curves must agree until the first step with a routing flip, and the
  flips are reported; a sparse-attention indexer's top-k keys are forced
  alike (relu leaves tied scores);
- the loss bound is max(1e-4, 10x the reference's own fp32-vs-float64
  difference on the same batches), measured live: same-routing curves were
  measured within 3.2e-7 on every family but Qwen3-Next (2.6e-5, where the
  reference's own fp32 rounding reaches 2.1e-5 at lr 1e-2);
- round-trip cosines >= 0.9999: measured >= 1 - 1.2e-13.

Tiers: ADAPT_TEST_TIER=full (scripts/test.sh --full) runs every family; the
default tier one family per distinct router, attention and residual scheme.

usage: test_loss_alignment.py ADAPT_BINARY   (ADAPT_PYTHON: the venv's python)
"""
import json
import os
import subprocess
import sys
import unittest

from testutil import (FAMILIES, FIXTURES, ROOT, ScratchTestCase, read_bytes, read_json, read_lines,  # noqa: F401
                      read_text, run, write_json, write_text)

ADAPT = None
PYTHON = os.environ.get("ADAPT_PYTHON", "")
# Softmax top-k + GQA; MLA + grouped sigmoid routing with bias; sinks, sliding
# windows and top-k-then-softmax; top-1 sigmoid input scaling + chunked
# attention; lightning attention + scaled residuals; gated delta rule with
# zero-centred norms (the family whose near-ties made this test flaky).
DEFAULT = ["qwen3_moe", "deepseek_v3", "deepseek_v32", "gpt_oss", "llama4", "minimax", "qwen3_next"]
SELECTED = FAMILIES if os.environ.get("ADAPT_TEST_TIER") == "full" else DEFAULT



@unittest.skipUnless(PYTHON, "needs the reference (ADAPT_PYTHON)")
class LossAlignment(ScratchTestCase):
    WORK_PREFIX = "adapt-align-"

    def test_loss_alignment_and_peft_round_trip_in_fp32(self):
        """50 steps, ours against transformers + PEFT on the same batches and
        initial adapter; then each side's trained adapter in the other."""
        for family in SELECTED:
            with self.subTest(family=family):
                model = os.path.join(self.work, "model-" + family)
                proc = run(ADAPT, "tiny", family, "--out", model)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                meta = read_json(os.path.join(FIXTURES, family, "fixture.json"))
                targets = ",".join(meta["lora"]["target_modules"] + ["experts"])
                project = os.path.join(self.work, "align-" + family)
                proc = run(ADAPT, "build", model, "--out", project, "--lora-targets", targets,
                           "--lora-rank", 4, "--lora-alpha", 8)
                self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
                out = os.path.join(self.work, "align-out-" + family)
                proc = run(PYTHON, os.path.join(ROOT, "validation", "loss_alignment.py"), model,
                           os.path.join(project, "train"), out, "--lr", "1e-2")
                self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-3000:])
                record = read_json(os.path.join(out, "loss-alignment.json"))
                self.assertEqual(len(record["loss_ours"]), 50)
                self.assertTrue(record["routing_forced"], "no MoE routing was recorded in the reference")
                noise = record["reference_fp32_rounding"]["worst_relative_difference_fp32_vs_fp64"]
                self.assertGreater(noise, 0.0, "the float64 reference did not run in float64")
                self.assertLessEqual(record["worst_relative_difference"], max(1e-4, 10 * noise))
                # Unforced: the same curve until the first routing flip.
                self.assertTrue(record["unforced"]["agrees_until_first_flip"], record["unforced"])
                self.assertGreaterEqual(record["round_trip"]["peft_adapter_in_ours_cosine"], 0.9999)
                self.assertGreaterEqual(record["round_trip"]["our_adapter_in_peft_cosine"], 0.9999)
                curve = record["loss_ours"]
                self.assertLess(sum(curve[-5:]), sum(curve[:5]), "the adapter did not learn")
                unforced = record["unforced"]
                print(f"[{family}] forced {record['worst_relative_difference']:.2e} (bound "
                      f"{record['tolerance']:.1e}, reference fp32 rounding {noise:.2e}); unforced "
                      f"{unforced['worst_relative_difference']:.2e}, {unforced['steps_with_flips']} steps with "
                      f"routing flips", file=sys.stderr, flush=True)

    def test_forced_indexer_selection_is_used_and_checked(self):
        """--force-routing replaces a sparse-attention indexer's top-k with the
        given keys (the loss changes when every query gets the first k keys
        instead of its own best k), and a key past the sequence is refused
        with exit 2 naming the option, before any step."""
        model = os.path.join(self.work, "model-dsa")
        self.assertEqual(run(ADAPT, "tiny", "deepseek_v32", "--out", model).returncode, 0)
        project = os.path.join(self.work, "dsa")
        proc = run(ADAPT, "build", model, "--out", project, "--lora-targets", "q_b_proj,o_proj,experts",
                   "--lora-rank", 4, "--lora-alpha", 8)
        self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
        config = read_json(os.path.join(model, "config.json"))
        batch, seq = 2, 16
        keep = min(config["index_topk"], seq)
        self.assertLess(keep, seq, "the tiny model's top-k must leave keys out for this test")
        data = os.path.join(self.work, "dsa-data.jsonl")
        write_text(data, "".join(json.dumps({"input_ids": [(7 * i + 3 * j) % 97 + 1 for j in range(seq)]}) + "\n"
                                 for i in range(batch)))
        # The same experts in every run; the indexer's keys given or not.
        script = """
import sys, torch
from safetensors.torch import save_file
experts, k, layers, first, batch, seq, keep, mode, out = sys.argv[1:]
experts, k, layers, first, batch, seq, keep = map(int, (experts, k, layers, first, batch, seq, keep))
g = torch.Generator().manual_seed(0)
t = {}
for i in range(layers):
    if i >= first:
        t[f"0.model.layers.{i}.mlp"] = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(batch * seq)])
    if mode != "own":
        keys = torch.arange(keep).expand(batch, seq, keep).clone()
        if mode == "past_end":
            keys[0, seq - 1, 0] = seq
        t[f"0.model.layers.{i}.self_attn.indexer"] = keys
save_file(t, out)
"""
        losses = {}
        for mode in ("own", "first_keys", "past_end"):
            routing = os.path.join(self.work, f"dsa-{mode}.safetensors")
            proc = run(PYTHON, "-c", script, config["n_routed_experts"], config["num_experts_per_tok"],
                       config["num_hidden_layers"], config["first_k_dense_replace"], batch, seq, keep, mode, routing)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            out = os.path.join(self.work, f"dsa-run-{mode}")
            proc = run(os.path.join(project, "train"), "--model", model, "--data", data, "--out", out,
                       "--steps", 1, "--batch", batch, "--seq-len", seq, "--device", "cpu", "--dtype", "fp32",
                       "--log-every", 0, "--checkpoint-every", 0, "--force-routing", routing)
            if mode == "past_end":
                self.assertEqual(proc.returncode, 2, proc.stdout[-1000:] + proc.stderr[-1000:])
                self.assertIn("--force-routing", proc.stderr)
                self.assertIn("self_attn.indexer", proc.stderr)
                continue
            self.assertEqual(proc.returncode, 0, proc.stdout[-1000:] + proc.stderr[-1000:])
            losses[mode] = read_json_lines(os.path.join(out, "metrics.jsonl"))[0]["loss"]
        self.assertGreater(abs(losses["first_keys"] - losses["own"]) / abs(losses["own"]), 1e-5, losses)


def read_json_lines(path):
    """Each line of \p path as a JSON value."""
    return [json.loads(line) for line in read_lines(path) if line.strip()]


if __name__ == "__main__":
    ADAPT = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
