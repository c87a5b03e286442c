#!/usr/bin/env python3
"""End to end: `adapt tiny` -> `adapt build` -> DIR/train, like a user runs it.

For every supported family: the generated trainer compiles against the
runtime, its loss falls over a few dozen LoRA steps, the adapter it exports
loads in PEFT with every key landing in the model, and transformers + PEFT
on that adapter give the trainer's own logits (fp32, CPU). Then, for chosen
families: a run killed with SIGKILL and resumed gives exactly the loss curve
of one that never stopped; SIGTERM finishes the step and checkpoints; merged
weights equal base + adapter; and bad inputs and faults (missing or truncated
shard, wrong tensor shape, token beyond the vocabulary, NaN loss, a full disk
at checkpoint time) each give their documented exit code and message.

usage: test_trainer.py ADAPT_BINARY   (ADAPT_PYTHON: the venv's python)
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from testutil import (FAMILIES, FIXTURES, ROOT, read_bytes, read_json, read_lines, read_text,  # noqa: F401
                      run, write_json, write_text)

ADAPT = None
PYTHON = os.environ.get("ADAPT_PYTHON", "")
VOCAB = 256
TRAIN = ["--steps", "40", "--batch", "4", "--seq-len", "32", "--lr", "1e-2", "--log-every", "0"]

# transformers + PEFT on the exported adapter, against the trainer's logits.
REFERENCE = r"""
import sys, torch, peft
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
model_dir, adapter, logits_file = sys.argv[1:4]
ours = load_file(logits_file)
vision = hasattr(AutoConfig.from_pretrained(model_dir), "vision_config")  # Qwen3-VL, text-only batches
auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
model = auto.from_pretrained(model_dir, dtype=torch.float32)
peft_model = peft.PeftModel.from_pretrained(model, adapter)
params = dict(peft_model.named_parameters())
saved = load_file(adapter + "/adapter_model.safetensors")
unloaded = [k for k in saved if k.replace(".weight", ".default.weight") not in params]
mismatched = [k for k in saved if k not in unloaded and
              not torch.equal(params[k.replace(".weight", ".default.weight")].detach(), saved[k])]
with torch.no_grad():
    ref = peft_model(ours["input_ids"]).logits
rel = ((ref - ours["logits"]).abs().max() / ref.abs().max()).item()
print({"rel": rel, "unloaded": unloaded[:5], "mismatched": mismatched[:5], "keys": len(saved)})
"""

# The merged checkpoint against PEFT's own merge_and_unload of the exported
# adapter, tensor by tensor (the merged shards keep the checkpoint's bf16, so
# the tolerance is bf16 rounding; logits would amplify it through routing).
MERGED = r"""
import sys, torch, peft
from transformers import AutoModelForCausalLM
base, adapter, merged = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
reference = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict()
ours = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
worst = max(((reference[k] - ours[k]).abs().max() / reference[k].abs().max()).item() for k in reference)
original = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict()
changed = sum(not torch.equal(ours[k], original[k]) for k in ours)
print({"worst": worst, "keys_equal": sorted(reference) == sorted(ours), "changed": changed})
"""



def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def write_dataset(path, documents=64, length=48, vocab=VOCAB, seed=1):
    """Token sequences with a learnable rule: next = (5 * previous + 3) mod vocab."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(documents):
            token, ids = rng.randrange(vocab), []
            for _ in range(length):
                ids.append(token)
                token = (token * 5 + 3) % vocab
            f.write(json.dumps({"input_ids": ids}) + "\n")


def write_images(path, pixels, shape, grid):
    """A safetensors file with pixel_values (F32 [patches, C*T*P*P]) and
    image_grid_thw (I64 [1, 3]), written with the standard library."""
    values = struct.pack(f"<{len(pixels)}f", *pixels)
    thw = struct.pack("<3q", *grid)
    header = json.dumps({
        "pixel_values": {"dtype": "F32", "shape": shape, "data_offsets": [0, len(values)]},
        "image_grid_thw": {"dtype": "I64", "shape": [1, 3], "data_offsets": [len(values), len(values) + len(thw)]},
    }).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + values + thw)


class Trainer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="adapt-trainer-")
        cls.data = os.path.join(cls.work, "data.jsonl")
        write_dataset(cls.data)
        cls.built = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def build(self, family):
        """The tiny model and its compiled trainer, built once per family."""
        if family in self.built:
            return self.built[family]
        model = os.path.join(self.work, "model-" + family)
        project = os.path.join(self.work, "build-" + family)
        proc = run(ADAPT, "tiny", family, "--out", model)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        print(f"[{family}] compiling the generated trainer", file=sys.stderr, flush=True)
        proc = run(ADAPT, "build", model, "--out", project)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        train = os.path.join(project, "train")
        self.assertTrue(os.access(train, os.X_OK), "adapt build left no DIR/train")
        self.built[family] = (model, train)
        return model, train

    def test_families_train_export_and_match_the_reference(self):
        for family in FAMILIES:
            with self.subTest(family=family):
                model, train = self.build(family)
                out = os.path.join(self.work, "run-" + family)
                proc = run(train, "--model", model, "--data", self.data, "--out", out, *TRAIN,
                           "--export", out + "/adapter", "--logits-out", out + "/logits.safetensors")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                curve = losses(out)
                self.assertEqual(len(curve), 40)
                first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
                print(f"[{family}] loss {first:.3f} -> {last:.3f}", file=sys.stderr, flush=True)
                self.assertLess(last, 0.75 * first, f"{family}: loss did not fall: {curve}")
                for name in ("adapter_config.json", "adapter_model.safetensors"):
                    self.assertTrue(os.path.exists(os.path.join(out, "adapter", name)), name)
                metrics = json.loads(read_lines(out + "/metrics.jsonl")[0])
                self.assertTrue(any(metrics["expert_load"]), "no expert load logged")
                for layer in metrics["expert_load"]:
                    if layer:
                        self.assertEqual(sum(layer), 4 * 32 * self.top_k(model, family))
                if not PYTHON:
                    continue
                proc = run(PYTHON, "-c", REFERENCE, model, out + "/adapter", out + "/logits.safetensors")
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                result = eval(proc.stdout.strip().splitlines()[-1])
                self.assertEqual(result["unloaded"], [], f"{family}: adapter keys PEFT did not load")
                self.assertEqual(result["mismatched"], [], f"{family}: adapter values changed on load")
                # Same adapter, one fp32 forward each: measured <= 2e-6 (docs/validation.md
                # #numerical-bounds); 1e-4 is >= 50x that, a wrong op is >1e-2.
                print(f"[{family}] logits vs transformers + PEFT {result['rel']:.2e} (bound 1e-4)",
                      file=sys.stderr, flush=True)
                self.assertLess(result["rel"], 1e-4, f"{family}: logits differ from transformers + PEFT")

    def top_k(self, model, family):
        config = read_json(os.path.join(model, "config.json"))
        config = config.get("text_config", config)
        return config.get("num_experts_per_tok", config.get("num_experts_per_token", 1))  # Kimi-Linear: _token

    def test_image_documents_train(self):
        """Qwen3-VL: JSONL documents with images (docs/datasets.md) go through
        the vision tower; a document longer than a window is refused."""
        model, train = self.build("qwen3_vl_moe")
        config = read_json(os.path.join(model, "config.json"))
        vision, image_token = config["vision_config"], config["image_token_id"]
        width = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
        rng = random.Random(3)
        folder = os.path.join(self.work, "images")
        os.makedirs(folder, exist_ok=True)
        data = os.path.join(folder, "data.jsonl")
        with open(data, "w") as f:
            for d in range(16):
                grid = [1, 4, 4] if d % 2 else [1, 2, 4]  # 4 or 2 merged tokens
                patches = grid[1] * grid[2]
                write_images(os.path.join(folder, f"doc{d}.safetensors"),
                             [rng.uniform(-1, 1) for _ in range(patches * width)], [patches, width], grid)
                token, text = rng.randrange(VOCAB), []
                for _ in range(20):
                    text.append(token if token not in (image_token, image_token + 1) else 3)
                    token = (token * 5 + 3) % VOCAB
                ids = text[:4] + [image_token] * (patches // 4) + text[4:]
                f.write(json.dumps({"input_ids": ids, "images": f"doc{d}.safetensors"}) + "\n")
        out = os.path.join(self.work, "run-images")
        proc = run(train, "--model", model, "--data", data, "--out", out, "--steps", "30", "--batch", "4",
                   "--seq-len", "32", "--lr", "1e-2", "--log-every", "0")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        curve = losses(out)
        self.assertEqual(len(curve), 30)
        self.assertLess(sum(curve[-5:]), 0.75 * sum(curve[:5]), curve)
        proc = run(train, "--model", model, "--data", data, "--out", out + "-short", "--steps", "1",
                   "--seq-len", "16")
        self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
        self.assertIn("fit in one window", proc.stderr)

    def test_killed_run_resumes_to_the_same_loss_curve(self):
        for family in ("qwen3_moe", "deepseek_v3"):
            with self.subTest(family=family):
                model, train = self.build(family)
                args = ["--model", model, "--data", self.data, "--steps", "60", "--batch", "4",
                        "--seq-len", "32", "--lr", "1e-2", "--log-every", "0", "--checkpoint-every", "10"]
                whole = os.path.join(self.work, "whole-" + family)
                proc = run(train, "--out", whole, *args)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                killed = os.path.join(self.work, "killed-" + family)
                proc = subprocess.Popen([train, "--out", killed, *args], stderr=subprocess.PIPE)
                metrics = os.path.join(killed, "metrics.jsonl")
                deadline = time.time() + 120
                while time.time() < deadline and proc.poll() is None:
                    if os.path.exists(metrics) and len(read_lines(metrics)) >= 25:
                        break
                    time.sleep(0.01)
                proc.kill()
                proc.wait()
                self.assertLess(len(losses(killed)), 60, "the run ended before it could be killed")
                proc = run(train, "--out", killed, "--resume")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertIn("resumed from", proc.stderr)
                self.assertEqual(losses(killed), losses(whole))

    def test_recomputed_layers_train_exactly_like_stored_ones(self):
        # --recompute trades compute for activation memory; it must not change
        # a single number: same losses and same adapter, with LoRA dropout
        # (the recomputation must draw the same masks) and MoE routing.
        model, _ = self.build("qwen3_moe")
        project = os.path.join(self.work, "build-qwen3_moe-dropout")
        proc = run(ADAPT, "build", model, "--out", project, "--lora-dropout", "0.2")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        trainers = {"qwen3_moe with dropout": (model, os.path.join(project, "train")),
                    "minimax": self.build("minimax")}
        for family, (model, train) in trainers.items():
            with self.subTest(family=family):
                args = ["--model", model, "--data", self.data, "--steps", "6", "--batch", "2",
                        "--seq-len", "32", "--lr", "1e-2", "--log-every", "0", "--seed", "3"]
                runs = {}
                for mode in ("stored", "recomputed"):
                    out = os.path.join(self.work, f"{mode}-{family.replace(' ', '-')}")
                    flags = ["--recompute"] if mode == "recomputed" else []
                    proc = run(train, "--out", out, "--export", out + "/adapter", *args, *flags)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    with open(out + "/adapter/adapter_model.safetensors", "rb") as f:
                        runs[mode] = (losses(out), f.read())
                self.assertEqual(runs["recomputed"][0], runs["stored"][0])
                self.assertEqual(runs["recomputed"][1], runs["stored"][1], "the adapters differ")

    def test_lora_settings_at_train_time_without_rebuilding(self):
        model, train = self.build("qwen3_moe")  # generated with rank 8, alpha 16
        out = os.path.join(self.work, "lora-at-train-time")
        args = ["--model", model, "--data", self.data, "--batch", "2", "--seq-len", "32", "--log-every", "0"]
        proc = run(train, "--out", out, "--steps", "2", "--export", out + "/adapter", "--lora-rank", "4",
                   "--lora-alpha", "8", "--lora-dropout", "0.1", "--rslora", *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out + "/adapter/adapter_config.json") as f:
            config = json.load(f)
        # (PEFT refuses dropout on expert parameters: the config says 0 when experts are adapted.)
        self.assertEqual((config["r"], config["lora_alpha"], config["use_rslora"]), (4, 8, True))
        with open(out + "/adapter/adapter_model.safetensors", "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        ranks = {v["shape"][0] for k, v in header.items() if k.endswith("q_proj.lora_A.weight")}
        self.assertEqual(ranks, {4})
        # The rank is the adapter's shape: a resumed run keeps the checkpoint's.
        proc = run(train, "--out", out, "--steps", "3", "--resume", "--lora-rank", "6", *args)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--lora-rank", proc.stderr)
        proc = run(train, "--out", out, "--steps", "3", "--resume", *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for flag, value in (("--lora-rank", "0"), ("--lora-alpha", "-1"), ("--lora-dropout", "1")):
            with self.subTest(flag=flag):
                proc = run(train, "--out", os.path.join(self.work, "bad-lora"), "--steps", "1", flag, value, *args)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(flag, proc.stderr)

    def test_adapted_shared_expert_gate_and_router_reach_the_peft_config(self):
        # Qwen3-Next's shared_expert_gate ([1, hidden]), a linear the families' test leaves
        # alone, and the router beside it: each adapter must be listed in the PEFT config
        # (the gate in target_modules, the router in target_parameters), every key must
        # load, and PEFT's logits must be ours.
        model, _ = self.build("qwen3_next")
        project = os.path.join(self.work, "build-qwen3_next-gate")
        proc = run(ADAPT, "build", model, "--out", project, "--lora-targets", "q_proj,shared_expert_gate",
                   "--lora-router")  # adapt counts the gate among the routers
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        out = os.path.join(self.work, "shared-gate")
        proc = run(os.path.join(project, "train"), "--model", model, "--data", self.data, "--out", out,
                   "--steps", "3", "--batch", "2", "--seq-len", "32", "--lr", "1e-2", "--log-every", "0",
                   "--export", out + "/adapter", "--logits-out", out + "/logits.safetensors")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        config = read_json(out + "/adapter/adapter_config.json")
        self.assertIn("mlp.shared_expert_gate", config["target_modules"])
        self.assertIn("mlp.gate.weight", config["target_parameters"])
        if not PYTHON:
            return
        proc = run(PYTHON, "-c", REFERENCE, model, out + "/adapter", out + "/logits.safetensors")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        result = eval(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(result["unloaded"], [], "adapter keys PEFT did not load")
        # The same bound as the families' test above (measured <= 2e-6 there).
        self.assertLess(result["rel"], 1e-4, "logits differ from transformers + PEFT")

    def test_eval_set_tensorboard_and_report(self):
        # An eval set: eval_loss every N steps and at the end, the best
        # adapter kept; epochs instead of steps; the scalars in TensorBoard's
        # event format; report.html's charts hold exactly metrics.jsonl's data.
        model, train = self.build("qwen3_moe")
        eval_data = os.path.join(self.work, "eval.jsonl")
        write_dataset(eval_data, documents=16, seed=7)
        out = os.path.join(self.work, "eval-run")
        args = ["--model", model, "--data", self.data, "--batch", "4", "--seq-len", "32", "--lr", "1e-2",
                "--log-every", "0", "--eval-data", eval_data]
        proc = run(train, "--out", out, "--epochs", "2", "--eval-every", "10", *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # 64 documents of 48 tokens packed into windows of 32: 96 windows, 2 epochs of batches of 4.
        self.assertIn("2 epochs of 96 windows in batches of 4: 48 steps", proc.stderr)
        self.assertIn("eval loss before training", proc.stderr)
        lines = [json.loads(line) for line in read_lines(os.path.join(out, "metrics.jsonl"))]
        self.assertEqual(len(lines), 48)
        evals = {line["step"]: line["eval_loss"] for line in lines if "eval_loss" in line}
        self.assertEqual(sorted(evals), [10, 20, 30, 40, 48])
        self.assertLess(evals[48], 0.8 * evals[10], "the eval loss did not fall")
        best = read_json(os.path.join(out, "best-adapter", "adapt_eval.json"))
        self.assertEqual(best["eval_loss"], min(evals.values()))
        self.assertEqual(best["step"], min(evals, key=evals.get))
        self.assertTrue(os.path.exists(os.path.join(out, "best-adapter", "adapter_model.safetensors")))

        # TensorBoard reads our event file: every step's loss, and the evals.
        if PYTHON:
            script = ("import sys, glob, json\n"
                      "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
                      "files = glob.glob(sys.argv[1] + '/events.out.tfevents.*')\n"
                      "ea = EventAccumulator(files[0]); ea.Reload()\n"
                      "print(json.dumps({'files': len(files), 'tags': ea.Tags()['scalars'], "
                      "'loss': [[e.step, e.value] for e in ea.Scalars('train/loss')], "
                      "'eval': [[e.step, e.value] for e in ea.Scalars('eval/loss')]}))\n")
            proc = run(PYTHON, "-c", script, os.path.join(out, "tensorboard"))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            board = json.loads(proc.stdout)
            self.assertEqual(board["files"], 1)
            self.assertEqual(sorted(board["tags"]),
                             ["eval/loss", "perf/tokens_per_s", "train/grad_norm", "train/loss", "train/lr"])
            self.assertEqual([s for s, _ in board["loss"]], list(range(1, 49)))
            for (step, value), line in zip(board["loss"], lines):  # simple_value is a float32
                self.assertAlmostEqual(value, line["loss"], delta=1e-6 * abs(line["loss"]))
            self.assertEqual([s for s, _ in board["eval"]], [0, 10, 20, 30, 40, 48])

        # report.html: the charts' data are metrics.jsonl's (9 significant
        # digits), and the expert load over time has 40 evenly spaced steps.
        from html.parser import HTMLParser

        class Charts(HTMLParser):
            def __init__(self):
                super().__init__()
                self.series, self.heat, self.table, self.cells = {}, {}, None, []

            def handle_starttag(self, tag, attrs):
                a = dict(attrs)
                if tag == "figure" and "data-chart" in a:
                    self.series[a["data-chart"]] = json.loads(a["data-series"])
                if tag == "table" and "data-heat" in a:
                    self.table = a["data-heat"]
                    self.heat[self.table] = []
                if tag == "tr" and self.table:
                    self.heat[self.table].append([])
                if tag == "td" and self.table and "title" in a:
                    self.heat[self.table][-1].append(float(a["title"]))

            def handle_endtag(self, tag):
                if tag == "table":
                    self.table = None

        charts = Charts()
        charts.feed(read_text(os.path.join(out, "report.html")))
        loss = charts.series["loss"]
        self.assertEqual(len(loss["loss"]), len(lines))
        for (step, value), line in zip(loss["loss"], lines):
            self.assertEqual(step, line["step"])
            self.assertAlmostEqual(value, line["loss"], delta=1e-8 * abs(line["loss"]))
        evals[0] = lines[0]["eval_loss_untrained"]
        self.assertGreater(evals[0], evals[48])
        self.assertEqual([[s, round(v, 6)] for s, v in loss["eval loss"]],
                         [[s, round(evals[s], 6)] for s in sorted(evals)])
        self.assertEqual(len(charts.series["tokens/s"]["tokens_per_s"]), 48)
        layer0 = [rows for title, rows in charts.heat.items() if title.startswith("layer 0: expert load")]
        self.assertEqual(len(layer0), 1)
        rows = [r for r in layer0[0] if r]
        experts = len(lines[-1]["expert_load"][0])
        self.assertEqual((len(rows), len(rows[0])), (experts, 40))
        last = lines[-1]["expert_load"][0]
        for e in range(experts):  # the last column is the last step, in % of its routed tokens
            self.assertAlmostEqual(rows[e][-1], 100.0 * last[e] / sum(last), places=5)

        # Flags that contradict each other stop with exit 2, naming the flag.
        plain = args[:-2]  # without --eval-data
        for bad, flag in ((["--epochs", "1", "--steps", "3", *args], "--epochs"),
                          (["--steps", "2", "--eval-every", "1", *plain], "--eval-every"),
                          (["--steps", "2", "--schedule", "exponential", *plain], "--schedule")):
            with self.subTest(flag=flag):
                proc = run(train, "--out", os.path.join(self.work, "bad-eval"), *bad)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(flag, proc.stderr)
        # The schedules: constant keeps the peak after warmup; linear ends at lr / steps.
        for schedule, want in (("constant", [1e-2] * 4), ("linear", [1e-2, 7.5e-3, 5e-3, 2.5e-3])):
            out = os.path.join(self.work, "schedule-" + schedule)
            proc = run(train, "--out", out, "--steps", "4", "--schedule", schedule, *plain)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            got = [json.loads(line)["lr"] for line in read_lines(os.path.join(out, "metrics.jsonl"))]
            for g, w in zip(got, want):
                self.assertAlmostEqual(g, w, delta=1e-12)

    def test_config_file_holds_the_flags_and_the_command_line_overrides(self):
        model, train = self.build("qwen3_moe")
        config = os.path.join(self.work, "run.yaml")
        write_text(config, "---\n# a run\nmodel: %s\ndata: %s\nsteps: 5   # overridden below\nbatch: 2\n"
                           "seq_len: 32\nlr: '2e-3'\nschedule: constant\nlog-every: 0\nrslora: true\n"
                           "recompute: false\n" % (model, self.data))
        out = os.path.join(self.work, "from-config")
        proc = run(train, "--config", config, "--out", out, "--steps", "3", "--export", out + "/adapter")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = [json.loads(line) for line in read_lines(os.path.join(out, "metrics.jsonl"))]
        self.assertEqual([line["lr"] for line in lines], [2e-3] * 3)
        self.assertTrue(read_json(out + "/adapter/adapter_config.json")["use_rslora"])
        for text, wanted in (("lr: 1e-3\nlearning_rate: 2\n", ":2: learning-rate: expected a trainer setting"),
                             ("optimizer:\n  name: adamw\n", ":1: optimizer: expected a trainer setting"),
                             ("lr:\n  - 1\n", ":1: lr: expected one scalar value on the line"),
                             ("steps: 1\n  batch: 2\n", ":2: --config: expected `key: value` at the start"),
                             ("rslora: maybe\n", ":1: rslora: expected true or false"),
                             ("lr: 1\nlr: 2\n", ":2: lr: expected each setting once")):
            with self.subTest(config=text):
                write_text(config, text)
                proc = run(train, "--config", config, "--out", os.path.join(self.work, "bad-config"))
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(config + wanted, proc.stderr)
        write_text(config, "sed: 1\n")
        proc = run(train, "--config", config, "--out", os.path.join(self.work, "bad-config"))
        self.assertIn("did you mean 'seed'?", proc.stderr)
        proc = run(train, "--out", os.path.join(self.work, "bad-config"), "--eval-evry", "3")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("did you mean --eval-every?", proc.stderr)

    def test_profile_writes_a_trace_and_a_breakdown_by_kind(self):
        # --profile N: a Chrome trace and the time by kind of work, with the
        # runtime's scopes (loss, router, optimizer) found in it; the profiled
        # run's numbers are those of an unprofiled one.
        model, train = self.build("qwen3_moe")
        args = ["--model", model, "--data", self.data, "--steps", "3", "--batch", "2", "--seq-len", "32",
                "--lr", "1e-2", "--log-every", "0", "--seed", "3"]
        plain = os.path.join(self.work, "unprofiled")
        proc = run(train, "--out", plain, *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out = os.path.join(self.work, "profiled")
        proc = run(train, "--out", out, "--profile", "2", *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("profile of steps 2-3", proc.stderr)
        self.assertEqual(losses(out), losses(plain))
        with open(os.path.join(out, "profile", "trace.json")) as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        for scope in ("adapt::lm_head_loss", "adapt::moe.route", "adapt::optimizer"):
            self.assertIn(scope, names)
        with open(os.path.join(out, "profile", "breakdown.json")) as f:
            breakdown = json.load(f)
        self.assertEqual(breakdown["steps"], 2)
        kinds = breakdown["seconds_per_step"]
        # (On the CPU experts run as per-expert GEMMs; on CUDA as grouped ones.)
        for kind in ("LM head + loss", "router, top-k, permute", "optimizer", "LoRA GEMMs",
                     "dense GEMMs (projections, dense MLPs)"):
            self.assertGreater(kinds.get(kind, 0), 0, kind)
        self.assertLessEqual(sum(kinds.values()), 1.05 * breakdown["wall_s_per_step"])
        self.assertIn("aten::mm", breakdown["operator_seconds_per_step"])
        with open(os.path.join(out, "profile", "breakdown.md")) as f:
            text = f.read()
        self.assertIn("| LM head + loss |", text)
        self.assertIn("The operators that took the most time", text)
        self.assertEqual(run(train, "--out", out + "-bad", "--profile", "0", *args).returncode, 2)

    def test_sigterm_finishes_the_step_and_checkpoints(self):
        model, train = self.build("qwen3_moe")
        out = os.path.join(self.work, "sigterm")
        proc = subprocess.Popen([train, "--model", model, "--data", self.data, "--out", out, "--steps", "100000",
                                 "--batch", "4", "--seq-len", "32", "--log-every", "0",
                                 "--checkpoint-every", "0"], stderr=subprocess.PIPE, text=True)
        metrics = os.path.join(out, "metrics.jsonl")
        while proc.poll() is None and not (os.path.exists(metrics) and len(read_lines(metrics)) >= 3):
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 130, err)
        state = read_json(os.path.join(out, "checkpoint", "trainer_state.json"))
        self.assertEqual(state["step"], len(losses(out)))

    def test_merge_equals_base_plus_adapter(self):
        model, train = self.build("deepseek_v3")
        out = os.path.join(self.work, "merge")
        proc = run(train, "--model", model, "--data", self.data, "--out", out, *TRAIN,
                   "--merge", out + "/merged", "--export", out + "/adapter")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        index = read_json(out + "/merged/model.safetensors.index.json")
        source = read_json(model + "/model.safetensors.index.json")
        self.assertEqual(sorted(index["weight_map"]), sorted(source["weight_map"]))
        if PYTHON:
            proc = run(PYTHON, "-c", MERGED, model, out + "/adapter", out + "/merged")
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            result = eval(proc.stdout.strip().splitlines()[-1])
            self.assertTrue(result["keys_equal"])
            self.assertGreater(result["changed"], 10, "merge left the adapted weights unchanged")
            # The merged shards keep bf16 (relative rounding 2^-9 = 2e-3): measured
            # 3.2e-3 worst per tensor (max error over max value); 1e-2 is 3.1x that,
            # and an unmerged or doubly merged adapter is off by its scale (~1e-1).
            print(f"merged vs PEFT's merge {result['worst']:.2e} (bound 1e-2)", file=sys.stderr, flush=True)
            self.assertLess(result["worst"], 1e-2, "merged weights differ from PEFT's merge")

    # -- bad input and faults ------------------------------------------------

    def broken_copy(self, name):
        model, _ = self.build("qwen3_moe")
        copy = os.path.join(self.work, name)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(model, copy)
        return copy

    def expect_failure(self, code, *args, needle):
        _, train = self.build("qwen3_moe")
        out = tempfile.mkdtemp(dir=self.work)
        given = dict(zip(args[::2], args[1::2]))
        defaults = {"--data": self.data, "--steps": "3", "--batch": "2", "--seq-len": "16", "--log-every": "0"}
        flags = [x for k, v in {**defaults, **given}.items() for x in (k, v)]
        proc = run(train, "--out", out, *flags)
        self.assertEqual(proc.returncode, code, proc.stderr)
        self.assertIn("error:", proc.stderr)
        self.assertIn(needle, proc.stderr)
        self.assertNotIn("terminate called", proc.stderr)
        return out, proc.stderr

    def test_missing_shard(self):
        copy = self.broken_copy("missing-shard")
        os.remove(os.path.join(copy, "model-00002-of-00002.safetensors"))
        self.expect_failure(2, "--model", copy, needle="model-00002-of-00002.safetensors")

    def test_truncated_shard(self):
        copy = self.broken_copy("truncated-shard")
        shard = os.path.join(copy, "model-00001-of-00002.safetensors")
        os.truncate(shard, os.path.getsize(shard) - 100)
        self.expect_failure(2, "--model", copy, needle="model-00001-of-00002.safetensors")

    def test_tensor_shape_disagrees_with_config(self):
        copy = self.broken_copy("bad-shape")
        shard = os.path.join(copy, "model-00001-of-00002.safetensors")
        with open(shard, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            body = f.read()
        name = next(k for k in header if k.endswith("q_proj.weight"))
        rows, cols = header[name]["shape"]
        header[name]["shape"] = [cols, rows] if rows != cols else [rows * 2, cols // 2]
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(shard, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw + body)
        self.expect_failure(2, "--model", copy, needle=name)

    def test_token_beyond_vocabulary(self):
        model, _ = self.build("qwen3_moe")
        bad = os.path.join(self.work, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps({"input_ids": list(range(40))}) + "\n")
            f.write(json.dumps({"input_ids": [1, 2, VOCAB + 7, 3] * 10}) + "\n")
        self.expect_failure(2, "--model", model, "--data", bad, needle=str(VOCAB + 7))

    def test_nan_loss_stops_and_keeps_the_last_checkpoint(self):
        model, _ = self.build("qwen3_moe")
        out, err = self.expect_failure(5, "--model", model, "--lr", "1e30", "--grad-clip", "0",
                                       "--steps", "20", "--checkpoint-every", "1", needle="NaN")
        state = read_json(os.path.join(out, "checkpoint", "trainer_state.json"))
        self.assertIn(f"step {state['step']}", err)

    def test_resume_never_starts_over_or_overwrites(self):
        """Issue 14: --resume without a complete checkpoint exits 2; a checkpoint
        folder missing its trainer_state.json is never written over."""
        model, _ = self.build("qwen3_moe")
        _, train = self.build("qwen3_moe")
        fresh = os.path.join(self.work, "nothing-to-resume")
        proc = run(train, "--model", model, "--out", fresh, "--data", self.data, "--steps", "2", "--resume")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("expected a checkpoint to resume from", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(fresh, "metrics.jsonl")), "a run started anyway")
        out = os.path.join(self.work, "broken-checkpoint")
        proc = run(train, "--model", model, "--out", out, "--data", self.data, "--steps", "2", "--batch", "2",
                   "--seq-len", "16", "--log-every", "0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        os.remove(os.path.join(out, "checkpoint", "trainer_state.json"))
        before = {name: read_bytes(os.path.join(out, "checkpoint", name))
                  for name in os.listdir(os.path.join(out, "checkpoint"))}
        for flags in (["--resume"], ["--model", model, "--data", self.data, "--steps", "4", "--batch", "2",
                                     "--seq-len", "16"]):
            proc = run(train, "--out", out, *flags)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("trainer_state.json is missing", proc.stderr)
            after = {name: read_bytes(os.path.join(out, "checkpoint", name))
                     for name in os.listdir(os.path.join(out, "checkpoint"))}
            self.assertEqual(before, after, "the checkpoint folder was changed")

    def test_changed_checkpoint_or_data_is_noticed(self):
        """Issue 14: a flipped bit or an edited step in a checkpoint is refused
        (SHA256SUMS), and data changed at the same size is warned about."""
        model, train = self.build("qwen3_moe")
        base = os.path.join(self.work, "digests")
        proc = run(train, "--model", model, "--out", base, "--data", self.data, "--steps", "2", "--batch", "2",
                   "--seq-len", "16", "--log-every", "0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for name, edit in (("adapters.safetensors", lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:]),
                           ("trainer_state.json", lambda b: b.replace(b'"step": 2', b'"step": 1'))):
            with self.subTest(file=name):
                out = os.path.join(self.work, "digests-" + name)
                shutil.copytree(base, out)
                path = os.path.join(out, "checkpoint", name)
                data = read_bytes(path)
                self.assertNotEqual(edit(data), data)
                with open(path, "wb") as f:
                    f.write(edit(data))
                proc = run(train, "--out", out, "--resume", "--steps", "4")
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(name, proc.stderr)
                self.assertIn("SHA-256", proc.stderr)
        # Same size, other tokens: the resumed run warns.
        changed = os.path.join(self.work, "changed-data.jsonl")
        write_text(changed, "".join(reversed(read_lines(self.data))))  # same documents, other order
        self.assertEqual(os.path.getsize(changed), os.path.getsize(self.data))
        out = os.path.join(self.work, "digests-data")
        shutil.copytree(base, out)
        proc = run(train, "--out", out, "--resume", "--steps", "4", "--data", changed)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("the data or packing differs", proc.stderr)

    def test_full_disk_at_checkpoint_keeps_the_previous_one(self):
        model, _ = self.build("qwen3_moe")
        env = dict(os.environ, ADAPT_TEST_FAIL_CHECKPOINT_AT_STEP="4")
        _, train = self.build("qwen3_moe")
        out = os.path.join(self.work, "full-disk")
        proc = run(train, "--model", model, "--out", out, "--data", self.data, "--steps", "6", "--batch", "2",
                   "--seq-len", "16", "--log-every", "0", "--checkpoint-every", "2", env=env)
        self.assertEqual(proc.returncode, 6, proc.stderr)
        self.assertIn("previous checkpoint (step 2) is intact", proc.stderr)
        state = read_json(os.path.join(out, "checkpoint", "trainer_state.json"))
        self.assertEqual(state["step"], 2)
        proc = run(train, "--out", out, "--resume")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(len(losses(out)), 6)


if __name__ == "__main__":
    ADAPT = sys.argv.pop(1)
    unittest.main(verbosity=2)
