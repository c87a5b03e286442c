#!/usr/bin/env python3
"""`adapt tiny` for every family, checked by adapt itself and by transformers.

For each family: `adapt tiny` twice (byte-identical output), `adapt gaps` on
the result (a manifest without issues: the writer and the front end agree).
When a Python with transformers is available (env ADAPT_PYTHON, else the
repository's .venv), every model (and its FP8/MXFP4 variant) also loads with
AutoModelForCausalLM with no missing, unexpected or mismatched keys and runs a
forward pass.
Usage: test_tiny_models.py ADAPT_BINARY
"""
import filecmp
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ADAPT = sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "kimi_k2", "gpt_oss",
            "glm4_moe", "minimax_m2", "llama4", "minimax", "qwen3_vl_moe", "qwen3_next", "kimi_linear",
            "deepseek_v32", "glm_moe_dsa"]
# (family, quant): the quantized variants. Without a GPU transformers
# dequantizes them to BF16 on load, which checks names, shapes and scales.
QUANTIZED = [("deepseek_v3", "fp8"), ("kimi_k2", "fp8"), ("gpt_oss", "mxfp4")]
# The branches each family's fixture must exercise (validation/branch_coverage.py).
BRANCHES = {
    "gpt_oss": ["swiglu_gate_clamped", "swiglu_up_clamped", "sliding_window"],
    "llama4": ["chunked_window", "nope_layers", "temperature_tuning"],
    "minimax": ["lightning_blocks"],
    "deepseek_v3": ["group_limited_routing", "unequal_mla_head_dims"],
    "kimi_k2": ["unequal_mla_head_dims"],
    "deepseek_v32": ["group_limited_routing", "sparse_selection", "unequal_mla_head_dims"],
    "glm_moe_dsa": ["sparse_selection"],  # GLM-5's q/k and v head dims are equal (256)
    "qwen3_next": ["unequal_linear_head_dims"],
    "kimi_linear": ["unequal_mla_head_dims"],
    "qwen3_vl_moe": ["image_tokens"],
}
FILES = ["config.json", "model.safetensors.index.json",
         "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]

LOAD = r"""
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
config = AutoConfig.from_pretrained(sys.argv[1])
vision = hasattr(config, "vision_config")  # Qwen3-VL: the conditional-generation class
auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
model, info = auto.from_pretrained(
    sys.argv[1], output_loading_info=True, dtype=torch.bfloat16)
# MiniMax's lightning decay tables are buffers transformers derives from the
# config in _init_weights; no checkpoint (MiniMax-M1's neither) stores them.
DERIVED = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
problems = {k: sorted(x for x in map(str, v)
                      if not (k == "missing_keys" and x.rsplit(".", 1)[-1] in DERIVED))
            for k, v in info.items() if v}
problems = {k: v for k, v in problems.items() if v}
assert not problems, problems
with torch.no_grad():
    logits = model(torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29, 33, 37]])).logits
vocab = config.text_config.vocab_size if vision else config.vocab_size
assert tuple(logits.shape) == (1, 10, vocab), logits.shape
assert bool(torch.isfinite(logits).all())
print("ok", type(model).__name__)
"""


def find_python():
    candidates = [os.environ.get("ADAPT_PYTHON", ""),
                  os.path.join(ROOT, ".venv", "bin", "python")]
    for python in candidates:
        if python and os.path.exists(python):
            probe = subprocess.run([python, "-c", "import transformers, torch"],
                                   capture_output=True, timeout=300)
            if probe.returncode == 0:
                return python
    return None


def tiny(family, out, *extra):
    return subprocess.run([ADAPT, "tiny", family, "--out", out, *extra],
                          capture_output=True, text=True, timeout=120)


class TinyModels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def write(self, family, name, *extra):
        out = self.path(name)
        proc = tiny(family, out, *extra)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return out

    def check_gaps(self, model, family):
        out = model + "-gaps"
        proc = subprocess.run([ADAPT, "gaps", model, "--out", out],
                              capture_output=True, text=True, timeout=120)
        self.assertIn(proc.returncode, (0, 3), proc.stderr)
        with open(os.path.join(out, "gaps.json")) as f:
            report = json.load(f)
        manifest = report["manifest"]
        self.assertTrue(manifest["checked"])
        self.assertEqual(manifest["headers_read"], 2)
        self.assertEqual(manifest["issues"], [])
        self.assertEqual(manifest["tensors"], manifest["expected_tensors"])
        self.assertEqual(report["unknown_config_keys"], [])
        # adapt tiny minimax writes MiniMax-M1 in transformers' minimax form.
        # DeepSeek-V3.2 and GLM-5 keep DeepSeek-V3's weight layout (plus the indexer).
        # Qwen3-VL-MoE's text model has Qwen3-MoE's layout (plus the vision tower).
        expected = {"kimi_k2": "deepseek_v3", "minimax": "minimax_m1", "deepseek_v32": "deepseek_v3",
                    "glm_moe_dsa": "deepseek_v3", "qwen3_vl_moe": "qwen3_moe"}.get(family, family)
        self.assertEqual(report["model"]["family"], expected)

    def test_every_family_is_deterministic_and_passes_gaps(self):
        for family in FAMILIES:
            with self.subTest(family=family):
                a = self.write(family, family)
                b = self.write(family, family + "-again")
                for name in FILES:
                    self.assertTrue(filecmp.cmp(os.path.join(a, name),
                                                os.path.join(b, name), shallow=False),
                                    f"{name} differs between two runs")
                self.check_gaps(a, family)

    def test_seed_and_layers_change_the_model(self):
        a = self.write("qwen3_moe", "seed-a", "--seed", "1")
        b = self.write("qwen3_moe", "seed-b", "--seed", "2")
        self.assertTrue(filecmp.cmp(os.path.join(a, "config.json"),
                                    os.path.join(b, "config.json"), shallow=False))
        self.assertFalse(filecmp.cmp(os.path.join(a, FILES[2]),
                                     os.path.join(b, FILES[2]), shallow=False))
        c = self.write("deepseek_v3", "layers-4", "--layers", "4")
        with open(os.path.join(c, "config.json")) as f:
            self.assertEqual(json.load(f)["num_hidden_layers"], 4)
        self.check_gaps(c, "deepseek_v3")

    def test_quantized_variants_pass_gaps(self):
        for family, quant in QUANTIZED:
            with self.subTest(family=family, quant=quant):
                out = self.write(family, f"{family}-{quant}", "--quant", quant)
                with open(os.path.join(out, "config.json")) as f:
                    config = json.load(f)
                self.assertEqual(config["quantization_config"]["quant_method"], quant)
                self.check_gaps(out, family)

    def test_bad_arguments_exit_2(self):
        proc = tiny("no_such_family", self.path("bad"))
        self.assertEqual(proc.returncode, 2)
        for family in FAMILIES:
            self.assertIn(family, proc.stderr)
        self.assertEqual(tiny("mixtral", self.path("bad"), "--quant", "fp8").returncode, 2)
        self.assertEqual(tiny("mixtral", self.path("bad"), "--layers", "0").returncode, 2)
        self.assertEqual(tiny("mixtral", self.path("bad"), "--seed", "x").returncode, 2)
        proc = subprocess.run([ADAPT, "tiny", "mixtral"], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)

    def test_real_widths_from_a_released_config(self):
        """`--config` takes a released config.json's widths at --layers; with
        --manifest-only the names, shapes and distributions come out (for
        bench/fill_random_weights.py on the GPU machine) and no shard."""
        config = os.path.join(ROOT, "bench", "h200", "qwen3-next-80b-a3b-config.json")
        out = self.write("qwen3_next", "next-80b", "--config", config, "--layers", "4", "--manifest-only")
        self.assertEqual([f for f in os.listdir(out) if f.endswith(".safetensors")], [])
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)
        with open(config) as f:
            released = json.load(f)
        self.assertEqual(written["num_hidden_layers"], 4)
        self.assertEqual({k: v for k, v in written.items() if k != "num_hidden_layers"},
                         {k: v for k, v in released.items() if k != "num_hidden_layers"})
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        with open(os.path.join(out, "random_weights.json")) as f:
            tensors = {t["name"]: t for t in json.load(f)["tensors"]}
        self.assertEqual(set(tensors), set(index["weight_map"]))
        self.assertEqual({t["shard"] for t in tensors.values()}, set(index["weight_map"].values()))
        elements = sum(math.prod(t["shape"]) for t in tensors.values())
        self.assertEqual(index["metadata"]["total_size"], 2 * elements)
        self.assertGreater(len(set(index["weight_map"].values())), 1, "~14 GB in one shard")
        # The released widths: 512 experts a layer, 16 q/k and 32 v heads of 128 in the linear layers.
        self.assertEqual(sum(1 for n in tensors if n.endswith("gate_proj.weight") and ".experts." in n), 4 * 512)
        self.assertEqual(tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"]["shape"], [12288, 2048])
        self.assertEqual(tensors["model.layers.3.self_attn.q_proj.weight"]["shape"], [8192, 2048])
        self.assertEqual(tensors["model.layers.0.input_layernorm.weight"]["mean"], 0.0)  # zero-centred
        # Filled (here on the CPU, at the tiny widths), it is a model adapt gaps reads without issue.
        python = find_python()
        if python is None:
            self.skipTest("no Python with torch (set ADAPT_PYTHON)")
        small = self.write("qwen3_next", "next-small", "--config", os.path.join(self.write("qwen3_next", "next-src"),
                                                                              "config.json"), "--manifest-only")
        proc = subprocess.run([python, os.path.join(ROOT, "bench", "fill_random_weights.py"), small],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        gaps = subprocess.run([ADAPT, "gaps", small, "--out", small + "-gaps"], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(gaps.returncode, 0, gaps.stderr)
        with open(os.path.join(small + "-gaps", "gaps.json")) as f:
            manifest = json.load(f)["manifest"]
        self.assertEqual(manifest["issues"], [])
        self.assertEqual(manifest["tensors"], manifest["expected_tensors"])

    def test_bad_config_or_quantized_manifest_exit_2(self):
        proc = tiny("qwen3_next", self.path("bad"), "--config", self.path("missing.json"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("missing.json", proc.stderr)
        fp8 = os.path.join(self.write("deepseek_v3", "fp8-src", "--quant", "fp8"), "config.json")
        proc = tiny("deepseek_v3", self.path("bad"), "--config", fp8, "--manifest-only")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("expected a bf16 checkpoint for --manifest-only", proc.stderr)

    def test_fixtures_exercise_every_branch_of_their_family(self):
        """Issue 16 item 5: each family's committed fixture (what the model
        stage and loss alignment compare against) reaches its clamps,
        windows, limits, unequal sizes and routing corner cases, counted by
        validation/branch_coverage.py on the reference itself; and the
        fixture was made from exactly the model `adapt tiny` writes today."""
        python = find_python()
        if python is None:
            self.skipTest("no Python with transformers (set ADAPT_PYTHON)")
        probe = os.path.join(ROOT, "validation", "branch_coverage.py")
        for family, branches in BRANCHES.items():
            with self.subTest(family=family):
                out = self.write(family, f"{family}-branches")
                fixture = os.path.join(ROOT, "validation", "fixtures", family)
                with open(os.path.join(fixture, "fixture.json")) as f:
                    made_from = json.load(f)["model_files"]
                for name, digest in made_from.items():
                    with open(os.path.join(out, name), "rb") as f:
                        self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest,
                                         f"{family}: the fixture was made from another {name}")
                proc = subprocess.run([python, probe, out, fixture], capture_output=True, text=True,
                                      timeout=600)
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                hits = json.loads(proc.stdout.strip().splitlines()[-1])
                for branch in branches:
                    self.assertGreater(hits.get(branch, 0), 0, f"{family}: {branch} never acts: {hits}")

    def test_transformers_loads_every_family(self):
        python = find_python()
        if python is None:
            self.skipTest("no Python with transformers (set ADAPT_PYTHON)")
        variants = [(family, None) for family in FAMILIES] + QUANTIZED
        for family, quant in variants:
            with self.subTest(family=family, quant=quant):
                extra = ("--quant", quant) if quant else ()
                out = self.write(family, f"{family}-{quant or 'bf16'}-hf", *extra)
                proc = subprocess.run([python, "-c", LOAD, out], capture_output=True,
                                      text=True, timeout=600)
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                self.assertIn("ok", proc.stdout)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
