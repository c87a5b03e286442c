#!/usr/bin/env python3
"""Runs `adapt gaps` on every model under ../shared/models, as a user would.

Checks: exit code 0 or 3; totals against the owners' published figures
(total within 2 %, active within 10 %), naming which part each figure counts;
the four real manifests agree with their configs tensor by tensor.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ADAPT = sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.environ.get("ADAPT_SHARED_MODELS", os.path.join(ROOT, "..", "shared", "models"))

# folder: (published total, which part it counts, published active, which part)
# Parts are gaps.json `parameters` fields; "decoder+mtp" and
# "decoder+encoders" are sums. Owners count differently: OpenAI and MiniMax
# leave the embedding lookup out of "active", Qwen's hybrid and Kimi-Linear
# leave embedding and LM head out of both; see docs/parameters.md.
PUBLISHED = {
    "DeepSeek-V3-Base": (671e9, "decoder", 37e9, "active"),
    "DeepSeek-R1": (671e9, "decoder", 37e9, "active"),
    "DeepSeek-V3.1_nvidia-NVFP4": (671e9, "decoder", 37e9, "active"),
    "DeepSeek-V3.2": (671e9, "decoder", 37e9, "active"),
    "Kimi-K2-Instruct": (1.04e12, "decoder", 32e9, "active"),
    # K2.5 publishes "~1T"; its text model is K2's (1.04T, checked above).
    "Kimi-K2.5": (1.04e12, "decoder", 32e9, "active"),
    "Kimi-Linear-48B-A3B": (48e9, "decoder_non_embedding", 3e9, "active_non_embedding"),
    "Qwen3-Next-80B-A3B-Thinking": (80e9, "decoder", 3e9, "active_non_embedding"),
    "Qwen3-30B-A3B": (30.5e9, "decoder", 3.3e9, "active"),
    "Qwen3-235B-A22B": (235e9, "decoder", 22e9, "active"),
    "Qwen3-Coder-480B-A35B-Instruct": (480e9, "decoder", 35e9, "active"),
    "Qwen3-VL-30B-A3B-Instruct": (31e9, "decoder+encoders", 3e9, "active_without_embedding"),
    "Qwen3-VL-235B-A22B-Instruct": (236e9, "decoder+encoders", 22e9, "active"),
    "MiniMax-M1": (456e9, "decoder", 45.9e9, "active"),
    "MiniMax-M2.7": (230e9, "decoder", 10e9, "active_without_embedding"),
    "MiniMax-M2.5": (230e9, "decoder", 10e9, "active_without_embedding"),
    "gpt-oss-20b": (21e9, "decoder", 3.6e9, "active_without_embedding"),
    "gpt-oss-120b": (117e9, "decoder", 5.1e9, "active_without_embedding"),
    "Mixtral-8x7B-v0.1": (46.7e9, "decoder", 12.9e9, "active"),
    "Mixtral-8x22B-v0.1": (141e9, "decoder", 39e9, "active"),
    "WizardLM-2-8x22B": (141e9, "decoder", 39e9, "active"),
    "Llama-4-Scout-17B-16E-Instruct": (109e9, "decoder", 17e9, "active"),
    "Llama-4-Maverick-17B-128E-Instruct": (400e9, "decoder", 17e9, "active"),
    "GLM-4.5": (355e9, "decoder+mtp", 32e9, "active"),
    "Hunyuan-A13B": (80e9, "decoder", 13e9, "active"),
    # Ming publishes its LLM (Ling-flash-2.0) figures.
    "Ming-flash-omni-2.0": (100e9, "decoder_non_embedding", 6.1e9, "active"),
}
REAL_MANIFESTS = {"MiniMax-M1": 8243, "Qwen3.5-25B-REAP-A3B": 22213,
                  "WizardLM-2-8x22B": 1739, "gpt-oss-20b": 459}


def part(params, name):
    return sum(params[p] for p in name.split("+"))


class EveryModel(unittest.TestCase):
    reports = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        for model in sorted(os.listdir(MODELS)):
            path = os.path.join(MODELS, model)
            if not os.path.isdir(path):
                continue
            out = os.path.join(cls.tmp.name, model)
            proc = subprocess.run([ADAPT, "gaps", path, "--out", out],
                                  capture_output=True, text=True, timeout=120)
            report = None
            if os.path.exists(os.path.join(out, "gaps.json")):
                with open(os.path.join(out, "gaps.json")) as f:
                    report = json.load(f)
            cls.reports[model] = (proc, report)

    def test_every_model_exits_0_or_3_with_a_report(self):
        self.assertGreaterEqual(len(self.reports), 28)
        for model, (proc, report) in self.reports.items():
            with self.subTest(model=model):
                self.assertIn(proc.returncode, (0, 3), proc.stderr)
                self.assertIsNotNone(report)
                self.assertGreater(len(report["components"]), 3)
                for c in report["components"]:
                    self.assertIn(c["status"], ("supported", "partial", "missing", "excluded"))

    def test_features_taken_from_the_family_are_reported_as_assumptions(self):
        """Issue 16 item 2: a feature inferred from the family rather than
        read from config.json is listed with the tensor that would confirm
        it, checked against the manifest when there is one."""
        with tempfile.TemporaryDirectory() as work:
            def assumptions(folder, exits=(0, 3)):
                out = os.path.join(work, os.path.basename(folder) + "-gaps")
                proc = subprocess.run([ADAPT, "gaps", folder, "--out", out], capture_output=True, text=True,
                                      timeout=120)
                self.assertIn(proc.returncode, exits, proc.stderr)
                with open(os.path.join(out, "gaps.json")) as f:
                    report = json.load(f)
                return {a["feature"]: (a["confirm_by"], a["status"]) for a in report["assumptions"]}, report
            found, _ = assumptions(os.path.join(MODELS, "gpt-oss-20b"))
            self.assertEqual(found["attention sinks"], ("model.layers.0.self_attn.sinks", "confirmed"))
            self.assertEqual({s for _, s in found.values()}, {"confirmed"})
            found, _ = assumptions(os.path.join(MODELS, "Qwen3-Next-80B-A3B-Thinking"))  # no weight index
            self.assertEqual(found["shared-expert gate"][1], "unconfirmed")
            folder = os.path.join(work, "gpt-oss-no-sinks")
            os.makedirs(folder)
            for name in os.listdir(os.path.join(MODELS, "gpt-oss-20b")):
                if name.endswith(".json"):
                    with open(os.path.join(MODELS, "gpt-oss-20b", name)) as f:
                        data = json.load(f)
                    if name == "model.safetensors.index.json":
                        del data["weight_map"]["model.layers.0.self_attn.sinks"]
                    with open(os.path.join(folder, name), "w") as f:
                        json.dump(data, f)
            # A tensor the config implies but the manifest lacks exits 2, report written.
            found, report = assumptions(folder, exits=(2,))
            self.assertEqual(found["attention sinks"][1], "contradicted")
            self.assertIn("model.layers.0.self_attn.sinks", json.dumps(report["manifest"]["issues"]))

    def test_shared_indexer_layers_are_missing_and_counted_without_an_indexer(self):
        """Issue 16 item 7: GLM-5 layers that reuse an earlier layer's top-k
        (index_topk_freq 2, as transformers derives indexer_types) are a
        missing `sparse_attention.shared` component (exit 3), not a refusal,
        and their parameters leave out the indexer they do not have."""
        with open(os.path.join(MODELS, "GLM-5", "config.json")) as f:
            config = json.load(f)
        with tempfile.TemporaryDirectory() as work:
            reports = {}
            for name, extra in (("full", {}), ("freq2", {"index_topk_freq": 2})):
                folder = os.path.join(work, name)
                os.makedirs(folder)
                with open(os.path.join(folder, "config.json"), "w") as f:
                    json.dump({**config, **extra}, f)
                proc = subprocess.run([ADAPT, "gaps", folder, "--out", folder + "-out"],
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(proc.returncode, 0 if name == "full" else 3, proc.stderr)
                with open(os.path.join(folder + "-out", "gaps.json")) as f:
                    reports[name] = json.load(f)
        shared = [c for c in reports["freq2"]["components"] if c["id"] == "sparse_attention.shared"]
        self.assertEqual(len(shared), 1)
        self.assertEqual(shared[0]["status"], "missing")
        layers = config["num_hidden_layers"]
        expected = [i for i in range(layers) if max(i - 1, 0) % 2 != 0]  # offset 2, transformers' rule
        self.assertEqual(shared[0]["layers"], expected)
        self.assertIn("indexer=shared", shared[0]["reasons"][0])
        indexer = (config["index_n_heads"] * config["index_head_dim"] * config["q_lora_rank"]
                   + config["index_head_dim"] * config["hidden_size"] + 2 * config["index_head_dim"]
                   + config["index_n_heads"] * config["hidden_size"])
        self.assertEqual(reports["full"]["parameters"]["decoder"] - reports["freq2"]["parameters"]["decoder"],
                         len(expected) * indexer)
        self.assertNotIn("index_topk_freq", json.dumps(reports["freq2"]["unknown_config_keys"]))

    def test_unseen_enumerated_values_are_gaps_not_refusals(self):
        """Issue 16: a well-formed config whose enumerated value adapt has
        never seen gets a report (exit 3) naming that value, for every
        enumerated key (docs/gaps-schema.md), never exit 2 and never "no
        gaps". Each mutant renames one value of a real shared config."""
        mutants = [  # (model, JSON path, unseen value)
            ("gpt-oss-20b", ["layer_types", 0], "mamba2_attention"),
            ("Qwen3.5-25B-REAP-A3B", ["layer_types", 3], "hyena"),
            ("Qwen3-30B-A3B", ["hidden_act"], "swiglu_oai_new"),
            ("DeepSeek-V3-Base", ["scoring_func"], "sparsemax"),
            ("DeepSeek-V3-Base", ["topk_method"], "noaux_tc_v2"),
            ("DeepSeek-V3-Base", ["rope_scaling", "type"], "longrope2"),
            ("Mixtral-8x7B-v0.1", ["hidden_act"], "geglu_new"),
            ("gpt-oss-20b", ["quantization_config", "quant_method"], "mxfp6"),  # real manifest
        ]
        with tempfile.TemporaryDirectory() as work:
            for i, (model, path, value) in enumerate(mutants):
                with self.subTest(model=model, key=path, value=value):
                    folder = os.path.join(work, f"mutant{i}")
                    os.makedirs(folder)
                    for name in os.listdir(os.path.join(MODELS, model)):
                        if name.endswith(".json"):
                            with open(os.path.join(MODELS, model, name), "rb") as src, \
                                    open(os.path.join(folder, name), "wb") as dst:
                                dst.write(src.read())
                    with open(os.path.join(folder, "config.json")) as f:
                        config = json.load(f)
                    target = config
                    for key in path[:-1]:
                        target = target[key]
                    self.assertNotEqual(target[path[-1]], value)
                    target[path[-1]] = value
                    with open(os.path.join(folder, "config.json"), "w") as f:
                        json.dump(config, f)
                    out = os.path.join(work, f"mutant{i}-out")
                    proc = subprocess.run([ADAPT, "gaps", folder, "--out", out],
                                          capture_output=True, text=True, timeout=120)
                    self.assertEqual(proc.returncode, 3, proc.stderr)
                    with open(os.path.join(out, "gaps.json")) as f:
                        report = json.load(f)
                    missing = [c for c in report["components"] if c["status"] == "missing"]
                    named = [c for c in missing
                             if value in json.dumps(c["reasons"]) or value in json.dumps(c["features"])]
                    self.assertTrue(named, [c["id"] for c in missing])
                    self.assertGreater(report["parameters"]["decoder"], 0)  # still counted
            def gaps_of_mutated(name, model, mutate):
                """`adapt gaps` on a copy of MODEL's config changed by MUTATE: exit 3, the report."""
                folder = os.path.join(work, name)
                os.makedirs(folder)
                with open(os.path.join(MODELS, model, "config.json")) as f:
                    config = json.load(f)
                mutate(config)
                with open(os.path.join(folder, "config.json"), "w") as f:
                    json.dump(config, f)
                proc = subprocess.run([ADAPT, "gaps", folder, "--out", folder + "-out"], capture_output=True,
                                      text=True, timeout=120)
                self.assertEqual(proc.returncode, 3, proc.stderr)
                with open(os.path.join(folder + "-out", "gaps.json")) as f:
                    return json.load(f)

            # GLM-5's per-layer indexer kinds: an unseen one is a gap too.
            def unseen_indexer(config):
                config["indexer_types"] = ["full"] * config["num_hidden_layers"]
                config["indexer_types"][5] = "windowed_v2"
            report = gaps_of_mutated("indexer", "GLM-5", unseen_indexer)
            missing = [c for c in report["components"] if c["status"] == "missing"]
            self.assertEqual([c["layers"] for c in missing], [[5]])
            self.assertIn("indexer_types[5]", json.dumps(missing[0]["reasons"]))
            # A hostile value: control bytes escaped, length bounded, still a gap.
            report = gaps_of_mutated("hostile", "gpt-oss-20b",
                                     lambda c: c["layer_types"].__setitem__(1, "evil\x1b[31m" + "y" * 5000))
            reasons = " ".join(r for c in report["components"] for r in c["reasons"])
            self.assertIn("layer_types[1]", reasons)
            self.assertNotIn("\x1b", reasons)
            self.assertLess(len(reasons), 3000)

    def test_encoders_the_runtime_does_not_implement_are_missing(self):
        """Issue 16: an encoder matched on modality alone is not supported;
        only the type the runtime implements (Qwen3-VL's vision tower) is."""
        expected = {"Qwen3-VL-30B-A3B-Instruct": "supported", "Qwen3-VL-235B-A22B-Instruct": "supported",
                    "Kimi-K2.5": "missing", "Ming-flash-omni-2.0": "missing"}
        for model, status in expected.items():
            with self.subTest(model=model):
                proc, report = self.reports[model]
                vision = [c for c in report["components"]
                          if c["op"] == "adapt.encoder" and c["features"]["modality"] == "vision"]
                self.assertEqual([c["status"] for c in vision], [status])
                if status == "missing":
                    self.assertEqual(proc.returncode, 3)
                    self.assertIn("Qwen3-VL", " ".join(vision[0]["reasons"]))

    def test_weight_formats_the_loader_cannot_read_are_missing(self):
        """Issue 16: a checkpoint whose weights no runtime loader reads is a
        gap (exit 3), never "no gaps"; formats the loader reads are supported,
        and the registry lists exactly the loader's quantized encodings."""
        expected = {"DeepSeek-V3.1_nvidia-NVFP4": ("missing", "nvfp4"),
                    "Kimi-K2.5": ("missing", "compressed-tensors"),
                    "DeepSeek-V3-Base": ("supported", "fp8"),
                    "gpt-oss-20b": ("supported", "mxfp4")}
        for model, (status, method) in expected.items():
            with self.subTest(model=model):
                proc, report = self.reports[model]
                weights = [c for c in report["components"] if c["op"] == "adapt.weights"]
                self.assertEqual(len(weights), 1, [c["id"] for c in report["components"]])
                self.assertEqual(weights[0]["status"], status)
                self.assertEqual(weights[0]["features"]["quantization"], method)
                if status == "missing":
                    self.assertEqual(proc.returncode, 3)
                    self.assertIn("needs a loader", " ".join(weights[0]["reasons"]))
        with open(os.path.join(ROOT, "runtime", "registry", "ops.json")) as f:
            registry = json.load(f)["ops"]
        formats = {v for e in registry if e["op"] == "adapt.weights" for v in e["match"]["quantization"]}
        with open(os.path.join(ROOT, "runtime", "SafetensorsIO.h")) as f:
            loader = f.read()
        encodings = {"fp8": "Fp8Block,", "mxfp4": "Mxfp4,"}
        self.assertEqual(formats, set(encodings))
        for method, encoding in encodings.items():
            self.assertIn(encoding, loader, method)

    def test_totals_match_published_figures(self):
        for model, (total, total_part, active, active_part) in PUBLISHED.items():
            with self.subTest(model=model):
                params = self.reports[model][1]["parameters"]
                ours = part(params, total_part)
                self.assertLess(abs(ours - total) / total, 0.02,
                                f"{total_part} {ours:.4g} vs published {total:.4g}")
                ours = part(params, active_part)
                self.assertLess(abs(ours - active) / active, 0.10,
                                f"{active_part} {ours:.4g} vs published {active:.4g}")

    def test_real_manifests_agree_tensor_by_tensor(self):
        for model, tensors in REAL_MANIFESTS.items():
            with self.subTest(model=model):
                manifest = self.reports[model][1]["manifest"]
                self.assertTrue(manifest["checked"])
                self.assertEqual(manifest["tensors"], tensors)
                self.assertEqual(manifest["issues"], [])
                self.assertEqual(manifest["expected_tensors"], tensors)

    def test_unknown_keys_are_reported_not_dropped(self):
        keys = [k["path"] for k in self.reports["Hunyuan-A13B"][1]["unknown_config_keys"]]
        self.assertIn("cla_share_factor", keys)

    def test_mtp_heads_are_excluded_from_training_not_gaps(self):
        # DeepSeek-V3's MTP layer is shown, counted and explained, but as
        # "excluded" (the training forward does not run it), so the model
        # has no gaps.
        proc, report = self.reports["DeepSeek-V3-Base"]
        mtp = [c for c in report["components"] if c["op"] == "adapt.mtp"]
        self.assertEqual([c["status"] for c in mtp], ["excluded"])
        self.assertIn("merge", " ".join(mtp[0]["reasons"]))
        self.assertEqual(report["status_counts"]["excluded"], 1)
        self.assertEqual(proc.returncode, 0, report["summary"])

    def test_mtp_absent_from_a_pruned_checkpoint_is_a_note(self):
        notes = " ".join(self.reports["Qwen3.5-25B-REAP-A3B"][1]["notes"])
        self.assertIn("mtp", notes)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
