"""Every InferencePool example is valid against the API models, and GitOps examples leave replicas to KEDA."""

import pathlib

import pytest
import yaml

from tests.unit.chart.helm import render
from tidegate.api.pool import InferencePool
from tidegate.api.serving import Engine

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


def _docs(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _pools() -> list[tuple[str, dict]]:
    return [
        (str(p.relative_to(EXAMPLES)), d)
        for p in sorted(EXAMPLES.rglob("*.yaml"))
        for d in _docs(p)
        if d.get("kind") == "InferencePool"
    ]


@pytest.mark.parametrize(("path", "doc"), _pools(), ids=[p for p, _ in _pools()])
def test_pool_example_is_valid(path: str, doc: dict) -> None:
    pool = InferencePool.model_validate(doc)
    concurrency = pool.spec.admission.max_concurrency
    assert concurrency is None or concurrency >= 1  # unset: read from the model server's capacity


def test_one_example_per_engine_and_the_multi_tenant_one() -> None:
    pools = {path: InferencePool.model_validate(doc) for path, doc in _pools()}
    assert pools["vllm.yaml"].spec.model.engine is Engine.VLLM
    assert pools["vllm.yaml"].spec.server.gpus == 1
    assert "8B" in pools["vllm.yaml"].spec.model.name
    llama = pools["llamacpp.yaml"].spec
    assert llama.model.engine is Engine.LLAMACPP and {"--metrics", "--slots"} <= set(llama.server.args)
    assert pools["tgi.yaml"].spec.model.engine is Engine.TGI
    tenancy = pools["multi-tenant.yaml"].spec.admission.tenancy
    assert tenancy.identity.value == "header" and len({t.weight for t in tenancy.tenants}) > 1
    assert len(pools["multi-tenant.yaml"].spec.admission.priority_classes) >= 3


def test_pools_in_git_leave_replicas_to_the_autoscaler() -> None:
    for path, doc in _pools():
        if path.startswith("gitops/") or path in ("vllm.yaml",):
            assert "replicas" not in doc["spec"], path


def test_argocd_ignores_replica_drift_of_inferencepools() -> None:
    apps = _docs(EXAMPLES / "gitops/argocd/application.yaml")
    pools_app = next(a for a in apps if a["spec"]["source"]["path"] == "examples/gitops/pools")
    assert {"group": "tidegate.dev", "kind": "InferencePool", "jsonPointers": ["/spec/replicas"]} in pools_app["spec"][
        "ignoreDifferences"
    ]
    assert "RespectIgnoreDifferences=true" in pools_app["spec"]["syncPolicy"]["syncOptions"]
    assert (EXAMPLES / pools_app["spec"]["source"]["path"].removeprefix("examples/") / "kustomization.yaml").exists()


def test_flux_points_at_the_pools_folder_and_strips_replicas() -> None:
    docs = {d["kind"]: d for d in _docs(EXAMPLES / "gitops/flux/kustomization.yaml")}
    kustomization = docs["Kustomization"]
    assert kustomization["spec"]["path"] == "./examples/gitops/pools"
    patch = yaml.safe_load(kustomization["spec"]["patches"][0]["patch"])
    assert patch["spec"] == {"replicas": None}
    assert docs["HelmRelease"]["spec"]["chart"]["spec"]["chart"] == "charts/tidegate"


def _gitops_values() -> dict[str, dict]:
    argocd = next(a for a in _docs(EXAMPLES / "gitops/argocd/application.yaml") if a["spec"]["source"].get("helm"))
    flux = next(d for d in _docs(EXAMPLES / "gitops/flux/kustomization.yaml") if d["kind"] == "HelmRelease")
    return {"argocd": argocd["spec"]["source"]["helm"]["valuesObject"], "flux": flux["spec"]["values"]}


@pytest.mark.parametrize("tool", ["argocd", "flux"])
def test_gitops_chart_values_render(tmp_path: pathlib.Path, tool: str) -> None:
    """The chart renders with the values the GitOps examples give it (an image included: none is published)."""
    values = _gitops_values()[tool]
    assert values["image"]["repository"]
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    kinds = {d["kind"] for d in render("-f", str(tmp_path / "values.yaml"))}
    assert {"Deployment", "CustomResourceDefinition"} <= kinds
