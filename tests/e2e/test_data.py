#!/usr/bin/env python3
"""`adapt data`: text, chat and prompt/completion records tokenized with the
model's own tokenizer and chat template (as transformers renders it), the loss
only on assistant/completion tokens, pre-tokenized records checked and kept,
bad records named by line (or counted with --skip-bad). The tokenizer is a
small byte-level BPE trained here with the `tokenizers` library. Then the
README's main job on text: the tiny model's own tokenizer, Genesis, an eval
set, and PEFT generating with the trained adapter."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ADAPT = sys.argv[1] if len(sys.argv) > 1 else "build/bin/adapt"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.environ.get("ADAPT_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Thank you."}, {"role": "assistant", "content": "You are welcome."}]
MAKE_TOKENIZER = r'''
import json, os, sys
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
out, template = sys.argv[1], sys.argv[2]
text = ["The quick brown fox jumps over the lazy dog.", "Hello, how are you today?", "I am fine, thank you.",
        "What is the capital of France?", "Paris is the capital of France. You are welcome."] * 20
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=[
    "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(os.path.join(out, "tokenizer.json"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "unk_token": "<unk>", "chat_template": template}, open(os.path.join(out, "tokenizer_config.json"), "w"))
'''
REFERENCE = r'''
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
chat = json.loads(sys.argv[2])
print(json.dumps({
    "text": tok("The quick brown fox.")["input_ids"] + [tok.eos_token_id],
    "chat": tok.apply_chat_template(chat, tokenize=False),
    "chat_ids": tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"],
    "prompt": tok("Hello, ")["input_ids"],
    "decode": {}, "eos": tok.eos_token_id}))
'''


def run(*args):
    return subprocess.run([ADAPT, "data"] + list(args), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ADAPT_PYTHON=PYTHON))


def decode(model, ids):
    code = "import sys, json\nfrom transformers import AutoTokenizer\n" \
           "print(AutoTokenizer.from_pretrained(sys.argv[1]).decode(json.loads(sys.argv[2])))"
    return subprocess.run([PYTHON, "-c", code, model, json.dumps(ids)], capture_output=True, text=True,
                          check=True).stdout[:-1]


@unittest.skipUnless(os.path.exists(PYTHON), "needs the reference venv (scripts/setup.sh)")
class Data(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "model")
        os.makedirs(cls.model)
        subprocess.run([PYTHON, "-c", MAKE_TOKENIZER, cls.model, TEMPLATE], check=True, timeout=120)
        cls.ref = json.loads(subprocess.run([PYTHON, "-c", REFERENCE, cls.model, json.dumps(CHAT)], check=True,
                                            capture_output=True, text=True, timeout=120).stdout)
        cls.data = os.path.join(cls.tmp.name, "data.jsonl")
        with open(cls.data, "w") as f:
            for record in ({"text": "The quick brown fox."}, {"messages": CHAT},
                           {"prompt": "Hello, ", "completion": "how are you?"}, {"input_ids": [5, 6, 7]}):
                f.write(json.dumps(record) + "\n")
        cls.out = os.path.join(cls.tmp.name, "out.jsonl")
        cls.proc = run(cls.data, "--model", cls.model, "--out", cls.out)
        with open(cls.out) as f:
            cls.records = [json.loads(line) for line in f]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_text_is_learned_whole(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        text = self.records[0]
        self.assertEqual(text["input_ids"], self.ref["text"])
        self.assertEqual(text["labels"], text["input_ids"])

    def test_chat_is_rendered_as_transformers_does_and_only_assistant_turns_learned(self):
        chat = self.records[1]
        self.assertEqual(chat["input_ids"], self.ref["chat_ids"])
        learned = [t for t in chat["labels"] if t != -100]
        self.assertEqual(decode(self.model, learned), "Paris.<|im_end|>\nYou are welcome.<|im_end|>\n")
        masked = [t for t, l in zip(chat["input_ids"], chat["labels"]) if l == -100]
        self.assertIn("What is the capital of France?", decode(self.model, masked))

    def test_prompt_is_masked_and_completion_learned(self):
        pc = self.records[2]
        self.assertEqual(pc["labels"][:len(self.ref["prompt"])], [-100] * len(self.ref["prompt"]))
        learned = [t for t in pc["labels"] if t != -100]
        self.assertEqual(decode(self.model, learned), "how are you?<|im_end|>")

    def test_token_ids_are_kept(self):
        self.assertEqual(self.records[3], {"input_ids": [5, 6, 7], "labels": [5, 6, 7]})
        self.assertIn("4 records", self.proc.stdout)

    def test_bad_records_are_named_or_counted(self):
        bad = os.path.join(self.tmp.name, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps({"text": "fine"}) + "\n\n" + json.dumps({"messages": "oops"}) + "\n")
            f.write(json.dumps({"input_ids": [1, 99999]}) + "\n")
        out = os.path.join(self.tmp.name, "bad-out.jsonl")
        proc = run(bad, "--model", self.model, "--out", out)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(proc.stderr.strip(), f"adapt: error: {bad}:3: messages: expected a non-empty array of "
                                              "{\"role\", \"content\"}")
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".tmp"), "no partial output")
        proc = run(bad, "--model", self.model, "--out", out, "--skip-bad")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("skipped 2 bad records", proc.stdout)
        self.assertIn(f"{bad}:4: skipped: input_ids[1]: expected a token id in [0, 300)", proc.stderr)

    def test_a_model_without_tokenizer_is_refused(self):
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty, exist_ok=True)
        proc = run(self.data, "--model", empty, "--out", os.path.join(self.tmp.name, "x.jsonl"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("tokenizer.json", proc.stderr)
        proc = run(self.data, "--out", os.path.join(self.tmp.name, "x.jsonl"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--model", proc.stderr)


GENERATE = r'''
import json, sys, torch, peft
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, adapter = sys.argv[1:3]
tok = AutoTokenizer.from_pretrained(model_dir)
model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)
torch.manual_seed(0)
prompt = tok("And God said", return_tensors="pt").input_ids
out = model.generate(prompt, max_new_tokens=24, do_sample=True, top_k=20)
chat = [{"role": "user", "content": "Who was Abraham?"}, {"role": "assistant", "content": "The father of Isaac."}]
print(json.dumps({"prompt": prompt.shape[1], "ids": out[0].tolist(), "text": tok.decode(out[0]),
                  "chat": tok.apply_chat_template(chat, tokenize=False)}))
'''


@unittest.skipUnless(os.path.exists(PYTHON), "needs the reference venv (scripts/setup.sh)")
class MainJob(unittest.TestCase):
    def test_text_to_a_trained_adapter_that_peft_generates_with(self):
        """The README's main job, shorter: a tiny model with its own tokenizer,
        Genesis as text, an eval set; the eval loss falls well below the
        untrained adapter's, and PEFT loads the best adapter and generates."""
        with tempfile.TemporaryDirectory() as tmp:
            model, trainer = os.path.join(tmp, "tiny"), os.path.join(tmp, "trainer")
            proc = subprocess.run([ADAPT, "tiny", "qwen3_moe", "--out", model], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            for name in ("train", "eval"):
                proc = run(os.path.join(ROOT, "examples", "genesis", name + ".jsonl"), "--model", model,
                           "--out", os.path.join(tmp, name + ".jsonl"))
                self.assertEqual(proc.returncode, 0, proc.stderr)
            proc = subprocess.run([ADAPT, "build", model, "--out", trainer], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stdout[-2000:] + proc.stderr[-2000:])
            run_dir = os.path.join(tmp, "run")
            proc = subprocess.run([os.path.join(trainer, "train"), "--data", os.path.join(tmp, "train.jsonl"),
                                   "--eval-data", os.path.join(tmp, "eval.jsonl"), "--out", run_dir,
                                   "--epochs", "3", "--batch", "8", "--seq-len", "128", "--lr", "2e-2",
                                   "--warmup", "20", "--lora-rank", "32", "--lora-alpha", "64",
                                   "--eval-every", "100", "--log-every", "0"],
                                  capture_output=True, text=True, timeout=600)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                lines = [json.loads(line) for line in f]
            untrained = lines[0]["eval_loss_untrained"]
            evals = [line["eval_loss"] for line in lines if "eval_loss" in line]
            # Measured: 6.04 untrained, 4.16 after 3 epochs; a model that learns nothing stays near 6.
            self.assertLess(evals[-1], untrained - 1.0, (untrained, evals))
            proc = subprocess.run([PYTHON, "-c", GENERATE, model, os.path.join(run_dir, "best-adapter")],
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
            out = json.loads(proc.stdout.splitlines()[-1])
            self.assertEqual(len(out["ids"]) - out["prompt"], 24, "PEFT generated fewer tokens than asked")
            self.assertTrue(out["text"].startswith("And God said"), out["text"])
            self.assertEqual(out["chat"], "<|im_start|>user\nWho was Abraham?<|im_end|>\n"
                                          "<|im_start|>assistant\nThe father of Isaac.<|im_end|>\n")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
