"""``tidegate scaler``: run the KEDA external scaler.

Settings are parsed once here into :class:`ScalerSettings` (flags, each with a ``TIDEGATE_SCALER_*``
environment default so a Helm chart can set them either way) and passed down. Heavy modules
(grpc, aiohttp, kubernetes) are imported inside :func:`run` only.
"""

import argparse
import asyncio
import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalerSettings:
    """Everything ``tidegate scaler`` is configured with (units in the names)."""

    listen: str = "0.0.0.0:9090"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    pods: str = "kubernetes"  # or a path to a JSON file of static pods (demo, tests)
    kubeconfig: str | None = None
    sidecar_timeout_s: float = 2.0
    stale_after_s: float = 30.0
    min_refresh_s: float = 5.0
    stream_interval_s: float = 5.0
    hpa_tolerance: float = 0.1
    metrics_port: int = 0  # 0: no /metrics endpoint
    prometheus_timeout_s: float = 5.0
    prometheus_namespace_label: str = "namespace"
    prometheus_pod_label: str = "pod"
    log_level: str = "INFO"


def _env(env: Mapping[str, str], name: str, default: object) -> object:
    return env.get(f"TIDEGATE_SCALER_{name.upper()}", default)


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] = os.environ) -> None:
    d = ScalerSettings()
    e = lambda name: _env(env, name, getattr(d, name))  # noqa: E731
    parser.add_argument("--listen", default=e("listen"), help="gRPC address HOST:PORT (default %(default)s)")
    parser.add_argument("--tls-cert", default=e("tls_cert"), help="server certificate (PEM file); enables TLS")
    parser.add_argument("--tls-key", default=e("tls_key"), help="server private key (PEM file)")
    parser.add_argument("--tls-client-ca", default=e("tls_client_ca"), help="CA (PEM file) for client certs: mTLS")
    parser.add_argument(
        "--pods",
        default=e("pods"),
        help="'kubernetes' (watch pods labelled tidegate.dev/pool) or a JSON file "
        '{"NAMESPACE/POOL": [{"name", "url", "role", "ready", "serving"}]} (default %(default)s)',
    )
    parser.add_argument("--kubeconfig", default=e("kubeconfig"), help="kubeconfig file (default: in-cluster, then ~)")
    parser.add_argument("--sidecar-timeout-s", type=float, default=e("sidecar_timeout_s"), help="per-pod stats timeout")
    parser.add_argument(
        "--stale-after-s", type=float, default=e("stale_after_s"), help="stats older than this: missing"
    )
    parser.add_argument(
        "--min-refresh-s", type=float, default=e("min_refresh_s"), help="calls within this share a scrape"
    )
    parser.add_argument(
        "--stream-interval-s", type=float, default=e("stream_interval_s"), help="StreamIsActive check period"
    )
    parser.add_argument("--hpa-tolerance", type=float, default=e("hpa_tolerance"), help="the HPA's tolerance (0.1)")
    parser.add_argument(
        "--metrics-port", type=int, default=e("metrics_port"), help="HTTP port for /metrics and /decisions (0: off)"
    )
    parser.add_argument(
        "--prometheus-timeout-s",
        type=float,
        default=e("prometheus_timeout_s"),
        help="per PromQL query (source prometheus)",
    )
    parser.add_argument(
        "--prometheus-namespace-label", default=e("prometheus_namespace_label"), help="target label with the namespace"
    )
    parser.add_argument("--prometheus-pod-label", default=e("prometheus_pod_label"), help="target label with the pod")
    parser.add_argument("--log-level", default=e("log_level"), help="DEBUG, INFO, WARNING (default %(default)s)")


def settings_from(args: argparse.Namespace) -> ScalerSettings:
    """The settings of parsed arguments; raises SystemExit(2) on inconsistent TLS flags."""
    s = ScalerSettings(**{k: getattr(args, k) for k in ScalerSettings.__dataclass_fields__})
    if bool(s.tls_cert) != bool(s.tls_key):
        raise SystemExit("tidegate scaler: --tls-cert and --tls-key go together")
    if s.tls_client_ca and not s.tls_cert:
        raise SystemExit("tidegate scaler: --tls-client-ca needs --tls-cert and --tls-key")
    return s


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scaler", help="run the KEDA external scaler (gRPC)")
    add_arguments(parser)
    parser.set_defaults(func=lambda args: asyncio.run(run(settings_from(args))))


def _static_pods(path: str):
    from tidegate.scaler.pods import PodInfo, StaticPodSource

    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    source = StaticPodSource()
    for key, pods in doc.items():
        namespace, _, pool = key.partition("/")
        for pod in pods:
            for flag in ("ready", "serving"):  # the string "false" is truthy: never a silent yes
                if not isinstance(pod.get(flag, False), bool):
                    raise SystemExit(
                        f"tidegate scaler: {path}: {key} pod {pod.get('name')!r}: {flag} must be true or false, "
                        f"not {pod[flag]!r}"
                    )
        source.set(namespace, pool, [PodInfo(**p) for p in pods])
    return source


async def run(settings: ScalerSettings) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    from tidegate.scaler import server, sideport
    from tidegate.scaler.metrics import DesiredReplicasMetric
    from tidegate.scaler.prometheus import PrometheusSignals
    from tidegate.scaler.service import BySource, Scaler
    from tidegate.scaler.sidecar import SidecarSignals

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if settings.pods == "kubernetes":
        from tidegate.scaler.kube import KubernetesPodSource

        pods = KubernetesPodSource(kubeconfig=settings.kubeconfig)
    else:
        pods = _static_pods(settings.pods)
    sidecar = SidecarSignals(pods, timeout_s=settings.sidecar_timeout_s, stale_after_s=settings.stale_after_s)
    prometheus = PrometheusSignals(
        pods,
        timeout_s=settings.prometheus_timeout_s,
        namespace_label=settings.prometheus_namespace_label,
        pod_label=settings.prometheus_pod_label,
    )
    signals = BySource({"sidecar": sidecar, "prometheus": prometheus})
    metric, decisions = DesiredReplicasMetric(), sideport.DecisionLog()
    side = await sideport.start(metric, decisions, "0.0.0.0", settings.metrics_port) if settings.metrics_port else None
    scaler = Scaler(
        signals,
        min_refresh_s=settings.min_refresh_s,
        hpa_tolerance=settings.hpa_tolerance,
        hooks=(metric.record, decisions.record),
        forget_hooks=(metric.forget, decisions.forget),
    )
    tls = server.TLSFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca) if settings.tls_cert else None
    grpc_server, port = await server.start(scaler, settings.listen, tls, settings.stream_interval_s)
    logging.getLogger("tidegate.scaler").info(
        "serving externalscaler.ExternalScaler on %s (port %d)", settings.listen, port
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await grpc_server.stop(grace=5)
    await scaler.close()
    if side is not None:
        await side.cleanup()
    return 0
