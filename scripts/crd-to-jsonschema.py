#!/usr/bin/env python3
"""Turns the openAPIV3Schema of CustomResourceDefinitions into strict JSON
Schemas that check-jsonschema validates custom resources against.

    crd-to-jsonschema.py OUT_DIR CRD.yaml...

writes OUT_DIR/<kind>-<group>-<version>.json (lower case) for every served
version of every CRD in the files, and prints their paths.

Strict means what the API server does with a structural schema: a field the
schema does not name is an error. So an object schema that lists
`properties` and does not say `x-kubernetes-preserve-unknown-fields: true`
gets `additionalProperties: false` (a misspelt field fails instead of being
dropped), and the OpenAPI-only keywords become their JSON Schema meaning:

- `nullable: true`: the type also admits null;
- `x-kubernetes-int-or-string: true`: an integer or a string;
- at the root, `apiVersion` and `kind` must be this CRD's, and `metadata`
  an object (a CRD's schema may leave them out: the API server adds them).

Needs PyYAML (in .data/venv, which `make deps` sets up).
"""

import json
import sys
from pathlib import Path

import yaml

JSON_SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


def strict(schema):
    """A copy of one OpenAPI v3 schema node, and of everything under it, as
    strict JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = strict(value) if isinstance(value, dict) else value
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [strict(sub) for sub in value]
        elif key in ("nullable", "x-kubernetes-int-or-string"):
            continue
        else:
            out[key] = value

    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserves_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in schema and "additionalProperties" not in schema and not preserves_unknown:
        out["additionalProperties"] = False
    if schema.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        if "anyOf" in out:
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = out["enum"] + [None]
    return out


def resource_schema(crd, version):
    spec = crd["spec"]
    group, kind = spec["group"], spec["names"]["kind"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
    properties["kind"] = {"type": "string", "enum": [kind]}
    properties.setdefault("metadata", {"type": "object"})
    schema["type"] = "object"
    schema["additionalProperties"] = False
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    schema["$schema"] = JSON_SCHEMA_DRAFT
    schema["title"] = f"{kind} {group}/{version['name']}"
    return schema


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in argv[2:]:
        with open(path, encoding="utf-8") as file:
            documents = [d for d in yaml.safe_load_all(file) if d]
        for crd in documents:
            if crd.get("kind") != "CustomResourceDefinition":
                sys.exit(f"{path}: {crd.get('kind')} is not a CustomResourceDefinition")
            for version in crd["spec"]["versions"]:
                if not version.get("served", True):
                    continue
                name = "{}-{}-{}.json".format(
                    crd["spec"]["names"]["kind"].lower(), crd["spec"]["group"], version["name"]
                )
                target = out_dir / name
                target.write_text(json.dumps(resource_schema(crd, version), indent=1) + "\n")
                print(target)


if __name__ == "__main__":
    main(sys.argv)
