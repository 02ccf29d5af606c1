"""A warm replica serves when its pod is labelled ``tidegate.dev/serving=true`` (``spec.warmPool.serve``):
the Service sends it requests, so it must take them rather than answer 503 ``not_active`` (#13)."""

import asyncio

from tidegate.admission import config

from .helpers import chat, error_of, eventually

WARM_SERVING = 'tidegate.dev/pool="p"\ntidegate.dev/role="warm"\ntidegate.dev/serving="true"\n'
WARM_NOT_SERVING = 'tidegate.dev/pool="p"\ntidegate.dev/role="warm"\ntidegate.dev/serving="false"\n'


async def test_a_warm_sidecar_labelled_serving_admits_requests_and_is_ready(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    sim = await start_sim(decode_tokens_per_s=1000)
    labels = tmp_path / "labels"
    labels.write_text(WARM_SERVING)
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05)
    async with http.get(sidecar.url + "/readyz") as ready:
        assert ready.status == 200
        assert (await ready.json())["role"] == "warm"
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    assert sidecar.snapshot().role == "warm"  # still counted as a warm replica
    async with http.get(sidecar.url + "/tidegate/stats") as resp:  # and says it serves
        assert (await resp.json())["serving"] is True
    # spec.warmPool.serve flipped to false: the warm replica refuses again, as before
    labels.write_text(WARM_NOT_SERVING)
    await eventually(lambda: sidecar.in_service is False, what="the serving label reloaded")
    async with http.get(sidecar.url + "/readyz") as ready:
        assert ready.status == 503
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        assert error_of(await resp.json())["code"] == "not_active"
        assert resp.headers["Retry-After"] == "1"
    async with http.get(sidecar.url + "/tidegate/stats") as resp:
        assert (await resp.json())["serving"] is False


async def test_a_warm_sidecar_labelled_not_serving_refuses_503_not_active(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    sim = await start_sim()
    labels = tmp_path / "labels"
    labels.write_text(WARM_NOT_SERVING)
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05)
    async with http.post(sidecar.url + "/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503
        body = error_of(await resp.json())
        assert body["code"] == "not_active" and "'warm' role, not serving" in body["message"]


async def test_a_pushed_serving_state_serves_at_once_and_holds_until_the_labels_file_changes(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    """The operator flips ``serve`` on: the push takes the warm replica into service before the kubelet
    rewrites the labels file (up to about a minute); the file wins once it changes."""
    sim = await start_sim(decode_tokens_per_s=1000)
    labels = tmp_path / "labels"
    labels.write_text(WARM_NOT_SERVING)
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05)
    async with http.put(f"{sidecar.url}/tidegate/role", json={"role": "warm", "serving": True}) as resp:
        assert resp.status == 200
    async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    await asyncio.sleep(0.2)  # several reloads of the unchanged (stale) file: the push holds
    assert sidecar.serving
    labels.write_text('tidegate.dev/pool="p"\ntidegate.dev/role="draining"\ntidegate.dev/serving="false"\n')
    await eventually(lambda: not sidecar.serving, what="the labels file to win once it changes")
    async with http.put(f"{sidecar.url}/tidegate/role", json={"role": "warm", "serving": "yes"}) as resp:
        assert resp.status == 400
        assert error_of(await resp.json())["param"] == "serving"


def test_the_serving_label_is_read_with_the_role(tmp_path) -> None:
    labels = tmp_path / "labels"
    labels.write_text(WARM_SERVING)
    assert config.read_labels(labels) == config.PodLabels("warm", True)
    labels.write_text(WARM_NOT_SERVING)
    assert config.read_labels(labels) == config.PodLabels("warm", False)
    labels.write_text('tidegate.dev/role="active"\n')  # pods of an operator before the label
    assert config.read_labels(labels) == config.PodLabels("active", None)


async def test_a_push_the_labels_file_never_confirms_gives_way_to_the_file(
    start_sim, start_sidecar, http, tmp_path
) -> None:
    """``serve`` flipped off and on again within one kubelet sync, the second push lost (or the operator
    restarted between its patch and its push): the labels file still says ``serving="true"``, as at the
    first push, so it never changes; the pod stays Ready (``/tidegate/ready``) and labelled, so the Service
    keeps sending it requests. The push must not refuse them for good: the file wins after ``push_hold_s``
    (before: 503 ``not_active`` until the process restarted)."""
    sim = await start_sim(decode_tokens_per_s=1000)
    labels = tmp_path / "labels"
    labels.write_text(WARM_SERVING)
    sidecar = await start_sidecar(sim.url, labels_file=str(labels), reload_s=0.05, push_hold_s=0.5)
    async with http.put(f"{sidecar.url}/tidegate/role", json={"role": "warm", "serving": False}) as resp:
        assert resp.status == 200
    async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 503  # the push applies at once, ahead of the file
    await eventually(lambda: sidecar.serving, timeout_s=3.0, what="the unconfirmed push to give way to the file")
    async with http.post(f"{sidecar.url}/v1/chat/completions", json=chat(max_tokens=2)) as resp:
        assert resp.status == 200
    async with http.get(f"{sidecar.url}/readyz") as ready:
        assert ready.status == 200


def test_a_labels_file_that_is_not_utf8_reads_as_unknown_rather_than_raising(tmp_path) -> None:
    """The reload reads the labels before the config and the API keys: a raise there stopped both
    reloading (and the sidecar from starting), logging a traceback every second."""
    labels = tmp_path / "labels"
    labels.write_bytes(b'tidegate.dev/role="warm"\ntidegate.dev/serving="\xff"\n')
    assert config.read_labels(labels) == config.PodLabels("unknown")
