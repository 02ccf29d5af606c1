"""Every RPC of the scaler through a real gRPC client, including the errors KEDA will log."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.component.scaler.conftest import NAMESPACE, POOL, Rig
from tidegate.scaler.pods import PodInfo
from tidegate.scaler.proto import externalscaler_pb2 as pb


async def test_metric_spec_is_static_and_needs_no_backend(rig: Rig) -> None:
    rig.source.failing = True  # the API server is gone: GetMetricSpec must still answer
    resp = await rig.stub.GetMetricSpec(rig.ref())
    (spec,) = resp.metricSpecs
    assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (f"tidegate-{POOL}-desired-replicas", 1, 1.0)


async def test_get_metrics_and_is_active_answer_for_a_busy_pool(rig: Rig) -> None:
    assert await rig.desired() == 4.0  # first sample: hold the 4 replicas there are
    assert (await rig.stub.IsActive(rig.ref())).result is True
    rig.tick()
    req = pb.GetMetricsRequest(scaledObjectRef=rig.ref(), metricName=f"s0-tidegate-{POOL}-desired-replicas")
    (value,) = (await rig.stub.GetMetrics(req)).metricValues
    assert value.metricName == f"tidegate-{POOL}-desired-replicas"
    assert (value.metricValue, value.metricValueFloat) == (4, 4.0)


@pytest.mark.parametrize("rpc", ["GetMetricSpec", "GetMetrics", "IsActive", "StreamIsActive"])
async def test_missing_pool_key_is_invalid_argument_naming_it(rig: Rig, rpc: str) -> None:
    ref = pb.ScaledObjectRef(name=POOL, namespace=NAMESPACE, scalerMetadata={"scalerAddress": "x"})
    request = pb.GetMetricsRequest(scaledObjectRef=ref) if rpc == "GetMetrics" else ref
    with pytest.raises(grpc.aio.AioRpcError) as info:
        call = getattr(rig.stub, rpc)(request)
        if rpc == "StreamIsActive":
            async for _ in call:
                pass
        else:
            await call
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'pool'" in info.value.details() and "required" in info.value.details()


async def test_bad_value_names_the_key_and_what_is_wrong(rig: Rig) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.GetMetricSpec(rig.ref(minReplicas="9", maxReplicas="3"))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "metadata 'minReplicas': scaling.minReplicas must be <= scaling.maxReplicas"


async def test_unknown_metric_is_not_found(rig: Rig) -> None:
    req = pb.GetMetricsRequest(scaledObjectRef=rig.ref(), metricName="s0-some-other-metric")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.GetMetrics(req)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def test_unlistable_pods_are_unavailable_so_keda_fallback_counts_them(rig: Rig) -> None:
    rig.source.failing = True
    for call in (rig.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=rig.ref())), rig.stub.IsActive(rig.ref())):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert f"{NAMESPACE}/{POOL}" in info.value.details()


async def test_stream_is_active_pushes_at_once_and_on_change(rig: Rig) -> None:
    # one replica: with more, an idle pool stays active (the HPA steps it down to one first)
    rig.source.set(NAMESPACE, POOL, [PodInfo(rig.pods[0].name, rig.pods[0].fake.url)])
    stream = rig.stub.StreamIsActive(rig.ref(minReplicas="0"))
    it = stream.__aiter__()
    assert (await asyncio.wait_for(it.__anext__(), 5)).result is True  # busy: in-flight tokens
    for p in rig.pods:
        p.in_flight_tokens = 0  # the pool goes idle; counters stop moving
    rig.tick()
    assert (await asyncio.wait_for(it.__anext__(), 5)).result is False
    stream.cancel()


async def test_streamed_metric_spec_is_unimplemented(rig: Rig) -> None:
    # KEDA's unreleased StreamMetricSpec: UNIMPLEMENTED makes KEDA fall back to polling
    call = rig.channel.unary_stream(
        "/externalscaler.ExternalScaler/StreamMetricSpec",
        request_serializer=pb.ScaledObjectRef.SerializeToString,
        response_deserializer=pb.GetMetricSpecResponse.FromString,
    )(rig.ref())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_health_service_reports_serving(rig: Rig) -> None:
    health = health_pb2_grpc.HealthStub(rig.channel)
    for service in ("", "externalscaler.ExternalScaler"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
