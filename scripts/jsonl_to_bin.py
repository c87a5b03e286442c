#!/usr/bin/env python3
"""Converts a JSONL training set into adapt's binary ADAPTTOK format.

Usage: jsonl_to_bin.py IN.jsonl OUT.bin [--width 2|4] [--vocab N]

Each JSONL line is {"input_ids": [...]} (other keys ignored) or a bare array
of token ids; blank lines are skipped. The output (docs/datasets.md) is a
16-byte header - b"ADAPTTOK", uint32 LE version 1, uint32 LE token width -
then every document's ids, little-endian, each document followed by the
boundary marker 0xFFFF (width 2) or 0xFFFFFFFF (width 4). Without --width
the narrowest width that holds the largest id is used. The format has no
labels: a line with "labels" is an error unless --drop-labels is given.
The output is written to OUT.bin.tmp and renamed when complete.
Standard library only.
"""
import argparse
import json
import os
import struct
import sys

MAGIC = b"ADAPTTOK"
VERSION = 1
MARKER = {2: 0xFFFF, 4: 0xFFFFFFFF}


class InputError(Exception):
    pass


def read_documents(path, vocab, drop_labels):
    """Yields (line number, ids) for every non-blank line of path."""
    with open(path, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: JSON at byte {e.pos}: {e.msg}")
            if isinstance(doc, dict):
                if "input_ids" not in doc:
                    raise InputError(f"{where}: input_ids: expected an \"input_ids\" array")
                if doc.get("labels") is not None and not drop_labels:
                    raise InputError(f"{where}: labels: the binary format has no labels "
                                     "(pass --drop-labels to train on every token)")
                ids, field = doc["input_ids"], "input_ids"
            elif isinstance(doc, list):
                ids, field = doc, ""
            else:
                raise InputError(f"{where}: expected an object with \"input_ids\" or an array")
            if not isinstance(ids, list):
                raise InputError(f"{where}: {field}: expected an array of token ids")
            for i, t in enumerate(ids):
                if not isinstance(t, int) or isinstance(t, bool):
                    raise InputError(f"{where}: {field}[{i}]: expected an integer token id, found {t!r}")
                if t < 0 or (vocab is not None and t >= vocab):
                    bound = f"[0, {vocab})" if vocab is not None else ">= 0"
                    raise InputError(f"{where}: {field}[{i}]: expected a token id {bound}, found {t}")
            yield number, ids


def convert(src, dst, width=None, vocab=None, drop_labels=False):
    """Converts src to dst; returns (documents, tokens, width)."""
    if width is None:
        largest = -1
        for _, ids in read_documents(src, vocab, drop_labels):
            if ids:
                largest = max(largest, max(ids))
        width = 2 if largest < MARKER[2] else 4
    fmt = "<H" if width == 2 else "<I"
    pack = struct.Struct(fmt).pack
    documents = tokens = 0
    tmp = dst + ".tmp"
    try:
        with open(tmp, "wb") as out:
            out.write(MAGIC + struct.pack("<II", VERSION, width))
            for number, ids in read_documents(src, vocab, drop_labels):
                if not ids:
                    continue
                for i, t in enumerate(ids):
                    if t >= MARKER[width]:
                        raise InputError(f"{src}:{number}: [{i}]: token id {t} does not fit "
                                         f"{width} bytes (use --width 4)")
                out.write(b"".join(pack(t) for t in ids))
                out.write(pack(MARKER[width]))
                documents += 1
                tokens += len(ids)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return documents, tokens, width


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="JSONL file")
    parser.add_argument("output", help="ADAPTTOK file to write")
    parser.add_argument("--width", type=int, choices=(2, 4),
                        help="bytes per token (default: 2 when every id is below 65535)")
    parser.add_argument("--vocab", type=int, help="reject ids >= this vocabulary size")
    parser.add_argument("--drop-labels", action="store_true",
                        help="ignore \"labels\" instead of refusing lines that have them")
    args = parser.parse_args(argv)
    try:
        documents, tokens, width = convert(args.input, args.output, args.width, args.vocab,
                                           args.drop_labels)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or args.output}: {e.strerror}", file=sys.stderr)
        return 6
    print(f"{args.output}: {documents} documents, {tokens} tokens, {width}-byte ids")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
