"""How a Kubernetes Pod becomes a PodInfo (role, readiness, address); no API server needed."""

import datetime

from kubernetes.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodStatus

from tidegate.scaler.kube import pod_info


def pod(name: str = "small-0", role: str | None = "active", ready: str = "True", ip: str | None = "10.0.0.7", **kw):
    labels = {"tidegate.dev/pool": "small"} | ({"tidegate.dev/role": role} if role else {})
    meta = V1ObjectMeta(name=name, labels=labels, deletion_timestamp=kw.get("deleted"))
    status = V1PodStatus(
        phase=kw.get("phase", "Running"), pod_ip=ip, conditions=[V1PodCondition(type="Ready", status=ready)]
    )
    return V1Pod(metadata=meta, status=status)


def test_ready_active_pod_has_an_address_on_the_sidecar_port() -> None:
    info = pod_info(pod())
    assert info is not None and (info.role, info.ready) == ("active", True)
    assert info.base_url(8080) == "http://10.0.0.7:8080"


def test_warm_and_unready_pods_keep_their_role_and_readiness() -> None:
    warm = pod_info(pod(role="warm"))
    starting = pod_info(pod(ready="False", ip=None))
    assert warm is not None and warm.warm and not warm.active
    assert starting is not None and not starting.ready and starting.base_url(8080) == ""


def test_pods_without_a_role_label_are_active_and_ipv6_is_bracketed() -> None:
    info = pod_info(pod(role=None, ip="fd00::7"))
    assert info is not None and info.active and info.base_url(8080) == "http://[fd00::7]:8080"


def test_terminating_and_finished_pods_do_not_count() -> None:
    assert pod_info(pod(deleted=datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC))) is None
    assert pod_info(pod(phase="Failed")) is None


def test_the_serving_label_says_which_warm_pods_the_service_sends_requests_to() -> None:
    def labelled(role: str, serving: str | None):
        p = pod(role=role)
        if serving is not None:
            p.metadata.labels["tidegate.dev/serving"] = serving
        info = pod_info(p)
        assert info is not None
        return info

    assert labelled("warm", "true").serving and labelled("warm", "true").in_service
    assert not labelled("warm", "false").in_service and not labelled("warm", None).in_service
    assert labelled("active", None).in_service  # an active pod serves whatever its label says
    assert not labelled("draining", "true").in_service  # out of the Service to finish what it holds
