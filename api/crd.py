"""Generate the InferencePool CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema (``$ref``/``$defs``, ``anyOf`` with null for optional fields,
numeric ``exclusiveMinimum``); Kubernetes wants a *structural* OpenAPI v3 schema: everything
inlined, no null branches, boolean ``exclusiveMinimum``, no ``additionalProperties`` beside
``properties``. This module does that translation and adds what JSON Schema cannot say:
defaults for nested objects (the whole defaulted object), the status
and ``/scale`` subresources, and printer columns.

Source of the rules: https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema

Pure: returns data or text, writes nothing.
"""

import types
import typing
from enum import Enum
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from tidegate.api import constants
from tidegate.api.pool import InferencePoolSpec
from tidegate.api.status import ConditionType, InferencePoolStatus

HEADER = "# Generated from the pydantic models in api/ by `tidegate crd`. Do not edit by hand.\n"

_DROP = {"title", "$defs"}


def _condition_status(ctype: ConditionType) -> str:
    return f'.status.conditions[?(@.type=="{ctype.value}")].status'


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "description": "Model served"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Desired active replicas"},
    {"name": "Active", "type": "integer", "jsonPath": ".status.replicas", "description": "Active replicas"},
    {
        "name": "Warm",
        "type": "integer",
        "jsonPath": ".status.warmReplicas",
        "description": "Ready warm replicas (serving too under warmPool.serve)",
    },
    {
        "name": "RejectRate",
        "type": "number",
        "jsonPath": ".status.capacityRejectRate",
        "description": "Capacity reject rate (0..1) over the scaling window",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # `kubectl get tgpool -o wide` (priority 1): the bounds and the conditions that say why a pool
    # is not serving or not scaling, without `kubectl describe`.
    *(
        {**column, "priority": 1}
        for column in (
            {"name": "Engine", "type": "string", "jsonPath": ".spec.model.engine", "description": "Model server"},
            {"name": "Min", "type": "integer", "jsonPath": ".spec.scaling.minReplicas", "description": "minReplicas"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.scaling.maxReplicas", "description": "maxReplicas"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": _condition_status(ConditionType.READY),
                "description": "Ready condition: the desired active replicas are ready",
            },
            {
                "name": "Degraded",
                "type": "string",
                "jsonPath": _condition_status(ConditionType.DEGRADED),
                "description": "Degraded condition (its message says why: kubectl describe tgpool)",
            },
            {
                "name": "Scaler",
                "type": "string",
                "jsonPath": _condition_status(ConditionType.SCALER_REACHABLE),
                "description": "ScalerReachable condition: the tidegate scaler answers gRPC health checks",
            },
            {
                "name": "Signal",
                "type": "string",
                "jsonPath": ".status.signal.reason",
                "description": "The scaler's last decision, e.g. `4 -> 6: capacity reject 31% across 5 tenants`",
            },
        )
    ),
]


# A pool's name becomes its Service's name, a DNS-1035 label (lowercase letters, digits and '-',
# starting with a letter, ending with a letter or digit, at most 63 characters), and the value of
# the `tidegate.dev/pool` and `app.kubernetes.io/instance` labels (at most 63). The longest name
# derived with a prefix or suffix that has a limit is KEDA's HPA `keda-hpa-<pool>`: KEDA's
# admission webhook refuses a ScaledObject whose HPA name would be over 63 characters, so a pool
# name has at most 63 - 9 = 54. The others have room: the ConfigMap `<pool>-admission`, the
# ReplicaSets and pods are DNS-1123 subdomains (253; pod names are shortened by the API server)
# and the NodePool `tidegate-<namespace>-<pool>` is shortened with a hash (names.node_pool_name).
# The API server has already checked the name as a DNS-1123 subdomain (lowercase alphanumerics,
# '-' and '.', starting and ending alphanumeric), so dots, a leading digit and the length are
# what is left. Without these rules such a pool is accepted and its Service refused, forever.
POOL_NAME_MAX = 63 - len("keda-hpa-")
_NAME_RULE = (
    "an InferencePool's name becomes a Service name and KEDA's HPA keda-hpa-<name>: lowercase letters, "
    f"digits and '-', starting with a letter, at most {POOL_NAME_MAX} characters"
)
_NAME = "self.metadata.name"
NAME_VALIDATIONS = [
    {
        "rule": f"!{_NAME}.contains('.')",
        "message": f"{_NAME_RULE}; no dots",
        "messageExpression": f"\"{_NAME_RULE}; no dots; try \" + {_NAME}.replace('.', '-')",
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    {
        # only a leading digit is left to refuse: the API server's own DNS-1123 check has already
        # refused capitals and a leading '-' (with its own message; "start with a letter" would be wrong)
        "rule": f"!{_NAME}.matches('^[0-9]')",
        "message": f"{_NAME_RULE}; it must start with a letter",
        "messageExpression": f"\"{_NAME_RULE}; it must start with a letter; try pool-\" + {_NAME}.replace('.', '-')",
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": f"size({_NAME}) <= {POOL_NAME_MAX}",
        # A static message: the cost estimator prices string(int) beyond the budget.
        "message": f"{_NAME_RULE}; this name has more: shorten it",
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
]


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``root``, by the name pydantic uses in ``$defs``."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for info in tp.model_fields.values():
                visit(info.annotation)
            return
        for arg in typing.get_args(tp):
            visit(arg)
        if isinstance(tp, types.UnionType):
            for arg in tp.__args__:
                visit(arg)

    visit(root)
    return found


def _factory_default(value: Any) -> Any:
    """The CRD default for a field whose Python default comes from a factory (None: none)."""
    if isinstance(value, BaseModel):
        # The whole defaulted object, not {}: the API server checks defaults against the CEL
        # rules without applying nested defaults first.
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list) and value:
        return to_jsonable_python(value, by_alias=True, exclude_none=True)
    return None  # empty list/dict: absence means the same


def _add_factory_defaults(defs: dict[str, Any], classes: dict[str, type[BaseModel]]) -> None:
    for name, cls in classes.items():
        props = defs.get(name, {}).get("properties", {})
        for field, info in cls.model_fields.items():
            if info.default_factory is None:
                continue
            alias = info.alias or field
            default = _factory_default(info.default_factory())  # type: ignore[call-arg]
            if default is not None and alias in props:
                props[alias]["default"] = default


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    while "$ref" in node or "anyOf" in node:
        if "$ref" in node:
            target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
            node = {**target, **node}  # the use site's description/default win
        if "anyOf" in node:
            branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
            if len(branches) == 1:
                node = {**branches[0], **node}
            elif not node.get("x-kubernetes-int-or-string"):
                raise ValueError(f"cannot express a union in a structural schema: {branches}")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[bound.replace("exclusiveM", "m")] = node.pop(bound)
            node[bound] = True
    if "default" in node and node["default"] is None:
        del node["default"]
    if isinstance(node.get("default"), Enum):
        node["default"] = node["default"].value
    if "properties" in node:
        node.pop("additionalProperties", None)
        node.setdefault("type", "object")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key in ("properties",):
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if out.get("description"):
        out["description"] = " ".join(out["description"].split())
    return out


def schema_for(model: type[BaseModel]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of ``model`` (camelCase names, CEL rules, defaults).

    Raises ``ValueError`` when the model uses a union a structural schema cannot express.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    classes = _model_classes(model)
    _add_factory_defaults(defs, classes)
    _add_factory_defaults({model.__name__: raw}, {model.__name__: model})
    return _structural(raw, defs)


def custom_resource_definition() -> dict[str, Any]:
    """The InferencePool CRD as a dict (``apiextensions.k8s.io/v1``)."""
    spec = schema_for(InferencePoolSpec)
    status = schema_for(InferencePoolStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{constants.PLURAL}.{constants.GROUP}",
            "labels": {"app.kubernetes.io/name": "tidegate", "app.kubernetes.io/part-of": "tidegate"},
        },
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": [constants.SHORT_NAME],
                "categories": [constants.CATEGORY],
            },
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An InferencePool serves one model from GPU replicas behind tidegate "
                            "admission sidecars, with a warm pool and reject-rate autoscaling.",
                            "required": ["spec"],
                            "x-kubernetes-validations": NAME_VALIDATIONS,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # Declared (with the API server's own limit) so that the name rules can
                                # point at .metadata.name and their cost is bounded.
                                "metadata": {
                                    "type": "object",
                                    "properties": {"name": {"type": "string", "maxLength": 253}},
                                },
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML text committed under ``crds/`` (stable key order)."""
    return HEADER + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100)
