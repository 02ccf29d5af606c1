"""The sidecar's gauges carry ``pool`` like its counters, and upstream answers are counted by status."""

from prometheus_client.parser import text_string_to_metric_families

from .helpers import chat

URL = "/v1/chat/completions"


async def _families(http, url: str) -> dict:
    async with http.get(url + "/metrics") as m:
        return {f.name: f for f in text_string_to_metric_families(await m.text())}


async def test_every_sidecar_series_names_its_pool(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    async with http.post(sidecar.url + URL, json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    families = await _families(http, sidecar.url)
    for name in ("tidegate_admission_in_flight_tokens", "tidegate_admission_in_flight_requests",
                 "tidegate_admission_queue_depth", "tidegate_admission_token_budget",
                 "tidegate_admission_breaker_state", "tidegate_backend_kv_cache_usage_ratio"):  # fmt: skip
        assert families[name].samples, name
    unlabelled = [
        (family.name, sample.labels)
        for family in families.values()
        if family.name.startswith(("tidegate_admission", "tidegate_backend", "tidegate_gpu"))
        for sample in family.samples
        if sample.labels.get("pool") != "test"
    ]
    assert unlabelled == []


async def test_upstream_answers_are_counted_by_status(start_sim, start_sidecar, http) -> None:
    sim = await start_sim()
    sidecar = await start_sidecar(sim.url)
    for faults, status in (
        ({}, 200),
        ({}, 200),
        ({"reject_rate": 1.0}, 429),
        ({"reject_rate": 0, "error_rate": 1.0}, 500),
    ):
        if faults:
            async with http.post(sim.url + "/sim/faults", json=faults) as r:
                assert r.status == 200
        async with http.post(sidecar.url + URL, json=chat(max_tokens=2)) as resp:
            assert resp.status == status
    samples = {
        s.labels["code"]: s.value
        for s in (await _families(http, sidecar.url))["tidegate_admission_upstream_responses"].samples
        if s.name.endswith("_total")
    }
    assert samples == {"200": 2.0, "429": 1.0, "500": 1.0}
