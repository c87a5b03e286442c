#!/usr/bin/env python3
"""Parallel LoRA training on CPU processes (gloo), like a cluster job runs it.

The parallel stage of the validation ladder (`adapt validate --stage
parallel`): EP2, DP2, DP2xEP2, TP2, TP2xEP2, PP2, PP2xDP2, CP2 and CP2 with
per-layer recomputation (CP2+recompute) against one
process on representative families (every tiny family, and TP2xPP2xEP2, with
ADAPT_TEST_TIER=full). Then, on one trainer: torchrun's and Slurm's variables
form the groups; bad layouts exit 2 naming the flag before any weight is
read; runs saved with EP2, PP2 and CP2 resume alone on the same curve; and a
killed rank makes the others stop with exit 7 within --dist-timeout, after
which the last checkpoint resumes.

usage: test_parallel.py ADAPT_BINARY
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from testutil import FAMILIES, read_json, run

ADAPT = None
FAST_FAMILIES = ["qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next"]
# Families with delta-rule layers, whose TP gradients get a wider, measured bound.
DELTA_RULE_FAMILIES = {"qwen3_next", "kimi_linear"}
TRAIN = ["--seq-len", "32", "--lr", "1e-2", "--log-every", "0", "--device", "cpu"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(train, world, args, env_style="torchrun", timeout=600):
    """WORLD processes of TRAIN with a launcher's variables; returns
    [(exit code, stderr)] per rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID")}
        if env_style == "torchrun":
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        else:
            env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank),
                       SLURM_NODELIST="localhost", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([train, *map(str, args)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return [(p.wait(timeout=timeout), p.communicate()[1]) for p in procs]


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


class ParallelStage(unittest.TestCase):
    """`adapt validate --stage parallel` passes every layout it runs."""

    def test_layouts_match_one_process(self):
        families = FAMILIES if os.environ.get("ADAPT_TEST_TIER") == "full" else FAST_FAMILIES
        work = tempfile.mkdtemp(prefix="adapt-parallel-")
        try:
            for family in families:
                with self.subTest(family=family):
                    model = os.path.join(work, family)
                    self.assertEqual(run(ADAPT, "tiny", family, "--out", model).returncode, 0)
                    out = os.path.join(work, family + "-val")
                    print(f"[{family}] parallel stage", file=sys.stderr, flush=True)
                    # CP2+recompute: every layer's context exchange (gathered keys,
                    # the delta rule's passed state, lightning's gathered states)
                    # runs again inside its recomputation in the backward pass.
                    layouts = ["EP2", "DP2", "DP2xEP2", "TP2", "TP2xEP2", "PP2", "PP2xDP2", "CP2", "CP2+recompute"]
                    if os.environ.get("ADAPT_TEST_TIER") == "full":
                        layouts.append("TP2xPP2xEP2")  # 8 processes
                    proc = run(ADAPT, "validate", model, "--stage", "parallel", "--out", out,
                               "--layouts", ",".join(layouts), timeout=1800)
                    self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                    record = read_json(os.path.join(out, "parallel-stage.json"))
                    self.assertTrue(record["passed"])
                    status = {r["layout"]: r for r in record["layouts"]}
                    for layout in layouts:
                        r = status[layout]
                        # Every layout applies to every tiny family (none refused).
                        self.assertEqual(r["status"], "passed", r)
                        self.assertLessEqual(r["loss_error"], 1e-6)
                        bound = max(3e-5 if "TP" in layout and family in DELTA_RULE_FAMILIES
                                    else 1e-5 if "CP" in layout else 3e-6 if "TP" in layout else 1e-6,
                                    3 * r["micro_batches_vs_one_batch"])
                        self.assertAlmostEqual(r["gradient_bound"], bound, delta=bound * 1e-9)
                        self.assertLessEqual(r["gradient_error"], bound)
                        self.assertTrue(r["adapter_exact"])
                        if layout in ("DP2", "PP2"):  # same sums, same grouping: bitwise
                            self.assertEqual(r["gradient_error"], 0.0)
                        print(f"[{family}] {layout}: loss {r['loss_error']:.2e} (bound 1e-6), "
                              f"gradients {r['gradient_error']:.2e} (bound {bound:.2e})", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)


class Launch(unittest.TestCase):
    """One trainer (tiny qwen3_moe: 8 experts, 2 layers, 4 heads / 2 KV)."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="adapt-launch-")
        cls.model = os.path.join(cls.work, "model")
        assert run(ADAPT, "tiny", "qwen3_moe", "--out", cls.model).returncode == 0
        proc = run(ADAPT, "build", cls.model, "--out", os.path.join(cls.work, "project"))
        assert proc.returncode == 0, proc.stderr
        cls.train = os.path.join(cls.work, "project", "train")
        cls.data = os.path.join(cls.work, "data.jsonl")
        with open(cls.data, "w") as f:
            for doc in range(64):
                token, ids = (doc * 37) % 256, []
                for _ in range(48):
                    ids.append(token)
                    token = (token * 5 + 3) % 256
                f.write(json.dumps({"input_ids": ids}) + "\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def args(self, out, steps, *extra):
        return ["--model", self.model, "--data", self.data, "--out", out, "--steps", steps, "--batch", 4,
                *TRAIN, *extra]

    def test_torchrun_and_slurm_form_the_groups(self):
        for style in ("torchrun", "slurm"):
            out = os.path.join(self.work, "groups-" + style)
            results = launch(self.train, 2, self.args(out, 2, "--ep", 2), style)
            for rank, (code, err) in enumerate(results):
                self.assertEqual(code, 0, err)
                self.assertIn(f"rank {rank} of 2 ({style}, TP1xCP1xEP2xDP1xPP1): data rank {rank}, "
                              f"expert rank {rank}", err)
            metrics = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
            self.assertEqual(len(metrics), 2)  # rank 0 alone writes
            self.assertEqual(metrics[0]["layout"], "TP1xCP1xEP2xDP1xPP1")
            self.assertIn("alltoall_s", metrics[0])
            self.assertEqual(sum(metrics[0]["expert_load"][0]), 4 * 32 * 2)  # every token, top-2
            self.assertEqual(len(metrics[0]["expert_load_per_ep_rank"][0]), 2)
            self.assertEqual(sum(metrics[0]["expert_load_per_ep_rank"][0]), 4 * 32 * 2)
            self.assertEqual(len(metrics[0]["peak_host_gib"]), 2)
            self.assertTrue(all(0 < m < 64 for m in metrics[0]["peak_host_gib"]))
            with open(os.path.join(out, "report.html")) as f:
                page = f.read()
            for needle in ("<svg", "loss", "collectives per step", "expert load per expert-parallel rank",
                           "peak host memory per rank"):
                self.assertIn(needle, page)

    def test_bad_layouts_exit_2_before_any_weight_is_read(self):
        broken = os.path.join(self.work, "broken-model")
        shutil.copytree(self.model, broken, dirs_exist_ok=True)
        for name in os.listdir(broken):
            if name.endswith(".safetensors"):
                os.remove(os.path.join(broken, name))  # a weight read would fail with another message
        out = os.path.join(self.work, "bad")
        cases = [
            (1, ["--ep", "2"], "--tp/--ep/--pp/--dp/--cp", "product is the world size 1"),
            (2, ["--ep", "3"], "--tp/--ep/--pp/--dp/--cp", "world size 2"),
            (3, ["--ep", "3"], "--ep", "8 experts"),
            (3, ["--tp", "3"], "--tp", "4 heads"),
            (2, ["--pp", "4", "--dp", "1"], "--tp/--ep/--pp/--dp/--cp", "world size 2"),
            (4, ["--pp", "4"], "--pp", "2 layers"),
            (2, ["--dp", "2", "--batch", "3"], "--batch", "divisible"),
            (3, ["--cp", "3"], "--cp", "sequence length 32"),
        ]
        for world, flags, flag, needle in cases:
            batch = [] if "--batch" in flags else ["--batch", 4]
            args = ["--model", broken, "--data", self.data, "--out", out, "--steps", 1, *batch, *TRAIN, *flags]
            if world == 1:
                proc = run(self.train, *args)
                results = [(proc.returncode, proc.stderr)]
            else:
                results = launch(self.train, world, args, timeout=120)
            for code, err in results:
                self.assertEqual(code, 2, (flags, err))
                self.assertIn(flag + ":", err, flags)
                self.assertIn(needle, err, flags)
                self.assertNotIn("safetensors", err, flags)

    def test_parallel_checkpoints_resume_alone(self):
        # Every run stops at 3 and resumes to 6 (the same learning-rate schedule).
        whole = os.path.join(self.work, "whole")
        proc = run(self.train, *self.args(whole, 3))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = run(self.train, *self.args(whole, 6), "--resume")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for name, flags in (("ep", ["--ep", 2]), ("pp", ["--pp", 2, "--micro-batches", 2]), ("cp", ["--cp", 2])):
            with self.subTest(layout=name):
                split = os.path.join(self.work, "split-" + name)
                for code, err in launch(self.train, 2, self.args(split, 3, *flags)):
                    self.assertEqual(code, 0, err)
                if name == "pp":
                    line = json.loads(open(os.path.join(split, "metrics.jsonl")).readline())
                    self.assertEqual(line["layout"], "TP1xCP1xEP1xDP1xPP2")
                    self.assertGreaterEqual(line["pipeline_wait_s"], 0.0)
                    # Stage 1's expert counts reach rank 0's metrics: every token, top-2.
                    self.assertEqual([sum(layer) for layer in line["expert_load"]], [4 * 32 * 2] * 2)
                proc = run(self.train, *self.args(split, 6), "--resume")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                # The same 6-step curve: 3 parallel steps, then 3 alone from its checkpoint.
                for a, b in zip(losses(whole), losses(split)):
                    self.assertLess(abs(a - b) / abs(a), 1e-5, (losses(whole), losses(split)))
                self.assertEqual(len(losses(split)), 6)

    def test_killed_rank_stops_every_rank_and_the_checkpoint_resumes(self):
        out = os.path.join(self.work, "killed")
        port = free_port()
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [self.train, *map(str, self.args(out, 400, "--dp", 2, "--checkpoint-every", 2,
                                                  "--dist-timeout", 30))],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 300
        state = os.path.join(out, "checkpoint", "trainer_state.json")
        while not os.path.exists(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertTrue(os.path.exists(state), "no checkpoint before the kill")
        procs[1].send_signal(signal.SIGKILL)
        started = time.monotonic()
        code = procs[0].wait(timeout=120)
        err = procs[0].communicate()[1]
        procs[1].communicate()
        self.assertEqual(code, 7, err)
        self.assertIn("another rank failed or timed out", err)
        self.assertLess(time.monotonic() - started, 60)
        saved = read_json(state)["step"]
        self.assertGreaterEqual(saved, 2)
        proc = run(self.train, *self.args(out, saved + 2), "--resume")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(len(losses(out)), saved + 2)


if __name__ == "__main__":
    ADAPT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt")
    unittest.main(argv=sys.argv[:1], verbosity=2)
