"""The admission sidecar: says no early, fairly and cheaply in front of a model server.

Modules: ``reasons`` (the closed set of decisions and why), ``stats`` (the sidecar <-> scaler
wire contract, its client and a fake). The pure engine never imports aiohttp, grpc, kopf or a
Kubernetes client (import contract in ``pyproject.toml``).
"""
