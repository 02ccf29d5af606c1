"""No published image exists: the chart refuses to render without one and says how to build it."""

import yaml

from tests.unit.chart.helm import CHART, IMAGE, helm, render


def _error(*args: str) -> str:
    result = helm("template", "tg", str(CHART), *args)
    assert result.returncode != 0, "rendered, but should have failed"
    return result.stderr


def test_no_image_fails_with_how_to_build_and_push_one() -> None:
    message = _error()
    assert "image.repository is not set, and tidegate publishes no image" in message
    assert "docker build -t REGISTRY/tidegate:0.1.0 . && docker push REGISTRY/tidegate:0.1.0" in message
    assert "--set image.repository=REGISTRY/tidegate" in message


def test_a_tag_inside_the_repository_is_refused() -> None:
    assert "carries a tag or digest" in _error("--set", "image.repository=registry.example/tidegate:0.1.0")
    assert "carries a tag or digest" in _error("--set", "image.repository=registry.example/tidegate@sha256:00")


def test_the_image_chosen_runs_everything() -> None:
    docs = render("--set", "image.repository=registry.example:5000/team/tidegate")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    images = {c["image"] for d in deployments.values() for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example:5000/team/tidegate:0.1.0"}
    operator = deployments["tg-tidegate-operator"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["TIDEGATE_SIDECAR_IMAGE"] == "registry.example:5000/team/tidegate:0.1.0"  # the admission sidecar


def test_the_crd_alone_needs_no_image() -> None:
    docs = render("--set", "operator.enabled=false", "--set", "scaler.enabled=false", "--set", "crds.install=true")
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition"}
    assert not [d for d in docs if d["kind"] == "Deployment"]


def test_the_default_values_choose_no_image_and_document_the_build() -> None:
    values_text = (CHART / "values.yaml").read_text()
    assert yaml.safe_load(values_text)["image"]["repository"] == ""
    assert "docker build -t REGISTRY/tidegate:0.1.0 . && docker push REGISTRY/tidegate:0.1.0" in values_text
    readme = (CHART / "README.md").read_text()
    assert "docker build -t REGISTRY/tidegate:0.1.0 ." in readme and "image.repository=REGISTRY/tidegate" in readme
    assert "ghcr.io/tidegate" not in values_text + readme


def test_lint_passes_with_an_image() -> None:
    result = helm("lint", "--strict", str(CHART), *IMAGE)
    assert result.returncode == 0, result.stdout + result.stderr
