"""Benchmark: warm-pool promotion latency and reconcile time of the operator on the local cluster.

    python bench/operator_promotion.py [--promotions 20] [--pools 1,10,100]

Starts (or reuses) the local control plane (e2e/cluster/cluster.sh), runs `tidegate operator`
as a subprocess, and prints two tables:

1. promotion: time from the write to ``/scale`` (``spec.replicas`` 1 -> 2) until a warm pod is
   labelled ``active``, i.e. selected by the pool's Service. Target: p50 <= 2 s. (The
   EndpointSlice step after that cannot be observed here: kwok's pod IPs are loopback so that
   nothing leaves this machine, and EndpointSlices refuse loopback addresses. On a real
   cluster that step is the EndpointSlice controller's, typically well under a second.)
2. reconcile: time from creating N pools at once until every one has Ready=True and its
   pods in their roles, and that time per pool.

kwok runs no containers, so this measures the control loop (watch -> reconcile -> label ->
endpoints), not a model server. Not a CI gate.
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid

import kubernetes

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tidegate.api import GROUP, PLURAL, VERSION, constants  # noqa: E402


def cluster() -> str:
    out = subprocess.run([str(REPO / "e2e/cluster/cluster.sh"), "up"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def pool(name: str, replicas: int, warm: int, gpus: int = 1) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "warmPool": {"size": warm},
            "model": {"name": "bench"},
            # Tolerate the GPU taint even without GPUs, so 200 pods can spread over all five nodes.
            "server": {
                "image": "bench",
                "gpus": gpus,
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "scaling": {"keda": False, "maxReplicas": 16},
        },
    }


def wait(pred, timeout_s: float = 60.0, interval_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError


def roles(core, ns: str, name: str) -> dict[str, str]:
    pods = core.list_namespaced_pod(ns, label_selector=f"{constants.LABEL_POOL}={name}").items
    return {
        p.status.pod_ip: p.metadata.labels.get(constants.LABEL_ROLE) for p in pods if not p.metadata.deletion_timestamp
    }


def selected(core, ns: str, name: str) -> set[str]:
    """Pods the pool's Service selects (its own selector, tidegate.dev/serving=true; not being deleted)."""
    selector = core.read_namespaced_service(name, ns).spec.selector
    pods = core.list_namespaced_pod(ns, label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items
    return {p.metadata.name for p in pods if not p.metadata.deletion_timestamp}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def bench_promotion(api, ns: str, n: int) -> None:
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool("promo", 1, 3))
    wait(lambda: sorted(roles(core, ns, "promo").values()) == ["active", "warm", "warm", "warm"])
    latencies = []
    for _ in range(n):
        start = time.monotonic()
        custom.patch_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "promo", {"spec": {"replicas": 2}})
        wait(lambda: len(selected(core, ns, "promo")) == 2)
        latencies.append(time.monotonic() - start)
        custom.patch_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "promo", {"spec": {"replicas": 1}})
        wait(lambda: sorted(roles(core, ns, "promo").values()) == ["active", "warm", "warm", "warm"], timeout_s=30)
    print(f"\npromotion latency over {n} scale-ups (1 -> 2 active, warm pool 3), seconds")
    print(f"{'measure':<40}{'p50':>8}{'p90':>8}{'max':>8}")
    label = "/scale write -> warm pod in the Service"
    print(f"{label:<40}{pct(latencies, 50):>8.3f}{pct(latencies, 90):>8.3f}{max(latencies):>8.3f}")


def bench_reconcile(api, counts: list[int]) -> None:
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    print("\nreconcile: N pools created at once -> all Ready with pods in their roles")
    print(f"{'pools':>6}{'total s':>10}{'s per pool':>12}")
    for n in counts:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        start = time.monotonic()
        for i in range(n):
            # No GPUs: 100 pools x 2 pods would not fit the 32 fake GPUs, and scheduling is not what is measured.
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool(f"p{i}", 1, 1, gpus=0))

        def all_ready(ns: str = ns, n: int = n) -> bool:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            ready = [
                p
                for p in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", [])
                )
                and p["status"].get("warmReplicas") == 1
            ]
            return len(ready) == n

        try:
            wait(all_ready, timeout_s=600, interval_s=0.2)
            total = time.monotonic() - start
            print(f"{n:>6}{total:>10.2f}{total / n:>12.3f}")
        finally:
            core.delete_namespace(ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--promotions", type=int, default=20)
    parser.add_argument("--pools", default="1,10,100")
    args = parser.parse_args()
    kubeconfig = cluster()
    api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "TIDEGATE_DRAIN_TIMEOUT_SECONDS": "0.5",
        "TIDEGATE_REQUIRE_SCALER": "false",
    }
    op = subprocess.Popen(
        [sys.executable, "-m", "tidegate.cli.main", "operator"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    try:
        bench_promotion(api, ns, args.promotions)
        bench_reconcile(api, [int(x) for x in args.pools.split(",") if x])
    finally:
        op.terminate()
        try:
            op.wait(timeout=15)
        except subprocess.TimeoutExpired:
            op.kill()
            op.wait()
        core.delete_namespace(ns)


if __name__ == "__main__":
    main()
