"""The config file is reloaded in place without dropping requests; a bad edit keeps the old one."""

import json

from .helpers import MODEL, chat, eventually, sse_events


def write(path, budget: int) -> None:
    doc = {"pool": "p", "namespace": "ns", "model": {"name": MODEL, "maxContextTokens": 32768},
           "admission": {"tokenBudget": budget, "telemetry": {"pollIntervalMs": 50}}}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # atomic, like a ConfigMap's symlink swap


async def test_reload_keeps_in_flight_requests(start_sim, start_sidecar, http, tmp_path) -> None:
    sim = await start_sim(decode_tokens_per_s=50)
    path = tmp_path / "config.yaml"
    write(path, 65536)
    sidecar = await start_sidecar(sim.url, config_path=str(path), reload_s=0.05)
    resp = await http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=30, stream=True))
    await sse_events(resp, limit=2)
    write(path, 40000)
    await eventually(lambda: sidecar.engine.admission.token_budget == 40000, what="new budget in force")
    events = await sse_events(resp)  # the stream goes on to its end
    assert events[-1][1] == "[DONE]"
    resp.release()
    await eventually(lambda: sidecar.engine.in_flight_requests == 0)

    path.write_text("admission: {tokenBudget: -5}\nmodel: {name: x}\n")  # invalid edit
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as ok:
        assert ok.status == 200
    assert sidecar.engine.admission.token_budget == 40000
    async with http.get(sidecar.url + "/tidegate/stats") as stats:
        assert (await stats.json())["token_budget"] == 40000
