"""Small helpers shared by the end-to-end tests: files are read and written
inside `with` blocks (no ResourceWarning), JSON lines parsed in one place."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "validation", "fixtures")
# Every family `adapt tiny` writes and the runtime trains (README).
FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "kimi_k2", "gpt_oss", "glm4_moe", "minimax_m2", "llama4",
            "minimax", "qwen3_vl_moe", "qwen3_next", "kimi_linear", "deepseek_v32", "glm_moe_dsa"]


def run(*args, **kwargs):
    """A command with its output captured as text; arguments may be numbers."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


def read_json(path):
    """The JSON document in \\p path."""
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


def read_text(path):
    with open(path) as f:
        return f.read()


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_lines(path):
    """The lines of \\p path (a metrics.jsonl being appended to reads whole lines only)."""
    with open(path) as f:
        return f.readlines()


class ScratchTestCase(unittest.TestCase):
    """A test class with a scratch folder, cls.work, made before its first test and removed
    after its last; WORK_PREFIX names it, so a folder left by a crash says whose it is."""
    WORK_PREFIX = "adapt-"

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix=cls.WORK_PREFIX)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)
