"""Small helpers shared by the end-to-end tests: files are read and written
inside `with` blocks (no ResourceWarning), JSON lines parsed in one place."""
import json


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
