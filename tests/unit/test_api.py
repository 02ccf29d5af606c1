"""The InferencePool models: defaults a platform engineer relies on, and refusals that name the field."""

import pathlib

import pydantic
import pytest
import yaml

from tests.invalid_pools import CASES, Case, build, valid_pool
from tidegate.api import InferencePool, InferencePoolSpec

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_minimal_example_is_valid_and_gets_documented_defaults() -> None:
    doc = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    pool = InferencePool.model_validate(doc)
    spec = pool.spec
    assert spec.replicas == 1
    assert spec.warm_pool.size == 1
    assert (spec.admission.kv_cache.trip, spec.admission.kv_cache.resume) == (0.92, 0.85)
    breaker = spec.admission.circuit_breaker
    assert (breaker.cooldown_seconds, breaker.max_cooldown_seconds, breaker.half_open_requests) == (60, 300, 5)
    assert spec.admission.tenancy.borrowing_cap == 1.5
    assert [c.value for c in spec.node_pool.capacity_types] == ["on-demand"]
    assert [c.name for c in spec.admission.priority_classes] == ["interactive", "batch"]


def test_budget_and_concurrency_default_to_the_engine_and_adapt() -> None:
    spec = InferencePoolSpec.model_validate(
        {"model": {"name": "m", "maxContextTokens": 100_000}, "server": {"image": "i"}}
    )
    # unset: read from the model server, so no fixed default can contradict a long context
    assert (spec.admission.token_budget, spec.admission.max_concurrency) == (None, None)
    assert spec.admission.adaptive_budget.enabled
    dumped = spec.model_dump(mode="json", exclude_none=True)
    assert "tokenBudget" not in dumped["admission"] and "maxConcurrency" not in dumped["admission"]
    with pytest.raises(pydantic.ValidationError, match="tokenBudget"):
        InferencePoolSpec.model_validate(
            {"model": {"name": "m", "maxContextTokens": 100_000}, "server": {"image": "i"},
             "admission": {"tokenBudget": 65_536}}
        )  # fmt: skip


def test_round_trip_uses_kubernetes_camel_case_names() -> None:
    spec = InferencePoolSpec.model_validate(valid_pool()["spec"])
    dumped = spec.model_dump(mode="json", exclude_none=True)
    assert "warmPool" in dumped and "nodePool" in dumped
    assert dumped["admission"]["kvCache"]["trip"] == 0.92
    assert InferencePoolSpec.model_validate(dumped) == spec


def test_snake_case_names_are_accepted_in_config_files() -> None:
    spec = InferencePoolSpec.model_validate(
        {"model": {"name": "m"}, "server": {"image": "i"}, "warm_pool": {"size": 3}}
    )
    assert spec.warm_pool.size == 3


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_pool_is_refused_naming_the_field(case: Case) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        InferencePool.model_validate(build(case))
    text = " ".join(".".join(map(str, e["loc"])) + " " + e["msg"] for e in info.value.errors())
    missing = [seg for seg in case.field.split(".") if seg not in text]
    assert not missing, f"error does not name {case.field}: {text}"


def test_at_least_ten_invalid_cases_cover_every_cel_rule() -> None:
    from tidegate.api import crd

    def rules(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [r["message"] for r in node.get("x-kubernetes-validations", [])]
            return found + [m for v in node.values() for m in rules(v)]
        if isinstance(node, list):
            return [m for v in node for m in rules(v)]
        return []

    messages = set(rules(crd.custom_resource_definition()))
    assert len(CASES) >= 10
    for message in messages:
        covered = [c for c in CASES if c.field.rsplit(".", 1)[-1] in message or message.split()[0] in c.field]
        assert covered, f"no invalid case exercises the CEL rule {message!r}"
