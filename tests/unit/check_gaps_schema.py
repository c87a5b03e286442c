#!/usr/bin/env python3
"""Validate a gaps.json file against docs/gaps.schema.json, stdlib only.

Usage: check_gaps_schema.py SCHEMA JSON

Implements the subset of JSON Schema draft 2020-12 that gaps.schema.json
uses (type, const, enum, required, properties, additionalProperties, items,
minimum, minLength and local $ref). A keyword outside that subset is an
error, so the schema cannot silently outgrow this checker. Exits 0 and
prints "ok" when valid, else prints one line per violation and exits 1.
"""

import json
import sys

ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs"}
CHECKED = {"type", "const", "enum", "required", "properties",
           "additionalProperties", "items", "minimum", "minLength", "$ref"}


def type_matches(value, name):
    """True when value has JSON type name (booleans are not integers)."""
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }[name](value)


def resolve(root, ref):
    """Follow a local reference such as #/$defs/count."""
    if not ref.startswith("#/"):
        raise ValueError("only local $ref is supported: " + ref)
    node = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def validate(root, schema, value, path, errors):
    """Append to errors every way value at path breaks schema."""
    unknown = set(schema) - ANNOTATIONS - CHECKED
    if unknown:
        errors.append(f"{path}: schema uses unsupported {sorted(unknown)}")
    if "$ref" in schema:
        validate(root, resolve(root, schema["$ref"]), value, path, errors)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(type_matches(value, n) for n in names):
            errors.append(f"{path}: expected {'/'.join(names)}, got {json.dumps(value)[:60]}")
            return
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {json.dumps(schema['const'])}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {json.dumps(value)[:60]} not one of {schema['enum']}")
    if "minimum" in schema and type_matches(value, "number") and value < schema["minimum"]:
        errors.append(f"{path}: {value} below minimum {schema['minimum']}")
    if "minLength" in schema and isinstance(value, str) and len(value) < schema["minLength"]:
        errors.append(f"{path}: shorter than {schema['minLength']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required {key}")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                validate(root, properties[key], item, f"{path}.{key}", errors)
            elif extra is False:
                errors.append(f"{path}: unexpected {key}")
            elif isinstance(extra, dict):
                validate(root, extra, item, f"{path}.{key}", errors)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            validate(root, schema["items"], item, f"{path}[{index}]", errors)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    with open(argv[2], encoding="utf-8") as f:
        document = json.load(f)
    errors = []
    validate(schema, schema, document, "$", errors)
    for error in errors:
        print(f"{argv[2]}: {error}")
    if not errors:
        print("ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
