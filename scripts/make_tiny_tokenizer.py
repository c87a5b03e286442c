#!/usr/bin/env python3
"""Trains the tiny models' tokenizer (models/tiny/tokenizer.json), which `adapt tiny` writes
beside every tiny model so that transformers loads it with AutoTokenizer and `adapt data`
tokenizes text for it.

A BPE of 256 ids, the tiny models' vocabulary, with the `tokenizers` library: ids 0-4 are
the special tokens <unk>, <|bos|>, <|eos|>, <|im_start|> and <|im_end|> (the chat
template's ChatML markers), then the 95 printable ASCII characters and newline, then the
merges learned from examples/genesis/train.jsonl (King James Version, public domain).
Spaces are kept as the Metaspace marker, so decoding gives the text back.

usage: .venv/bin/python scripts/make_tiny_tokenizer.py   (deterministic; rerun after
changing the corpus, and commit models/tiny/tokenizer.json)
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = ["<unk>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 256


def main():
    with open(os.path.join(ROOT, "examples", "genesis", "train.jsonl")) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\u2581"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert tokenizer.get_vocab_size() <= VOCAB, tokenizer.get_vocab_size()
    assert [tokenizer.token_to_id(t) for t in SPECIAL] == list(range(len(SPECIAL)))
    out = os.path.join(ROOT, "models", "tiny", "tokenizer.json")
    tokenizer.save(out)
    print(f"wrote {out}: {tokenizer.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
