"""The sidecar's pure edges: reason -> HTTP mapping, config files, backend metric names, NVML, labels."""

import json
import pathlib
import sys
import types

import pytest
import yaml

from tidegate.admission import config, errors, telemetry
from tidegate.admission.metrics import OTHER, TenantLabels
from tidegate.admission.reasons import CAPACITY_REASONS, Reason
from tidegate.api.serving import Engine as BackendEngine


@pytest.mark.parametrize("reason", sorted(CAPACITY_REASONS))
def test_capacity_refusals_are_503_with_retry_headers(reason: Reason) -> None:
    status, headers, body = errors.rejection(reason, "full", 2.3)
    assert status == 503
    assert headers["Retry-After"] == "3" and headers["retry-after-ms"] == "2300"
    assert json.loads(body)["error"]["code"] == reason.value


@pytest.mark.parametrize(("reason", "status"), [(Reason.TENANT_RATE, 429), (Reason.TENANT_CONCURRENCY, 429),
                                                (Reason.NOT_ACTIVE, 503)])  # fmt: skip
def test_policy_refusals_that_a_retry_can_cure_carry_retry_after(reason: Reason, status: int) -> None:
    got, headers, _ = errors.rejection(reason, "slow down", 0.01)
    assert got == status
    assert headers["Retry-After"] == "1" and headers["retry-after-ms"] == str(errors.MIN_RETRY_MS)


@pytest.mark.parametrize(
    ("reason", "code", "status"),
    [(Reason.BAD_REQUEST, None, 400), (Reason.REQUEST_TOO_LARGE, "context_length_exceeded", 400),
     (Reason.REQUEST_TOO_LARGE, None, 413), (Reason.UNAUTHORIZED, None, 401)],
)  # fmt: skip
def test_final_refusals_carry_no_retry_headers(reason: Reason, code: str | None, status: int) -> None:
    got, headers, body = errors.rejection(reason, "no", None, code)
    assert got == status
    assert "Retry-After" not in headers
    err = json.loads(body)["error"]
    assert err["type"] in ("invalid_request_error", "authentication_error") and err["message"] == "no"


def test_every_reason_has_a_status() -> None:
    for reason in Reason:
        assert errors.status_of(reason) in (400, 401, 413, 429, 503)


def test_the_operators_config_document_parses(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "pool: small\nnamespace: team-a\nmodel: {name: m, engine: vllm, maxContextTokens: 8192}\n"
        "admission: {tokenBudget: 65536, queue: {maxDepth: 8}}\n"
    )
    cfg = config.load(path)
    assert cfg.pool == "small" and cfg.admission.queue.max_depth == 8 and cfg.model.max_context_tokens == 8192


def test_an_inference_pool_manifest_is_a_config_too() -> None:
    """``tidegate admission --config examples/multi-tenant.yaml`` uses the pool's model and admission."""
    examples = pathlib.Path(__file__).resolve().parents[3] / "examples"
    cfg = config.load(examples / "multi-tenant.yaml")
    docs = yaml.safe_load_all((examples / "multi-tenant.yaml").read_text())  # the pool and a NetworkPolicy
    doc = next(d for d in docs if d and d["kind"] == "InferencePool")
    assert cfg.pool == doc["metadata"]["name"] and cfg.model.name == doc["spec"]["model"]["name"]
    assert [t.name for t in cfg.admission.tenancy.tenants] == [
        t["name"] for t in doc["spec"]["admission"]["tenancy"]["tenants"]
    ]
    assert config.load(examples / "minimal.yaml").pool == "small"


def test_a_manifest_without_a_model_names_what_is_missing(tmp_path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("kind: InferencePool\nmetadata: {name: p}\nspec: {replicas: 1}\n")
    with pytest.raises(config.ConfigError, match=r"spec\.model"):
        config.load(path)


def test_sidecar_sections_misplaced_in_a_manifest_are_refused_not_ignored() -> None:
    # Beside kind: InferencePool, a top-level admission (or drainToken) is not read; running on
    # the defaults instead of the limits written there would go unnoticed.
    text = "kind: InferencePool\nmetadata: {name: p}\nspec: {model: {name: m}}\nadmission: {tokenBudget: 100}\n"
    with pytest.raises(config.ConfigError, match="admission"):
        config.parse(text)
    listed = "apiVersion: tidegate.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\nspec: {model: {name: m}}\n"
    assert config.parse(listed + "status: {activeReplicas: 1}\n").pool == "p"  # kubectl get -o yaml output


def test_another_api_groups_inference_pool_is_not_taken_for_the_pool() -> None:
    # The Gateway API inference extension also has a kind InferencePool; a file holding both is common.
    ours = "apiVersion: tidegate.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: ours}\nspec: {model: {name: m}}\n"
    gateway = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: gw}\nspec: {targetPorts: [{number: 8000}]}\n"
    assert config.parse(gateway + "---\n" + ours).pool == "ours"
    with pytest.raises(config.ConfigError, match=r"inference\.networking\.k8s\.io"):
        config.parse(gateway)


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "model: {}", "model: {name: m}\nadmission: {tokenBudget: 0}", "a: [", "model: {name: m}\nextra: 1"],
)
def test_bad_config_files_name_the_problem(tmp_path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert str(path) in str(err.value)


def test_watcher_keeps_the_last_good_config(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: m}\nadmission: {tokenBudget: 100}\n")
    watcher = config.ConfigWatcher(path)
    assert watcher.poll() is None  # unchanged
    path.write_text("model: {name: m}\nadmission: {tokenBudget: -1}\n")
    assert watcher.poll() is None and watcher.last_error
    assert watcher.config.admission.token_budget == 100
    path.write_text("model: {name: m}\nadmission: {tokenBudget: 200}\n")
    assert watcher.poll().admission.token_budget == 200


def test_role_from_downward_api_labels(tmp_path) -> None:
    labels = tmp_path / "labels"
    labels.write_text('app.kubernetes.io/name="x"\ntidegate.dev/role="warm"\n')
    assert config.read_role(labels) == "warm"
    labels.write_text('app="x"\n')
    assert config.read_role(labels) == "active"
    assert config.read_role(None) == "active"
    assert config.read_role(tmp_path / "missing") == "unknown"


VLLM = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m"} 1234.0
"""
VLLM_OLD = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.7\n'
LLAMACPP = "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 99\n"


def test_backend_metric_names_by_engine() -> None:
    reading = telemetry.parse_backend_metrics(VLLM, BackendEngine.VLLM)
    assert reading.kv_cache_usage == 0.42 and reading.generation_tokens_total == 1234.0
    assert telemetry.parse_backend_metrics(VLLM_OLD, BackendEngine.VLLM).kv_cache_usage == 0.7
    llama = telemetry.parse_backend_metrics(LLAMACPP, BackendEngine.LLAMACPP)
    assert llama.kv_cache_usage is None and llama.generation_tokens_total == 99
    assert telemetry.parse_backend_metrics(VLLM, BackendEngine.OPENAI).kv_cache_usage is None


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-0.1", "1.5", "92"])
def test_a_kv_gauge_that_is_not_a_ratio_is_missing_not_zero_or_full(bad: str) -> None:
    text = f'vllm:kv_cache_usage_perc{{model_name="a"}} 0.3\nvllm:kv_cache_usage_perc{{model_name="b"}} {bad}\n'
    text += 'vllm:generation_tokens_total{model_name="a"} 7\n'
    problems: list[telemetry.Problem] = []
    reading = telemetry.parse_backend_metrics(text, BackendEngine.VLLM, problems)
    assert reading.kv_cache_usage is None  # one nonsense series: the max is unknown
    assert reading.generation_tokens_total == 7  # token progress is still read
    invalid = [p for p in problems if p.kind is telemetry.ErrorKind.INVALID_VALUE]
    assert len(invalid) == 1 and invalid[0].message.startswith("vllm:kv_cache_usage_perc=")
    rounding = telemetry.parse_backend_metrics("vllm:kv_cache_usage_perc 1.0000001\n", BackendEngine.VLLM)
    assert rounding.kv_cache_usage == 1.0


def _fake_pynvml(monkeypatch: pytest.MonkeyPatch, devices: list[tuple[int, int, int]]) -> None:
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(devices)
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=devices[h][0], total=devices[h][1])
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=devices[h][2])
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 1 << h
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_nvml_reads_the_worst_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, [(50, 100, 30), (99, 100, 90)])
    nvml = telemetry.Nvml()
    reading = nvml.read()
    assert nvml.available and reading is not None
    assert reading.memory_usage == 0.99 and reading.utilization == 0.9 and reading.throttle_reasons == 0b11
    nvml.close()
    assert nvml.read() is None


def test_no_gpu_means_no_gpu_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, [])
    nvml = telemetry.Nvml()
    assert not nvml.available and nvml.read() is None and "no GPU" in nvml.why_not


def test_tenant_labels_are_bounded_and_stable() -> None:
    labels = TenantLabels(2, ["vip"])
    assert [labels.label(t) for t in ("a", "b", "vip", "a")] == ["a", OTHER, "vip", "a"]


def test_api_keys_map_to_tenants_by_digest_and_reload(tmp_path) -> None:
    import hashlib

    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    (tmp_path / "acme").write_text(f"# acme's keys\n{digest('sk-acme-1')}\n{digest('sk-acme-2').upper()}\n")
    (tmp_path / "..data").mkdir()  # a Secret volume's bookkeeping is not a tenant
    keys = config.ApiKeys(tmp_path)
    assert keys.tenant("Bearer sk-acme-1") == keys.tenant("bearer sk-acme-2") == "acme"
    assert keys.tenant("Bearer sk-nobody") is None
    assert keys.tenant(None) is None and keys.tenant("Basic abc") is None and keys.tenant("Bearer ") is None
    assert not keys.reload()  # unchanged
    (tmp_path / "globex").write_text(digest("sk-globex") + "\n")
    assert keys.reload()
    assert keys.tenant("Bearer sk-globex") == "globex"
    assert config.ApiKeys(None).tenant("Bearer sk-acme-1") is None
