"""A deleted pool leaves nothing behind: its Deployment, Service, ConfigMap, ScaledObject, the HPA
the real KEDA built from it, pods, and the processes that served them."""

import kubernetes

from tests.cluster.conftest import wait_for
from tests.e2e.conftest import pool_body
from tests.e2e.harness import procs


def _gone(read) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        return exc.status == 404
    return False


def test_deleting_the_pool_removes_everything(pools) -> None:
    name = pools.create(pool_body("gone", replicas=1, warm=1, max_replicas=2))
    pools.wait_serving(name, active=1, warm=1)
    ns, api = pools.namespace, pools.launcher.api_client
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    autoscaling = kubernetes.client.AutoscalingV2Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    children = {
        "Deployment": lambda: apps.read_namespaced_deployment(name, ns),
        "Service": lambda: core.read_namespaced_service(name, ns),
        "ConfigMap": lambda: core.read_namespaced_config_map(f"{name}-admission", ns),
        "ScaledObject": lambda: custom.get_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", name),
        "HPA (KEDA's)": lambda: autoscaling.read_namespaced_horizontal_pod_autoscaler(f"keda-hpa-{name}", ns),
    }
    wait_for(lambda: not any(_gone(read) for read in children.values()), timeout_s=60, what="every child")
    running = pools.launcher.agent.running(name)
    assert len(running) == 2
    pids = [proc for pod in running.values() for proc in (pod.sim, pod.sidecar)]

    pools.delete(name)

    for kind, read in children.items():
        wait_for(lambda read=read: _gone(read), timeout_s=30, what=f"the {kind} deleted")
    wait_for(lambda: not pools.roles(name), timeout_s=30, what="the pods deleted")
    wait_for(lambda: not pools.launcher.agent.running(name), timeout_s=30, what="the pod processes stopped")
    assert all(proc.poll() is not None for proc in pids)
    assert not any(procs.port_open(pod.ip, pod.sidecar_port) for pod in running.values())
