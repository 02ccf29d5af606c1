"""The base model and field types every InferencePool model is built from.

Python names are snake_case; the Kubernetes (and config-file) names are their camelCase
aliases, as in every Kubernetes API. Unknown fields are an error, so a typo in a config file
fails loudly instead of silently meaning the default.
"""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, WithJsonSchema
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of all API models: camelCase aliases, names accepted too, extra fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One CEL validation rule for the CRD (``x-kubernetes-validations`` entry).

    ``field_path`` (e.g. ``.maxReplicas``) makes the API server name that field in its error.
    Source: https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules
    """
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules for a model's CRD schema."""
    return {"x-kubernetes-validations": list(rules)}


Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
"""A ratio in 0..1 (not a percentage)."""

IntOrString = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]
"""A Kubernetes quantity or count that may be written as a number or a string (``8``, ``"10%"``)."""

# k8s.io/apimachinery/pkg/api/resource (Quantity): the pattern the API server checks in CRDs, e.g. Karpenter
# v1.14.1's NodePool `limits` (pkg/apis/crds/karpenter.sh_nodepools.yaml).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 16, 500m, 64Gi)")
    return value


Quantity = Annotated[
    # strict: a YAML true is not 1, nor 1.5 a quantity (the API server refuses both in int-or-string);
    # an integer fits int64, as the API server's does
    Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | StrictStr,
    AfterValidator(_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
"""A Kubernetes resource quantity as a number or a string (``16``, ``"500m"``, ``"64Gi"``)."""

RawObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A Kubernetes object passed through as written (validated by Kubernetes where it lands)."""

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
"""A DNS-1123 label: lowercase letters, digits and ``-``, at most 63 characters."""

LIST_MAP_BY_NAME: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
"""Schema extra for a list keyed by ``name``: the API server refuses duplicate names."""
