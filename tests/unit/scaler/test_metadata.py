"""Trigger metadata -> the pool to scale; every refusal names the metadata key to fix."""

import pytest

from tidegate.scaler import metadata
from tidegate.scaler.errors import MetadataError, UnknownMetricError


def test_defaults_follow_the_pool_spec_and_the_scaledobject_namespace() -> None:
    t = metadata.parse("small", "team-a", {"pool": "small", "scalerAddress": "scaler:9090"})
    assert (t.namespace, t.pool, t.sidecar_port) == ("team-a", "small", metadata.DEFAULT_SIDECAR_PORT)
    assert (t.scaling.min_replicas, t.scaling.max_replicas, t.scaling.signal.window_seconds) == (1, 8, 60)
    assert t.metric_name == "tidegate-small-desired-replicas"


def test_spec_scaling_fields_travel_as_camel_case_strings() -> None:
    md = {
        "pool": "big",
        "namespace": "ml",
        "sidecarPort": "9000",
        "minReplicas": "2",
        "maxReplicas": "40",
        "targetCapacityRejectRate": "0.05",
        "targetUtilization": "0.6",
        "maxScaleUpStep": "8",
        "scaleDownCooldownSeconds": "120",
        "windowSeconds": "30",
    }
    t = metadata.parse("ignored", "default", md)
    s = t.scaling
    assert (t.namespace, t.sidecar_port) == ("ml", 9000)
    assert (s.min_replicas, s.max_replicas, s.target_capacity_reject_rate, s.target_utilization) == (2, 40, 0.05, 0.6)
    assert (s.max_scale_up_step, s.scale_down_cooldown_seconds, s.signal.window_seconds) == (8, 120, 30)


@pytest.mark.parametrize(
    ("md", "namespace", "key", "words"),
    [
        ({}, "ns", "pool", "required"),
        ({"pool": "Small_Pool"}, "ns", "pool", "not a Kubernetes name"),
        ({"pool": "p"}, "", "namespace", "required"),
        ({"pool": "p", "maxReplicas": "many"}, "ns", "maxReplicas", "not an integer"),
        ({"pool": "p", "targetUtilization": "1.5"}, "ns", "targetUtilization", "less than or equal to 1"),
        ({"pool": "p", "minReplicas": "9", "maxReplicas": "3"}, "ns", "minReplicas", "<= scaling.maxReplicas"),
        ({"pool": "p", "source": "prometheus"}, "ns", "prometheusUrl", "required"),
        ({"pool": "p", "sidecarPort": "70000"}, "ns", "sidecarPort", "not a TCP port"),
    ],
)
def test_bad_metadata_names_the_key(md: dict[str, str], namespace: str, key: str, words: str) -> None:
    with pytest.raises(MetadataError) as info:
        metadata.parse("so", namespace, md)
    assert info.value.key == key
    assert words in str(info.value) and repr(key) in str(info.value)


def test_metric_name_with_or_without_kedas_index_prefix() -> None:
    t = metadata.parse("so", "ns", {"pool": "small"})
    t.check_metric_name("tidegate-small-desired-replicas")
    t.check_metric_name("s0-tidegate-small-desired-replicas")
    t.check_metric_name("")  # older KEDA versions may leave it empty
    with pytest.raises(UnknownMetricError, match="tidegate-small-desired-replicas"):
        t.check_metric_name("s0-tidegate-other-desired-replicas")


def test_the_operators_scaledobject_trigger_parses_to_the_pools_own_scaling_spec() -> None:
    builders = pytest.importorskip("tidegate.operator.builders.scaled_object")
    settings_mod = pytest.importorskip("tidegate.operator.settings")
    from tests.invalid_pools import valid_pool
    from tidegate.api import InferencePool

    doc = valid_pool()
    doc["spec"]["scaling"] = {"minReplicas": 2, "maxReplicas": 12, "targetUtilization": 0.6, "maxScaleUpStep": 3}
    pool = InferencePool.model_validate(doc)
    so = builders.scaled_object(pool, settings_mod.OperatorSettings())
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "external" and trigger["metricType"] == "AverageValue"
    t = metadata.parse(so["metadata"]["name"], so["metadata"]["namespace"], trigger["metadata"])
    assert (t.namespace, t.pool) == (pool.metadata.namespace, pool.metadata.name)
    assert t.scaling == pool.spec.scaling.model_copy(update={"polling_interval_seconds": 15, "fallback_replicas": None})


def test_with_fallback_replicas_the_scaledobject_keeps_what_keda_fallback_needs() -> None:
    # KEDA applies spec.fallback only to AverageValue metrics, and counts GetMetrics failures, which
    # this scaler answers UNAVAILABLE when a pool's pods or Prometheus cannot be read at all
    builders = pytest.importorskip("tidegate.operator.builders.scaled_object")
    settings_mod = pytest.importorskip("tidegate.operator.settings")
    from tests.invalid_pools import valid_pool
    from tidegate.api import InferencePool

    doc = valid_pool()
    doc["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 12, "fallbackReplicas": 6}
    so = builders.scaled_object(InferencePool.model_validate(doc), settings_mod.OperatorSettings())
    assert so["spec"]["fallback"]["replicas"] == 6 and so["spec"]["fallback"]["failureThreshold"] >= 1
    assert {t["metricType"] for t in so["spec"]["triggers"]} == {"AverageValue"}


def test_warm_pool_size_travels_and_is_optional() -> None:
    assert metadata.parse("so", "ml", {"pool": "p", "warmPoolSize": "2"}).warm_pool_size == 2
    assert metadata.parse("so", "ml", {"pool": "p"}).warm_pool_size is None
    with pytest.raises(MetadataError, match="warmPoolSize"):
        metadata.parse("so", "ml", {"pool": "p", "warmPoolSize": "-1"})
