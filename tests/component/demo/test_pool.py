"""The demo's pool follows ``spec.warmPool.serve`` as the operator does: under it a loaded warm pod is
labelled ``tidegate.dev/serving=true``, is in the Service and answers requests; without it, it is not."""

import asyncio
import time

import aiohttp
import pytest
import yaml

from tidegate.api.constants import ROLE_ACTIVE, ROLE_WARM
from tidegate.demo import scenario
from tidegate.demo.loadgen import LoadGenerator
from tidegate.demo.pool import Pool
from tidegate.demo.timeline import ADMITTED, Timeline
from tidegate.scaler.pods import StaticPodSource

pytestmark = pytest.mark.component


@pytest.mark.parametrize("serve", [True, False])
async def test_a_warm_pod_takes_requests_only_under_warm_pool_serve(tmp_path, serve: bool) -> None:
    # Input: 1 active + 1 warm replica, both loaded; 8 requests through the Service, 0.1 s apart.
    settings = scenario.DemoSettings(replicas=1, warm=1, serve=serve, live=False, out=tmp_path)
    config = tmp_path / "admission.yaml"
    config.write_text(yaml.safe_dump(scenario.admission_config(settings)), encoding="utf-8")
    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    timeline, source = Timeline(), StaticPodSource()
    async with aiohttp.ClientSession() as http:
        pool = Pool(settings, config, tmp_path, clock, timeline, source, http)
        await pool.start()
        try:
            for _ in range(5):  # the operator's reconciles (0.2 s apart, as in the demo): label, probe, join
                await pool.reconcile()
                await asyncio.sleep(0.2)
            warm = next(p for p in pool.pods if p.role == ROLE_WARM)
            arrivals = [scenario.Arrival(clock() + 0.1 * i, "acme", scenario.INTERACTIVE) for i in range(8)]
            load = LoadGenerator(arrivals, pool.endpoints, timeline, clock, http, role_of=pool.role_of)
            await load.run()
            assert await load.drain(timeout_s=15.0) == 0
            info = {p.name: p for p in await source.pods(scenario.NAMESPACE, scenario.POOL)}
            labels = warm.labels_file.read_text(encoding="utf-8")
        finally:
            await pool.stop()

    assert [o.kind for o in timeline.outcomes] == [ADMITTED] * 8
    roles = [o.role for o in timeline.outcomes]
    assert f'tidegate.dev/serving="{str(serve).lower()}"' in labels
    assert info[warm.name].serving is serve  # the scaler counts its load as a serving pod's
    if serve:
        assert roles.count(ROLE_WARM) == 4 and roles.count(ROLE_ACTIVE) == 4  # round robin over both pods
    else:
        assert roles == [ROLE_ACTIVE] * 8
