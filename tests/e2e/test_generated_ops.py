#!/usr/bin/env python3
"""Approved generated operators in a real trainer (issue 6: "only approved
candidates enter the library or a generated trainer").

A tiny DeepSeek-V3 model (`adapt tiny deepseek_v3`: sigmoid scoring,
correction bias, group-limited top-k, shared expert) against a registry copy
whose `moe.sigmoid` entry is `planned`, so its MoE routing is a gap. Then, as a
user would:

  adapt generate  -> an LLM candidate (scripted server) passes the op stage
  adapt build     -> refused: the gap is open until a person approves
  adapt review --approve-noncritical -> leaves the critical router alone
  adapt review --approve ID; --export FILE
  adapt build --registry FILE -> the approved source is compiled into the
                                 trainer and routes the MoE layers
  DIR/train       -> the same losses as the library's router, step by step
  edit the source -> adapt build refuses it (exit 2): the approval is void

usage: test_generated_ops.py ADAPT_BINARY
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import llm_stub_server

ADAPT = None
CHECKER = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTRY = os.path.join(ROOT, "runtime", "registry", "ops.json")
MOE = "moe.bias_correction.grouped.sigmoid.shared"
TRAIN = ["--steps", "12", "--batch", "4", "--seq-len", "32", "--lr", "1e-2", "--log-every", "0"]


def run(*args, timeout=900):
    env = dict(os.environ)
    for key in ("ADAPT_LLM_BASE_URL", "OPENAI_BASE_URL", "ADAPT_LLM_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


class GeneratedRouterInTrainer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        llm_stub_server.start_for(cls, CHECKER, "adapt-genops-")

    @classmethod
    def tearDownClass(cls):
        llm_stub_server.stop_for(cls)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def test_approved_router_trains_like_the_library(self):
        tiny, registry = self.path("tiny"), self.path("planned.json")
        proc = run(ADAPT, "tiny", "deepseek_v3", "--out", tiny)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(REGISTRY) as f:
            reg = json.load(f)
        for entry in reg["ops"]:
            if entry["id"] == "moe.sigmoid":
                entry["status"] = "planned"  # forward/backward flags left true
        with open(registry, "w") as f:
            json.dump(reg, f)
        # The planned entry is a gap for gaps and build alike (one rule).
        proc = run(ADAPT, "gaps", tiny, "--out", self.path("gaps"), "--registry", registry)
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        proc = run(ADAPT, "build", tiny, "--out", self.path("refused"), "--registry", registry,
                   "--no-compile")
        self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
        self.assertIn(MOE + " is planned (layers 1,2)", proc.stderr)

        gen = self.path("gen")
        proc = run(ADAPT, "generate", tiny, "--out", gen, "--registry", registry,
                   "--endpoint", self.url, "--model", "correct")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(gen, "candidates", MOE, "candidate.json")) as f:
            self.assertEqual(json.load(f)["status"], "validated")

        # Validated is not approved: nothing is exported, the gap stays.
        approved = self.path("approved.json")
        proc = run(ADAPT, "review", gen, "--export", approved)
        self.assertIn("exported 0 approved", proc.stdout)
        proc = run(ADAPT, "build", tiny, "--out", self.path("refused"), "--registry", approved,
                   "--no-compile")
        self.assertEqual(proc.returncode, 3, proc.stderr)
        # A router is critical: bulk approval leaves it for a person.
        proc = run(ADAPT, "review", gen, "--approve-noncritical")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("left for review: %s (critical" % MOE, proc.stdout)
        self.assertIn("approved 0 non-critical", proc.stdout)
        proc = run(ADAPT, "review", gen, "--approve", MOE, "--by", "alice")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = run(ADAPT, "review", gen, "--export", approved)
        self.assertIn("exported 1 approved", proc.stdout)
        with open(approved) as f:
            ops = json.load(f)["ops"]
        moe_entries = [e["id"] for e in ops if e["op"] == "adapt.moe"]
        self.assertEqual(moe_entries[0], "generated." + MOE)  # matched before the library's
        impl = ops[[e["id"] for e in ops].index("generated." + MOE)]["implementation"]
        self.assertEqual((impl["task"], impl["approved"]["by"]), ("moe_routing", "alice"))

        proc = run(ADAPT, "gaps", tiny, "--out", self.path("gaps2"), "--registry", approved)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

        # Two trainers: the library's router, and the approved generated one.
        lib, gen_proj = self.path("lib"), self.path("gen-proj")
        proc = run(ADAPT, "build", tiny, "--out", lib)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        proc = run(ADAPT, "build", tiny, "--out", gen_proj, "--registry", approved)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("generated operator " + MOE, proc.stdout)
        with open(os.path.join(gen_proj, "model.cpp")) as f:
            model_cpp = f.read()
        self.assertIn('m.layers[i].ffn.generatedRouter = "%s";' % MOE, model_cpp)
        with open(os.path.join(gen, "candidates", MOE, "candidate.cpp")) as f:
            source = f.read()
        copied = [n for n in os.listdir(os.path.join(gen_proj, "candidates"))]
        self.assertEqual(len(copied), 1)
        with open(os.path.join(gen_proj, "candidates", copied[0])) as f:
            self.assertEqual(f.read(), source)  # the approved bytes, unchanged

        data = self.path("data.jsonl")
        write_dataset(data)
        runs = {}
        for name, project in (("library", lib), ("generated", gen_proj)):
            out = self.path("run-" + name)
            proc = run(os.path.join(project, "train"), "--data", data, "--out", out, *TRAIN)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            runs[name] = (losses(out), proc.stderr)
        self.assertIn("generated operator: %s (moe_routing; sha256" % MOE, runs["generated"][1])
        self.assertNotIn("generated operator", runs["library"][1])
        library, generated = runs["library"][0], runs["generated"][0]
        self.assertEqual(len(library), 12)
        self.assertLess(library[-1], library[0] - 0.5)  # it learns
        worst = max(abs(a - b) for a, b in zip(library, generated))
        # Both fp32 in one runtime, the operator written differently: measured
        # in docs/validation.md#numerical-bounds; 1e-4 absolute on losses ~5.
        print(f"generated router vs library: worst loss difference {worst:.2e} (bound 1e-4)",
              file=sys.stderr, flush=True)
        self.assertLess(worst, 1e-4, (library, generated))

        # Issue 14: an approval needs a MAC under this machine's review key.
        # A registry entry edited by hand (another reviewer, another source
        # hash) or a review.json rewritten by hand is refused.
        with open(approved) as f:
            registry_json = json.load(f)
        for tamper in ("by", "mac"):
            forged = json.loads(json.dumps(registry_json))
            entry = next(e for e in forged["ops"] if e["id"] == "generated." + MOE)
            entry["implementation"]["approved"][tamper] = "mallory" if tamper == "by" else "0" * 64
            path = self.path("forged-%s.json" % tamper)
            with open(path, "w") as f:
                json.dump(forged, f)
            proc = run(ADAPT, "build", tiny, "--out", self.path("forged"), "--registry", path, "--no-compile")
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn("no valid review MAC", proc.stderr)
        review_path = os.path.join(gen, "candidates", MOE, "review.json")
        with open(review_path) as f:
            review = json.load(f)
        review["by"] = "mallory"  # the hash still matches; the MAC does not
        with open(review_path, "w") as f:
            json.dump(review, f)
        proc = run(ADAPT, "review", gen)
        self.assertIn("FORGED", proc.stdout)
        proc = run(ADAPT, "review", gen, "--export", self.path("after-forgery.json"))
        self.assertIn("exported 0 approved", proc.stdout)

        # Editing the approved source voids it for the build too.
        with open(os.path.join(gen, "candidates", MOE, "candidate.cpp"), "a") as f:
            f.write("// edited after approval\n")
        proc = run(ADAPT, "build", tiny, "--out", self.path("edited"), "--registry", approved,
                   "--no-compile")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("changed after approval", proc.stderr)

    def trains_like_the_library(self, family, edit, components):
        """Builds FAMILY's tiny model against a registry copy changed by EDIT
        (entry id -> (match key, allowed values)), generates, approves and
        exports one candidate per component (scripted scenario), builds the
        trainer with them and the library's, and compares 12 training steps."""
        tiny, registry = self.path(family), self.path(family + "-planned.json")
        proc = run(ADAPT, "tiny", family, "--out", tiny)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(REGISTRY) as f:
            reg = json.load(f)
        for entry in reg["ops"]:
            if entry["id"] in edit:
                key, values = edit[entry["id"]]
                entry["match"][key] = values
        with open(registry, "w") as f:
            json.dump(reg, f)
        exported = registry
        for i, (component, (scenario, _)) in enumerate(sorted(components.items())):
            gen = self.path("%s-gen-%d" % (family, i))
            proc = run(ADAPT, "generate", tiny, "--out", gen, "--registry", registry,
                       "--only", component, "--endpoint", self.url, "--model", scenario)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertEqual(run(ADAPT, "review", gen, "--approve", component).returncode, 0)
            merged = self.path("%s-approved-%d.json" % (family, i))
            proc = run(ADAPT, "review", gen, "--export", merged, "--registry", exported)
            self.assertIn("exported 1 approved", proc.stdout)
            exported = merged
        lib, gen_proj = self.path(family + "-lib"), self.path(family + "-gen-proj")
        proc = run(ADAPT, "build", tiny, "--out", lib)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        proc = run(ADAPT, "build", tiny, "--out", gen_proj, "--registry", exported)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(os.path.join(gen_proj, "model.cpp")) as f:
            model_cpp = f.read()
        for component, (_, field) in components.items():
            self.assertIn('m.layers[i].%s = "%s";' % (field, component), model_cpp)
        data = self.path("data.jsonl")
        write_dataset(data)
        runs = {}
        for name, project in (("library", lib), ("generated", gen_proj)):
            out = self.path("%s-run-%s" % (family, name))
            proc = run(os.path.join(project, "train"), "--data", data, "--out", out, *TRAIN)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            runs[name] = (losses(out), proc.stderr)
        self.assertEqual(runs["generated"][1].count("generated operator: "), len(components))
        library, generated = runs["library"][0], runs["generated"][0]
        self.assertLess(library[-1], library[0] - 0.5)
        worst = max(abs(a - b) for a, b in zip(library, generated))
        print(f"[{family}] generated operators vs library: worst loss difference {worst:.2e} (bound 1e-4)",
              file=sys.stderr, flush=True)
        self.assertLess(worst, 1e-4, (library, generated))

    def test_generated_attention_core_and_activation_train_like_the_library(self):
        """gpt-oss: attention with sinks (sliding and full layers) and the
        clamped SwiGLU of its experts, each a gap in a registry copy."""
        self.trains_like_the_library(
            "gpt_oss", {"moe.softmax": ("swiglu", ["plain"]), "attention.gqa": ("sinks", ["no"])},
            {"attention.gqa.qkv_bias.yarn.sinks.sliding": ("attention_correct",
                                                          "attention.generatedCore"),
             "attention.gqa.qkv_bias.yarn.sinks": ("attention_correct", "attention.generatedCore"),
             "moe.router_bias.softmax.clamped": ("glu_correct", "ffn.generatedActivation")})

    def test_generated_rope_trains_like_the_library(self):
        """Qwen3-MoE with its default RoPE a gap: a generated rotary operator
        rotates q and k of every layer."""
        with open(REGISTRY) as f:
            gqa = [e for e in json.load(f)["ops"] if e["id"] == "attention.gqa"][0]
        rope = [v for v in gqa["match"]["rope"] if v != "default"]
        self.trains_like_the_library(
            "qwen3_moe", {"attention.gqa": ("rope", rope)},
            {"attention.gqa.qk_norm": ("rope_correct", "attention.generatedRope")})


def write_dataset(path):
    """Token sequences with a learnable rule: next = (5 * previous + 3) mod 256."""
    if os.path.exists(path):
        return
    rng = random.Random(1)
    with open(path, "w") as f:
        for _ in range(64):
            token, ids = rng.randrange(256), []
            for _ in range(48):
                ids.append(token)
                token = (token * 5 + 3) % 256
            f.write(json.dumps({"input_ids": ids}) + "\n")


class ApprovalPolicy(unittest.TestCase):
    """Critical operators always need their own approval; a renamed weight
    (no arithmetic changes) may be approved in bulk (Hunyuan-A13B's real
    config: its shared_mlp is DeepSeek's shared_experts under another name,
    its NTK-alpha RoPE a re-parameterised default RoPE)."""

    def test_bulk_approval_skips_critical_candidates(self):
        models = os.environ.get("ADAPT_SHARED_MODELS", os.path.join(ROOT, "..", "shared", "models"))
        hunyuan = os.path.join(models, "Hunyuan-A13B")
        if not os.path.isdir(hunyuan):
            self.skipTest("no shared model Hunyuan-A13B")
        work = tempfile.mkdtemp(prefix="adapt-policy-")
        self.addCleanup(shutil.rmtree, work, True)
        out = os.path.join(work, "gen")
        proc = run(ADAPT, "generate", hunyuan, "--out", out)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        rope, rename = "attention.gqa.qk_norm.ntk_alpha", "moe.softmax.shared"
        proc = run(ADAPT, "review", out)
        self.assertIn("rule renamed_weight; proposed; not critical", proc.stdout)
        self.assertIn("rule parameter_remap; proposed; critical: approval required", proc.stdout)
        proc = run(ADAPT, "review", out, "--approve-noncritical", "--by", "bot")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("approved %s by bot" % rename, proc.stdout)
        self.assertIn("left for review: %s (critical" % rope, proc.stdout)
        self.assertFalse(os.path.exists(os.path.join(out, "candidates", rope, "review.json")))
        exported = os.path.join(work, "approved.json")
        proc = run(ADAPT, "review", out, "--export", exported)
        self.assertIn("exported 1 approved", proc.stdout)
        with open(exported) as f:
            ops = {e["id"]: e for e in json.load(f)["ops"]}
        self.assertIn("weight_aliases", ops["moe.softmax"])
        self.assertNotIn("ntk_alpha", ops["attention.gqa"]["match"]["rope"])
        # Mixing the bulk approval with a single decision is a usage error.
        self.assertEqual(run(ADAPT, "review", out, "--approve-noncritical", "--approve",
                             rope).returncode, 2)


if __name__ == "__main__":
    ADAPT = os.path.abspath(sys.argv.pop(1))
    CHECKER = os.path.join(os.path.dirname(os.path.dirname(ADAPT)), "runtime",
                           "adapt-candidate-check")
    unittest.main(verbosity=2)
