#!/usr/bin/env python3
"""`adapt data`: users' data into the trainer's tokenized JSONL (docs/datasets.md).

usage: adapt_data.py IN.jsonl --model DIR --out OUT.jsonl [--format auto|text|chat|prompt_completion|ids]
                     [--max-len N] [--train-on-prompt] [--skip-bad]

Each input line is one record:
  {"text": "..."}                                  raw text: every token is learned
  {"messages": [{"role": ..., "content": ...}]}    chat, rendered with the model's own chat
                                                   template (tokenizer_config.json or
                                                   chat_template.jinja) exactly as transformers'
                                                   apply_chat_template renders it; only the
                                                   assistant turns are learned
  {"prompt": "...", "completion": "..."}           only the completion is learned
  {"input_ids": [...], "labels": [...]}            already tokenized: checked and kept
The output has one {"input_ids": [...], "labels": [...]} per record, labels -100 where the
loss is masked. --train-on-prompt learns every token. Tokenisation is the model's own
tokenizer.json through transformers' AutoTokenizer (the `tokenizers` library).

A bad record is an error naming IN:LINE, the field and what was expected (exit 2); with
--skip-bad it is counted and reported instead. Nothing is dropped silently. The output is
written to OUT.tmp and renamed when complete. Exit codes: 0 done, 2 bad input or usage.
"""
import argparse
import json
import os
import sys

IGNORE = -100


class BadRecord(Exception):
    pass


def load_tokenizer(model_dir):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit("adapt: error: adapt data needs transformers (the reference venv: set ADAPT_PYTHON="
                         ".venv/bin/python, or run scripts/setup.sh)")
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")) and \
            not os.path.exists(os.path.join(model_dir, "tokenizer_config.json")):
        raise SystemExit(f"adapt: error: {model_dir}: tokenizer.json: expected the model's tokenizer "
                         "(tokenizer.json and tokenizer_config.json) in the model folder")
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # a malformed tokenizer file: one line, exit 2
        raise SystemExit(f"adapt: error: {model_dir}: tokenizer: cannot load it: {str(e).splitlines()[0]}")


def kind_of(record, wanted):
    if wanted != "auto":
        return wanted
    for key, kind in (("messages", "chat"), ("prompt", "prompt_completion"), ("text", "text"),
                      ("input_ids", "ids")):
        if key in record:
            return kind
    raise BadRecord("expected one of \"text\", \"messages\", \"prompt\"/\"completion\" or \"input_ids\"")


def need_string(record, key):
    value = record.get(key)
    if not isinstance(value, str):
        raise BadRecord(f"{key}: expected a string, found {type(value).__name__ if key in record else 'nothing'}")
    return value


def encode_text(tok, text):
    ids = tok(text, add_special_tokens=True)["input_ids"]
    if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
        ids = ids + [tok.eos_token_id]
    return ids


def render_chat(tok, messages, add_generation_prompt=False):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_chat(tok, messages, train_on_prompt):
    """ids of the rendered conversation; labels only on assistant turns.

    Each assistant turn's tokens are found by rendering the conversation up to the
    turn before it (with the generation prompt) and up to the turn itself: the
    tokens between the two renderings are the turn's. This holds for any
    template whose rendering of a prefix is a prefix of the whole."""
    if not isinstance(messages, list) or not messages:
        raise BadRecord("messages: expected a non-empty array of {\"role\", \"content\"}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRecord(f"messages[{i}]: expected {{\"role\": string, \"content\": string}}")
    if getattr(tok, "chat_template", None) is None:
        raise BadRecord("messages: the model has no chat template (tokenizer_config.json chat_template or "
                        "chat_template.jinja)")
    full = render_chat(tok, messages)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    if train_on_prompt:
        return ids, list(ids)
    labels = [IGNORE] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok(render_chat(tok, messages[:i], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        upto = tok(render_chat(tok, messages[:i + 1]), add_special_tokens=False)["input_ids"]
        if ids[:len(before)] != before or ids[:len(upto)] != upto:
            raise BadRecord(f"messages[{i}]: the chat template does not render a conversation's prefix as a "
                            "prefix of the whole; use --train-on-prompt")
        for p in range(len(before), len(upto)):
            labels[p] = ids[p]
    if all(l == IGNORE for l in labels):
        raise BadRecord("messages: expected at least one assistant turn to learn")
    return ids, labels


def encode_prompt_completion(tok, record, train_on_prompt):
    prompt, completion = need_string(record, "prompt"), need_string(record, "completion")
    prompt_ids = tok(prompt, add_special_tokens=True)["input_ids"]
    ids = encode_text(tok, prompt + completion)
    if ids[:len(prompt_ids)] != prompt_ids:  # the tokenizer merged across the boundary
        ids = prompt_ids + tok(completion, add_special_tokens=False)["input_ids"]
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
    labels = list(ids) if train_on_prompt else [IGNORE] * len(prompt_ids) + ids[len(prompt_ids):]
    return ids, labels


def encode_ids(record, vocab):
    ids = record.get("input_ids")
    if not isinstance(ids, list) or not ids:
        raise BadRecord("input_ids: expected a non-empty array of token ids")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= vocab:
            raise BadRecord(f"input_ids[{i}]: expected a token id in [0, {vocab}), found {t!r}")
    labels = record.get("labels")
    if labels is None:
        return ids, list(ids)
    if not isinstance(labels, list) or len(labels) != len(ids):
        raise BadRecord(f"labels: expected as many labels as input_ids ({len(ids)})")
    for i, t in enumerate(labels):
        if not isinstance(t, int) or isinstance(t, bool) or not (t == IGNORE or 0 <= t < vocab):
            raise BadRecord(f"labels[{i}]: expected -100 or a token id in [0, {vocab}), found {t!r}")
    return ids, labels


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors and exit code 2."""

    def error(self, message):
        print(f"adapt: error: {message} (adapt data --help)", file=sys.stderr)
        sys.exit(2)


def main():
    ap = Parser(prog="adapt data", description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("--model", required=True, help="the model folder (its tokenizer.json and chat template)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", default="auto", choices=["auto", "text", "chat", "prompt_completion", "ids"])
    ap.add_argument("--max-len", type=int, default=0, help="truncate records to N tokens (0: keep)")
    ap.add_argument("--train-on-prompt", action="store_true", help="learn prompt and user tokens too")
    ap.add_argument("--skip-bad", action="store_true", help="count bad records instead of stopping")
    args = ap.parse_args()
    if args.max_len < 0:
        sys.exit("adapt: error: --max-len expects N >= 0")
    if not os.path.isfile(args.input):
        sys.exit(f"adapt: error: {args.input}: expected a JSONL file")
    try:
        tok = load_tokenizer(args.model)
    except SystemExit as e:
        print(e.code, file=sys.stderr)
        sys.exit(2)
    vocab = len(tok)
    tmp = args.out + ".tmp"
    written = skipped = tokens = learned = 0
    try:
        with open(args.input, encoding="utf-8") as src, open(tmp, "w") as dst:
            for number, line in enumerate(src, 1):
                if not line.strip():
                    continue
                where = f"{args.input}:{number}"
                try:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise BadRecord(f"JSON at byte {e.pos}: {e.msg}")
                    if not isinstance(record, dict):
                        raise BadRecord("expected a JSON object")
                    kind = kind_of(record, args.format)
                    if kind == "text":
                        ids = encode_text(tok, need_string(record, "text"))
                        labels = list(ids)
                    elif kind == "chat":
                        ids, labels = encode_chat(tok, record.get("messages"), args.train_on_prompt)
                    elif kind == "prompt_completion":
                        ids, labels = encode_prompt_completion(tok, record, args.train_on_prompt)
                    else:
                        ids, labels = encode_ids(record, vocab)
                except BadRecord as e:
                    if not args.skip_bad:
                        raise SystemExit(f"adapt: error: {where}: {e}")
                    skipped += 1
                    print(f"adapt: warning: {where}: skipped: {e}", file=sys.stderr)
                    continue
                if args.max_len:
                    ids, labels = ids[:args.max_len], labels[:args.max_len]
                dst.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
                written += 1
                tokens += len(ids)
                learned += sum(1 for l in labels if l != IGNORE)
        os.replace(tmp, args.out)
    except SystemExit as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        print(e.code, file=sys.stderr)
        sys.exit(2)
    print(f"wrote {args.out}: {written} records, {tokens} tokens, {learned} learned"
          + (f"; skipped {skipped} bad records" if skipped else ""))


if __name__ == "__main__":
    main()
