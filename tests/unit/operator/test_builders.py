"""Desired-state builders: the manifests a platform engineer gets from one InferencePool."""

import re

import yaml

from tests.invalid_pools import valid_pool
from tidegate.api.pool import InferencePool
from tidegate.api.scaling import ScalingSpec
from tidegate.operator import builders, names
from tidegate.operator.builders.nodepool import gpu_limit
from tidegate.operator.names import ANNOTATION_TEMPLATE_CHANGED, ANNOTATION_TEMPLATE_HASH
from tidegate.operator.settings import OperatorSettings

SETTINGS = OperatorSettings(sidecar_image="tidegate:test", scaler_address="scaler:9090")


def pool(**spec) -> InferencePool:
    body = valid_pool("p")
    body["metadata"]["namespace"] = "ml"
    body["spec"].update(spec)
    return InferencePool.model_validate(body)


def test_deployment_runs_the_model_and_a_restricted_native_sidecar() -> None:
    dep = builders.deployment(pool(server={"image": "vllm:1", "gpus": 2, "port": 8000}), SETTINGS, replicas=3)
    spec = dep["spec"]["template"]["spec"]
    model = spec["containers"][0]
    assert dep["spec"]["replicas"] == 3
    assert model["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert model["lifecycle"]["preStop"]["httpGet"]["path"] == "/tidegate/drain?wait=true"
    sidecar = spec["initContainers"][-1]
    assert sidecar["restartPolicy"] == "Always"
    assert "--upstream" in sidecar["args"] and "http://127.0.0.1:8000" in sidecar["args"]
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # the pod is Ready only once its sidecar has sized the replica (tokenBudget read from the server)
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/tidegate/ready"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] == 600 + 30  # request timeout + slack


def test_new_pods_start_warm_and_the_selector_ignores_the_role() -> None:
    dep = builders.deployment(pool(), SETTINGS, replicas=1)
    assert dep["spec"]["template"]["metadata"]["labels"]["tidegate.dev/role"] == "warm"
    assert "tidegate.dev/role" not in dep["spec"]["selector"]["matchLabels"]


def test_service_selects_serving_pods_through_the_sidecar_port() -> None:
    svc = builders.service(pool(), SETTINGS)
    assert svc["spec"]["selector"] == {"tidegate.dev/pool": "p", "tidegate.dev/serving": "true"}
    assert svc["spec"]["ports"][0]["targetPort"] == SETTINGS.sidecar_port
    # until every active pod carries the serving label (an operator upgrade), the selector of before
    old = builders.service(pool(), SETTINGS, by_serving=False)
    assert old["spec"]["selector"] == {"tidegate.dev/pool": "p", "tidegate.dev/role": "active"}


def test_the_serving_label_is_never_in_the_pod_template_so_flipping_serve_rolls_nothing() -> None:
    off = builders.deployment(pool(warmPool={"size": 1, "serve": False}), SETTINGS, replicas=2)
    on = builders.deployment(pool(warmPool={"size": 1, "serve": True}), SETTINGS, replicas=2)
    assert on["spec"]["template"] == off["spec"]["template"]
    assert "tidegate.dev/serving" not in on["spec"]["template"]["metadata"]["labels"]


def test_config_map_holds_admission_and_model_in_camel_case() -> None:
    cm = builders.admission_config_map(pool(admission={"maxConcurrency": 7}))
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["admission"]["maxConcurrency"] == 7
    assert config["model"]["name"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_scaled_object_targets_the_pool_with_an_average_value_of_desired_replicas() -> None:
    so = builders.scaled_object(pool(scaling={"minReplicas": 1, "maxReplicas": 6, "fallbackReplicas": 2}), SETTINGS)
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "tidegate.dev/v1alpha1", "kind": "InferencePool", "name": "p"}
    trigger = spec["triggers"][0]
    assert trigger["type"] == "external" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["scalerAddress"] == "scaler:9090"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 2}


def test_scaled_object_above_zero_leaves_out_what_keda_would_warn_about() -> None:
    # KEDA's webhook (v2.21.0) warns that pollingInterval and cooldownPeriod are "not relevant"
    # when minReplicaCount >= 1: the HPA scales, KEDA's own loop only decides 0 <-> 1.
    spec = builders.scaled_object(pool(scaling={"minReplicas": 1, "maxReplicas": 6}), SETTINGS)["spec"]
    assert not {"pollingInterval", "cooldownPeriod", "initialCooldownPeriod"} & spec.keys()


def test_scaled_object_at_zero_keeps_keda_polling_and_the_cold_start_cooldown() -> None:
    p = pool(scaling={"minReplicas": 0, "maxReplicas": 6, "pollingIntervalSeconds": 7, "scaleDownCooldownSeconds": 90})
    spec = builders.scaled_object(p, SETTINGS)["spec"]
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (7, 90)
    assert spec["initialCooldownPeriod"] >= 600  # no scale-to-zero during the first cold start


def test_node_pool_limits_leave_room_for_max_warm_and_surge() -> None:
    p = pool(
        server={"image": "x", "gpus": 2},
        scaling={"maxReplicas": 5},
        warmPool={"size": 2},
        nodePool={
            "enabled": True,
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
        },
    )
    np = builders.node_pool(p)
    assert np["metadata"]["name"] == "tidegate-ml-p"
    assert np["spec"]["limits"]["nvidia.com/gpu"] == gpu_limit(p) == (5 + 2 + 1) * 2
    assert np["spec"]["template"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    ]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]} in np["spec"]["template"][
        "spec"
    ]["requirements"]
    dep = builders.deployment(p, SETTINGS, replicas=1)
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "tidegate-ml-p"}


def test_node_pool_disruption_budget_applies_to_every_reason() -> None:
    # Karpenter applies a budget whose `reasons` is [] to no reason at all: as built before,
    # nine GPU nodes went in one disruption command. Absent means every reason.
    def budgets(disruption=None) -> list[dict]:
        node_pool = {
            "enabled": True,
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "k"},
        }
        if disruption is not None:
            node_pool["disruption"] = disruption
        return builders.node_pool(pool(server={"image": "x", "gpus": 1}, nodePool=node_pool))["spec"]["disruption"][
            "budgets"
        ]

    assert budgets() == [{"nodes": "1"}]
    assert budgets({"budgets": [{"nodes": "2", "reasons": []}]}) == [{"nodes": "2"}]
    assert budgets({"budgets": [{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "1"}]}) == [
        {"nodes": "0", "reasons": ["Drifted"]},
        {"nodes": "1"},
    ]


def test_long_names_give_a_deterministic_node_pool_name_within_63_characters() -> None:
    body = valid_pool("a" * 60)
    body["metadata"]["namespace"] = "b" * 60
    p = InferencePool.model_validate(body)
    assert len(names.node_pool_name(p)) <= 63
    assert names.node_pool_name(p) == names.node_pool_name(p)


def test_trigger_metadata_is_what_the_scaler_parses() -> None:
    from tidegate.scaler import metadata

    p = pool(
        scaling={
            "minReplicas": 2,
            "maxReplicas": 9,
            "targetCapacityRejectRate": 0.05,
            "maxScaleUpStep": 3,
            "pollingIntervalSeconds": 5,
        }
    )
    so = builders.scaled_object(p, SETTINGS)
    target = metadata.parse("p", "ml", so["spec"]["triggers"][0]["metadata"])
    assert (target.pool, target.namespace, target.sidecar_port) == ("p", "ml", SETTINGS.sidecar_port)
    law_fields = (
        "min_replicas",
        "max_replicas",
        "target_capacity_reject_rate",
        "target_utilization",
        "max_scale_up_step",
        "scale_down_cooldown_seconds",
        "polling_interval_seconds",  # the law's utilisation sustain time is half of it
        "signal",
    )
    for field in law_fields:
        assert getattr(target.scaling, field) == getattr(p.spec.scaling, field), field


def test_api_key_identity_mounts_the_digest_secret_into_the_sidecar() -> None:
    p = pool(admission={"tenancy": {"identity": "apiKey", "apiKeySecret": "tenant-keys"}})
    spec = builders.deployment(p, SETTINGS, replicas=1)["spec"]["template"]["spec"]
    sidecar = spec["initContainers"][-1]
    assert sidecar["args"][-2:] == ["--api-keys-dir", names.API_KEYS_DIR]
    assert {"name": "tidegate-api-keys", "secret": {"secretName": "tenant-keys"}} in spec["volumes"]
    plain = builders.deployment(pool(), SETTINGS, replicas=1)["spec"]["template"]["spec"]
    assert "--api-keys-dir" not in plain["initContainers"][-1]["args"]


def test_scale_down_waits_a_short_window_on_top_of_the_laws_cooldown() -> None:
    # The law waits the cooldown itself; the HPA's default 300 s on top made every scale-down wait
    # both (10 min by default). One minute rides out a dip while replicas load mid-spike
    # (tests/unit/simulate/test_findings.py).
    for cooldown in (60, 300, 900):
        scaled = builders.scaled_object(pool(scaling={"scaleDownCooldownSeconds": cooldown}), SETTINGS)
        down = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert down["stabilizationWindowSeconds"] == 60
    behavior = builders.scaled_object(pool(scaling={"scaleDownCooldownSeconds": 60}), SETTINGS)["spec"]["advanced"]
    up = behavior["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
    assert up["stabilizationWindowSeconds"] == 0
    # what `kubectl explain` and docs/configuration.md tell the user who sets a short cooldown
    policy = down["policies"][0]
    assert (policy["type"], policy["value"], policy["periodSeconds"]) == ("Pods", 1, 60)
    described = ScalingSpec.model_fields["scale_down_cooldown_seconds"].description or ""
    assert "a 60 s scale-down window" in described and "one replica a minute" in described


def test_tls_to_the_scaler_sets_enable_tls_and_the_trigger_authentication() -> None:
    tls = OperatorSettings(
        scaler_address="scaler:9090", scaler_tls=True, scaler_auth_kind="ClusterTriggerAuthentication"
    )
    trigger = builders.scaled_object(pool(), tls)["spec"]["triggers"][0]
    assert trigger["metadata"]["enableTLS"] == "true"
    assert trigger["authenticationRef"] == {"name": "tidegate-scaler-tls", "kind": "ClusterTriggerAuthentication"}
    plain = builders.scaled_object(pool(), SETTINGS)["spec"]["triggers"][0]
    assert "enableTLS" not in plain["metadata"] and "authenticationRef" not in plain


def test_settings_refuse_an_unknown_trigger_authentication_kind() -> None:
    import pytest

    with pytest.raises(ValueError, match="TIDEGATE_SCALER_AUTH_KIND"):
        OperatorSettings.from_env({"TIDEGATE_SCALER_AUTH_KIND": "Secret"})


BAD_TEMPLATES = [
    ({"metadata": "x"}, "podTemplate.metadata must be an object"),
    ({"metadata": {"labels": [1]}}, "podTemplate.metadata.labels must be a map of strings"),
    ({"spec": "abc"}, "podTemplate.spec must be a PodSpec object"),
    ({"spec": {"containers": [5]}}, "podTemplate.spec.containers must be a list of objects"),
    ({"spec": {"terminationGracePeriodSeconds": "30"}}, "terminationGracePeriodSeconds must be an integer"),
    ({"spec": {"nodeSelector": [1]}}, "podTemplate.spec.nodeSelector must be an object"),
]


def test_pod_templates_tidegate_cannot_build_on_are_refused_naming_the_field() -> None:
    import pydantic
    import pytest

    for template, message in BAD_TEMPLATES:
        with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
            pool(server={"image": "x", "podTemplate": template})
    with pytest.raises(pydantic.ValidationError, match=re.escape("resources.requests must be a map")):
        pool(server={"image": "x", "resources": {"requests": 5}})


def test_nulls_in_a_pod_template_mean_absent_as_in_kubernetes() -> None:
    for template in ({"metadata": {"labels": None}}, {"spec": {"containers": None, "initContainers": None}},
                     {"spec": {"securityContext": None, "terminationGracePeriodSeconds": None}}):  # fmt: skip
        dep = builders.deployment(pool(server={"image": "x", "podTemplate": template}), SETTINGS, replicas=1)
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "x"


def test_the_prestop_hook_carries_the_drain_token_the_sidecar_config_holds() -> None:
    from tidegate.admission.config import parse

    body = valid_pool("p")
    body["metadata"].update({"namespace": "ml", "uid": "0b0e2a4c-1111-2222-3333-444455556666"})
    p = InferencePool.model_validate(body)
    hook = builders.deployment(p, SETTINGS, replicas=1)["spec"]["template"]["spec"]["containers"][0]["lifecycle"][
        "preStop"
    ]
    cm = builders.admission_config_map(p)
    config = parse(cm["data"]["config.yaml"])  # what the sidecar reads
    assert hook["httpGet"]["httpHeaders"] == [{"name": names.DRAIN_TOKEN_HEADER, "value": config.drain_token}]
    assert len(config.drain_token) == 32


def test_the_node_pool_says_when_its_template_last_changed_and_nothing_else_moves_that() -> None:
    # What Karpenter said of a NodePool before its template (requirements, node class, taints) changed
    # is stale; raised limits, a label, a later reconcile change nothing Karpenter said of instance types.
    node_class = {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}
    typo = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarg"]}]
    first = builders.stamp_template(
        builders.node_pool(pool(nodePool={"enabled": True, "nodeClassRef": node_class, "requirements": typo})),
        None,
        1000.0,
    )
    stamped = first["metadata"]["annotations"]
    assert stamped[ANNOTATION_TEMPLATE_CHANGED] == "1970-01-01T00:16:40Z"
    live = {**first, "metadata": {**first["metadata"], "labels": {**first["metadata"]["labels"], "team": "ml"}}}
    more = pool(nodePool={"enabled": True, "nodeClassRef": node_class, "requirements": typo, "limits": {"cpu": "64"}})
    assert builders.stamp_template(builders.node_pool(more), live, 2000.0)["metadata"]["annotations"] == stamped
    fixed = pool(nodePool={"enabled": True, "nodeClassRef": node_class})
    moved = builders.stamp_template(builders.node_pool(fixed), live, 3000.0)["metadata"]["annotations"]
    assert moved[ANNOTATION_TEMPLATE_CHANGED] == "1970-01-01T00:50:00Z"
    assert moved[ANNOTATION_TEMPLATE_HASH] != stamped[ANNOTATION_TEMPLATE_HASH]
