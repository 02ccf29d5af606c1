"""A configuration reference of the InferencePool, generated from the CRD schema (Markdown).

``docs/configuration.md`` is this module's output, committed; a test fails when it is stale
(``make crd`` rewrites it). One row per field: its path, type, default, and description, so
the reference can never disagree with what the API server validates.

Pure: returns text.
"""

import json
from typing import Any

from tidegate.api import crd

HEADER = """# InferencePool configuration reference

Generated from the pydantic models in `api/` (`make crd`). Do not edit by hand.
`apiVersion: tidegate.dev/v1alpha1`, `kind: InferencePool`. Rules across fields (CEL) are listed
under the object they belong to.

"""


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (Kubernetes, as written)"
    kind = node.get("type", "")
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object" and "additionalProperties" in node:
        return f"map of {_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    bounds = []
    for key, sym in (("minimum", ">="), ("maximum", "<=")):
        if key in node:
            strict = node.get("exclusiveM" + key[1:])
            bounds.append(f"{'>' if strict and sym == '>=' else '<' if strict else sym} {node[key]}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or (isinstance(node["default"], dict | list) and len(json.dumps(node["default"])) > 60):
        return "" if "default" not in node else "(see fields)"
    return f"`{json.dumps(node['default'])}`"


def _rows(node: dict[str, Any], path: str, required: set[str], out: list[str], rules: list[str]) -> None:
    for rule in node.get("x-kubernetes-validations", []):
        rules.append(f"- `{path or 'spec'}`: {rule['message']} (`{rule['rule']}`)")
    for name, child in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        desc = " ".join(child.get("description", "").split()).replace("|", "\\|")
        req = " **required**" if name in required else ""
        out.append(f"| `{here}`{req} | {_type(child)} | {_default(child)} | {desc} |")
        target = child.get("items", {}) if child.get("type") == "array" else child
        if target.get("properties"):
            suffix = "[]" if child.get("type") == "array" else ""
            _rows(target, here + suffix, set(target.get("required", [])), out, rules)


def render() -> str:
    """The reference as Markdown (spec, then status)."""
    schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    text = HEADER
    for section in ("spec", "status"):
        rows: list[str] = []
        rules: list[str] = []
        node = schema[section]
        _rows(node, "", set(node.get("required", [])), rows, rules)
        text += f"## {section}\n\n| field | type | default | description |\n| --- | --- | --- | --- |\n"
        text += "\n".join(rows) + "\n"
        if rules:
            text += "\nRules checked at `kubectl apply`:\n\n" + "\n".join(rules) + "\n"
        text += "\n"
    return text.rstrip() + "\n"
