"""The admission sidecar: says no early, fairly and cheaply in front of a model server.

Pure core (no I/O, injected clock; import contract in ``pyproject.toml`` forbids aiohttp, grpc,
kopf, the Kubernetes client and prometheus-client):

- ``cost``: what a request reserves (prompt + output caps), malformed / never-fits bodies;
- ``engine``: the decisions (breaker -> gate -> tenant policy -> capacity), tickets, accounting;
- ``capacity``: budget, concurrency, class reservations, prefill cap, drain model, adaptive budget;
- ``fairqueue``: the bounded weighted-fair queue across tenants (self-clocked fair queueing);
- ``breaker``, ``gate``, ``tenants``, ``ticket``; ``reasons`` (the closed set of decisions).

Shell: ``sidecar`` (the aiohttp app, loops, draining), ``proxy`` (upstream relaying, SSE),
``telemetry`` (backend metrics, NVML), ``metrics`` (Prometheus), ``errors`` (reasons -> HTTP),
``config`` (config file, role label, API keys), ``cli`` (``tidegate admission``), and ``stats``
(the sidecar <-> scaler wire contract, its client and a fake).
"""
