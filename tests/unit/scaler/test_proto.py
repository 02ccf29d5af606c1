"""The committed gRPC stubs match externalscaler.proto, and the proto matches KEDA's wire facts."""

import pytest

from tidegate.scaler.proto import externalscaler_pb2 as pb
from tidegate.scaler.proto import generate


def test_committed_stubs_match_the_proto() -> None:
    pytest.importorskip("grpc_tools")
    for name, text in generate.generate().items():
        committed = (generate.HERE / name).read_text()
        assert generate.comparable(committed) == generate.comparable(text), (
            f"{name} is stale: run `python -m tidegate.scaler.proto.generate` and commit the result"
        )


def test_field_numbers_are_kedas() -> None:
    # KEDA's pkg/scalers/externalscaler/externalscaler.proto (v2.17+): a wrong number here is silently wrong data
    def numbers(message: type) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(pb.ScaledObjectRef) == {"name": 1, "namespace": 2, "scalerMetadata": 3}
    assert numbers(pb.IsActiveResponse) == {"result": 1}
    assert numbers(pb.GetMetricSpecResponse) == {"metricSpecs": 1}
    assert numbers(pb.MetricSpec) == {"metricName": 1, "targetSize": 2, "targetSizeFloat": 3}
    assert numbers(pb.GetMetricsRequest) == {"scaledObjectRef": 1, "metricName": 2}
    assert numbers(pb.GetMetricsResponse) == {"metricValues": 1}
    assert numbers(pb.MetricValue) == {"metricName": 1, "metricValue": 2, "metricValueFloat": 3}
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"
    methods = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert methods == {
        "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
        "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
        "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
        "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    }
