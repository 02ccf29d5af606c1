"""A refusal by the API server carries its own message, not only the status code (issue 14 items 1, 5)."""

import json

import kubernetes
import pytest

from tidegate.operator.kube import Refused, api_message

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
