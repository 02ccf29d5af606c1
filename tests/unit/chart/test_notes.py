"""What `helm install` prints: commands that work against this chart, on a clean cluster."""

import pathlib

from tests.unit.chart.helm import IMAGE, PROMETHEUS_OPERATOR, notes
from tidegate.api import crd


def test_traffic_goes_to_the_service_port_80(tmp_path: pathlib.Path) -> None:
    text = " ".join(notes(tmp_path, *IMAGE).split())
    assert "Send traffic to the pool's Service on port 80" in text
    assert "http://<name>.<namespace>.svc/v1/chat/completions" in text
    assert "the admission sidecar, port 8081 in each active pod" in text
    assert "Service (the sidecar port 8081)" not in text


def test_no_url_of_an_unpublished_repository(tmp_path: pathlib.Path) -> None:
    text = notes(tmp_path, *IMAGE)
    assert "raw.githubusercontent.com" not in text and "ghcr.io" not in text
    assert "kubectl apply -f examples/vllm.yaml" in text
    assert "image registry.example/team/tidegate:0.1.0" in text


def test_pools_are_named_unambiguously(tmp_path: pathlib.Path) -> None:
    """Beside the Gateway API Inference Extension, plain `inferencepools` may mean its kind."""
    text = notes(tmp_path, *IMAGE)
    assert "inferencepools.tidegate.dev" in text
    assert "kubectl get tgpool -o wide" in text
    assert "get inferencepools " not in text and "get inferencepool\n" not in text
    wide = [c["name"] for c in crd.PRINTER_COLUMNS if c.get("priority") == 1]
    assert "kubectl get tgpool -o wide      # + " + ", ".join(wide) + "\n" in text


def test_alerts_are_named_when_enabled(tmp_path: pathlib.Path) -> None:
    text = notes(tmp_path, *IMAGE, *PROMETHEUS_OPERATOR, "--set", "alerts.enabled=true")
    assert "Alerts: PrometheusRule tg-tidegate-alerts" in text
    assert "docs/troubleshooting.md" in text
