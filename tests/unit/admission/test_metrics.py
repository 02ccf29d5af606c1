"""Label values of the sidecar's metrics stay bounded whatever a client or a model server sends."""

import pytest

from tidegate.admission.metrics import status_label


@pytest.mark.parametrize(
    ("status", "label"),
    [(200, "200"), (429, "429"), (503, "503"), (201, "2xx"), (302, "3xx"), (418, "4xx"), (599, "5xx"), (999, "5xx")],
)
def test_upstream_status_label_is_a_common_code_or_its_class(status: int, label: str) -> None:
    assert status_label(status) == label
