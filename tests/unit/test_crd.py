"""The generated CRD: committed copy is current, and the schema is one Kubernetes accepts."""

import pathlib

from tidegate.api import crd
from tidegate.api.status import ConditionType
from tidegate.cli.main import main

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = REPO / "crds" / "inferencepools.tidegate.dev.yaml"


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.read_text() == crd.render(), (
        "crds/ is stale: run `tidegate crd -o crds/inferencepools.tidegate.dev.yaml`"
    )


def test_cli_prints_the_crd(capsys) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd.render()


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_schema_is_structural() -> None:
    schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, path


def test_scale_subresource_and_printer_columns() -> None:
    version = crd.custom_resource_definition()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    names = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert names == ["Model", "Desired", "Active", "Warm", "RejectRate", "Age"]


def test_wide_columns_say_bounds_engine_and_why_a_pool_is_not_serving() -> None:
    """`kubectl get tgpool -o wide` adds columns (priority 1), each reading a field the schema has."""
    version = crd.custom_resource_definition()["spec"]["versions"][0]
    wide = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert list(wide) == ["Engine", "Min", "Max", "Ready", "Degraded", "Scaler", "Signal"]
    schema = version["schema"]["openAPIV3Schema"]
    for name, path in wide.items():
        node = schema
        field_path, _, condition = path.partition("[?(@.type==")
        for key in field_path.strip(".").split("."):
            node = node["properties"][key]
        if condition:  # .status.conditions[?(@.type=="X")].status: X is a condition the operator sets
            assert node["type"] == "array", name
            ctype = condition.split('"')[1]
            assert ctype in {t.value for t in ConditionType}, name
            assert path.endswith(")].status") and "status" in node["items"]["properties"], name
    assert wide["Scaler"].endswith('@.type=="ScalerReachable")].status')


def test_group_is_not_the_gateway_api_inference_extension() -> None:
    names = crd.custom_resource_definition()["spec"]
    assert not names["group"].endswith(".k8s.io")
    assert "infpool" not in names["names"]["shortNames"]


def test_configuration_reference_is_current_and_covers_every_field() -> None:
    from tidegate.api import reference

    text = reference.render()
    assert (REPO / "docs" / "configuration.md").read_text() == text, "docs/ is stale: run `make crd`"
    for field in (
        "`admission.kvCache.trip`",
        "`scaling.maxReplicas`",
        "`nodePool.nodeClassRef.group`",
        "`warmPool.size`",
    ):
        assert field in text
    assert "resume must be < trip (hysteresis)" in text
