#!/usr/bin/env python3
"""Bad inputs: exit 2 with one message naming the file and the field; never
a crash, a hang or another exit code."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ADAPT = sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "models", "tiny-qwen3-moe")


def gaps(path, out):
    return subprocess.run([ADAPT, "gaps", path, "--out", out], capture_output=True,
                          text=True, timeout=60)


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.model = os.path.join(self.tmp, "model")
        shutil.copytree(TINY, self.model)
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def expect_bad(self, *needles):
        proc = gaps(self.model, self.out)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        for needle in needles:
            self.assertIn(needle, proc.stderr)

    def edit_config(self, fn):
        path = os.path.join(self.model, "config.json")
        with open(path) as f:
            config = json.load(f)
        fn(config)
        with open(path, "w") as f:
            json.dump(config, f)

    def test_tiny_model_is_fine(self):
        proc = gaps(self.model, self.out)
        self.assertIn(proc.returncode, (0, 3), proc.stderr)
        with open(os.path.join(self.out, "gaps.json")) as f:
            report = json.load(f)
        self.assertEqual(report["manifest"]["issues"], [])
        self.assertEqual(report["manifest"]["headers_read"], 2)

    def test_every_command_answers_help(self):
        for command in ("inspect", "gaps", "tiny", "build", "validate", "serve", "generate", "review", "plan"):
            with self.subTest(command=command):
                proc = subprocess.run([ADAPT, command, "--help"], capture_output=True, text=True, timeout=30)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertIn("adapt " + command, proc.stdout)

    def test_a_mistyped_command_gets_a_suggestion(self):
        proc = subprocess.run([ADAPT, "bulid", self.model], capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("did you mean 'build'?", proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        proc = subprocess.run([ADAPT, "frobnicate"], capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertNotIn("did you mean", proc.stderr)

    def test_malformed_config_json(self):
        with open(os.path.join(self.model, "config.json"), "w") as f:
            f.write('{"hidden_size": 64,')
        self.expect_bad("config.json", "valid JSON")

    def test_missing_config(self):
        os.remove(os.path.join(self.model, "config.json"))
        self.expect_bad("config.json")

    def test_wrong_type(self):
        self.edit_config(lambda c: c.update(num_experts="many"))
        self.expect_bad("config.json", "num_experts", "integer")

    def test_manifest_disagrees_with_config(self):
        self.edit_config(lambda c: c.update(moe_intermediate_size=48))
        self.expect_bad("model.safetensors.index.json")

    def test_missing_shard(self):
        os.remove(os.path.join(self.model, "model-00002-of-00002.safetensors"))
        self.expect_bad("model-00002-of-00002.safetensors")

    def test_truncated_header(self):
        path = os.path.join(self.model, "model-00001-of-00002.safetensors")
        with open(path, "r+b") as f:
            f.truncate(20)
        self.expect_bad("model-00001-of-00002.safetensors")

    def test_header_length_past_end_of_file(self):
        path = os.path.join(self.model, "model-00001-of-00002.safetensors")
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", 1 << 40))
        self.expect_bad("model-00001-of-00002.safetensors")

    def test_unknown_dtype(self):
        path = os.path.join(self.model, "model-00001-of-00002.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = data[8:8 + n].replace(b'"BF16"', b'"Q777"', 1)
        with open(path, "wb") as f:
            f.write(data[:8] + header + data[8 + n:])
        self.expect_bad("model-00001-of-00002.safetensors", "Q777")

    def test_malformed_manifest(self):
        with open(os.path.join(self.model, "model.safetensors.index.json"), "w") as f:
            f.write('{"weight_map": [1, 2]}')
        self.expect_bad("model.safetensors.index.json", "weight_map")

    # -- hostile configs (issue 14): each a clear exit 2 within the timeout,
    # never a stack overflow, unbounded memory or a negative count.

    def test_deeply_nested_unknown_key(self):
        path = os.path.join(self.model, "config.json")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.rstrip()[:-1] + ', "adversary": ' + "[" * 100000 + "]" * 100000 + "}")
        self.expect_bad("config.json", "nesting")

    def test_huge_counts_and_widths(self):
        for key, value in (("num_experts", 10 ** 12), ("hidden_size", 3 * 10 ** 9),
                           ("moe_intermediate_size", 3 * 10 ** 9), ("vocab_size", 10 ** 15)):
            with self.subTest(key=key):
                shutil.copy(os.path.join(TINY, "config.json"), os.path.join(self.model, "config.json"))
                self.edit_config(lambda c: c.update({key: value}))
                self.expect_bad("config.json", "expected at most", str(value))

    def test_oversized_config(self):
        self.edit_config(lambda c: c.update(padding="x" * (20 << 20)))
        self.expect_bad("config.json", "MiB")

    def replace_file(self, name, make):
        """Removes the model's file NAME and lets make(path) put something else in its place."""
        path = os.path.join(self.model, name)
        os.remove(path)
        make(path)

    def test_special_file_as_config(self):
        self.replace_file("config.json", lambda path: os.symlink("/dev/zero", path))
        self.expect_bad("config.json", "regular file")
        self.replace_file("config.json", os.mkfifo)
        self.expect_bad("config.json", "regular file")

    def test_special_file_as_index(self):
        self.replace_file("model.safetensors.index.json", lambda path: os.symlink("/dev/zero", path))
        self.expect_bad("model.safetensors.index.json", "regular file")

    def test_shard_header_disagrees_with_the_index(self):
        """The index puts a tensor in shard 1; shard 1's header calls it something else."""
        path = os.path.join(self.model, "model-00001-of-00002.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        name = next(k for k in header if k != "__metadata__")
        header["x" + name[1:]] = header.pop(name)
        raw = json.dumps(header).encode()
        raw += b" " * (n - len(raw)) if len(raw) <= n else b""
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
        self.expect_bad("model.safetensors.index.json", name, "header")

    def test_nonexistent_path_and_bad_usage(self):
        proc = gaps(os.path.join(self.tmp, "nothing"), self.out)
        self.assertEqual(proc.returncode, 2)
        proc = subprocess.run([ADAPT, "gaps", self.model], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--out", proc.stderr)
        proc = subprocess.run([ADAPT, "frobnicate", self.model], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)

    def test_flag_errors_name_the_flag_and_exit_2(self):
        """Every command parses its flags the same way (llvm::cl): a missing
        value, a value of the wrong type, an unknown flag and a value out of
        range are each one "adapt: error:" naming the flag, exit 2."""
        cases = [(["gaps", self.model, "--out"], "--out"),
                 (["tiny", "qwen3_moe", "--out", self.out, "--seed", "x"], "--seed"),
                 (["build", self.model, "--out", self.out, "--lora-rank", "0"], "--lora-rank"),
                 (["plan", self.model, "--gpus", "many"], "--gpus"),
                 (["validate", self.model, "--frobnicate"], "--frobnicate"),
                 (["generate", self.model, "--out", self.out, "--retries", "99"], "--retries")]
        for args, flag in cases:
            proc = subprocess.run([ADAPT, *args], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("adapt: error:", proc.stderr, args)
            self.assertIn(flag, proc.stderr, args)

    def test_at_arguments_are_not_read_as_response_files(self):
        """llvm::cl would expand "@FILE" into FILE's words and echo them in its
        errors; a client of `adapt serve` could name any readable file so."""
        secret = os.path.join(self.tmp, "secret.txt")
        with open(secret, "w") as f:
            f.write("TOPSECRET --frobnicate\n")
        for args in (["gaps", "@" + secret, "--out", self.out],
                     ["build", self.model, "--out", self.out, "@" + secret]):
            proc = subprocess.run([ADAPT, *args], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("response file", proc.stderr)
            self.assertNotIn("TOPSECRET", proc.stdout + proc.stderr)
            self.assertNotIn("frobnicate", proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
