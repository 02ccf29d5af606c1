"""A serving warm replica end to end (``spec.warmPool.serve``, #13): the operator labels the warm pod
``tidegate.dev/serving=true``, the pod's real sidecar (run by the pod agent from its labels file and the
operator's push) answers requests in the warm role, and turning ``serve`` off takes it out again.

Nothing scales the pool here (no load; minReplicas is its replicas): the point is who serves, not how many.
"""

import aiohttp

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import pool_body
from tests.e2e.harness import load
from tidegate.api import GROUP, PLURAL, VERSION, constants


async def test_a_serving_warm_replica_answers_requests_until_serve_is_turned_off(pools, endpoints) -> None:
    body = pool_body("sw", replicas=1, warm=1, max_replicas=2)
    body["spec"]["warmPool"]["serve"] = True
    name = pools.create(body)
    pools.wait_serving(name, active=1, warm=1)
    agent = pools.launcher.agent

    def warm_pod():
        return next((p for p in agent.running(name).values() if p.role == constants.ROLE_WARM), None)

    warm = wait_for(lambda: (p := warm_pod()) and p.ready and p, what="the warm replica ready (/readyz 200)")
    wait_for(lambda: len(endpoints(name)()) == 2, what="the active and the warm replica behind the Service")
    assert warm.url in endpoints(name)()

    async with aiohttp.ClientSession() as http:
        client = load.Client(endpoints(name), http)
        served = await client.send("acme", url=warm.url)
        assert served.status == 200 and served.done and served.tokens > 0, served

        pools.custom.patch_namespaced_custom_object(
            GROUP, VERSION, pools.namespace, PLURAL, name, {"spec": {"warmPool": {"serve": False}}}
        )
        wait_for(lambda: endpoints(name)() and warm.url not in endpoints(name)(), what="the warm replica out")
        refused = await client.send("acme", url=warm.url)  # a client that still holds its address
        assert (refused.status, refused.reason) == (503, "not_active"), refused
        assert warm_pod() is not None and warm_pod().name == warm.name  # the same pod: nothing rolled
