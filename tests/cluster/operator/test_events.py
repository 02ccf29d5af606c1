"""The operator's Events on a real API server: a repeat is counted, not posted again.

A replica loading for minutes made the scaler repeat "holding: 1 replica(s) loading, none active
yet" at every poll, and the operator posted one Event per poll (~every 5 s; issue 12's break-it
review). Kubernetes' own components fold repeats into one Event whose count grows
(client-go's EventCorrelator); ``kubectl describe`` then shows "x3 over 10s".
"""

import kubernetes

from tests.invalid_pools import valid_pool
from tidegate.api import GROUP, PLURAL, VERSION
from tidegate.operator.kube import Kube


def _pool_events(api_client, namespace: str, name: str) -> list[kubernetes.client.CoreV1Event]:
    core = kubernetes.client.CoreV1Api(api_client)
    return core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items


def test_a_repeated_event_is_one_event_with_a_count_and_a_new_message_is_another(api_client, namespace):
    # input: one pool; the same Normal "Scaled" message three times, then another message once
    pool = kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, valid_pool("events")
    )
    kube = Kube(api_client, "tidegate-test")
    holding = "scaler: holding: 1 replica(s) loading, none active yet"
    for _ in range(3):
        kube.event(pool, "Scaled", holding)
    kube.event(pool, "Scaled", "scaler: 1 -> 2: capacity reject 30% across 1 tenant")

    # expected: two Events on the pool, the repeated one counted three times
    events = {e.message: e for e in _pool_events(api_client, namespace, "events")}
    assert sorted(events) == sorted([holding, "scaler: 1 -> 2: capacity reject 30% across 1 tenant"])
    assert events[holding].count == 3
    assert events[holding].last_timestamp >= events[holding].first_timestamp


def test_a_repeat_after_the_event_expired_posts_a_new_one(api_client, namespace):
    # input: an Event posted, then deleted (as the API server does after its TTL), then repeated
    pool = kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, valid_pool("expired")
    )
    kube = Kube(api_client, "tidegate-test")
    kube.event(pool, "Scaled", "promoted 1 warm replica(s): 1 -> 2 active")
    (first,) = _pool_events(api_client, namespace, "expired")
    kubernetes.client.CoreV1Api(api_client).delete_namespaced_event(first.metadata.name, namespace)
    kube.event(pool, "Scaled", "promoted 1 warm replica(s): 1 -> 2 active")

    # expected: the repeat is not lost: one new Event, counted once
    (again,) = _pool_events(api_client, namespace, "expired")
    assert again.metadata.name != first.metadata.name
    assert again.count == 1
