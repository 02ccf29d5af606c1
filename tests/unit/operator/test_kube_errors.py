"""A refusal by the API server carries its own message, not only the status code (issue 14 items 1, 5)."""

import json

import kubernetes
import pytest

from tidegate.operator.kube import Kube, Refused, api_message

pytestmark = pytest.mark.unit


def _exc(status: int, reason: str, body: str | None) -> kubernetes.client.ApiException:
    exc = kubernetes.client.ApiException(status=status, reason=reason)
    exc.body = body
    return exc


def test_the_api_servers_message_is_read_from_its_status_body() -> None:
    says = 'Service "llama-3.1-8b" is invalid: metadata.name: Invalid value: "llama-3.1-8b": a DNS-1035 label ...'
    exc = _exc(422, "Unprocessable Entity", json.dumps({"kind": "Status", "message": says}))
    assert api_message(exc) == says
    refused = Refused("Service", "llama-3.1-8b", exc)
    assert str(refused) == f"the API server refused Service llama-3.1-8b (422 Unprocessable Entity): {says}"
    assert isinstance(refused, kubernetes.client.ApiException) and refused.status == 422


def test_without_a_status_body_the_code_and_reason_are_the_message() -> None:
    assert api_message(_exc(503, "Service Unavailable", None)) == "503 Service Unavailable"
    assert api_message(_exc(500, "Internal Server Error", "not json")) == "500 Internal Server Error"


def test_a_server_side_apply_that_cannot_fit_the_schema_is_a_refusal_not_a_transient_error() -> None:
    """Seen with Karpenter v1.14.1: a NodePool budget with ``reasons: [Empty, Empty]`` (a list-type set)
    got a 500 on every apply, logged as a transient error every 5 s, the pool saying nothing."""
    says = (
        "failed to create typed patch object (/tidegate-t-llm; karpenter.sh/v1, Kind=NodePool): "
        '.spec.disruption.budgets[0].reasons: duplicate entries for key [value="Empty"]'
    )
    assert Refused.refuses(_exc(500, "Internal Server Error", json.dumps({"kind": "Status", "message": says})))
    assert not Refused.refuses(_exc(500, "Internal Server Error", json.dumps({"message": "etcdserver: timeout"})))
    assert not Refused.refuses(_exc(503, "Service Unavailable", None))
    assert Refused.refuses(_exc(422, "Unprocessable Entity", None))


class _NoEventsAllowed:
    def list_namespaced_event(self, namespace: str, field_selector: str) -> None:
        raise _exc(403, "Forbidden", json.dumps({"kind": "Status", "message": "events is forbidden"}))


def test_karpenters_events_the_operator_may_not_list_are_logged_and_read_as_none(caplog) -> None:
    # RBAC narrower than the chart's ClusterRole: the reconcile goes on with what the pods' Events say
    kube = Kube.__new__(Kube)  # no API server: only the core client is used
    kube.core, kube._events_unlisted = _NoEventsAllowed(), set()
    for _ in range(3):  # three reconciles
        assert kube.node_pool_events("tidegate-ns-p", "NoCompatibleInstanceTypes") == []
    (record,) = caplog.records  # once, not at every reconcile
    assert record.levelname == "WARNING"
    assert "cannot list Events in namespace default (Forbidden)" in record.getMessage()
