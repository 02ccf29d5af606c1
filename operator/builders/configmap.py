"""ConfigMap ``<pool>-admission``: the sidecar's config file (the pool's ``admission`` and ``model``).

The sidecar watches the mounted file and reloads it in place, so editing ``spec.admission``
changes admission without restarting a single pod (the pod template does not hash it).
"""

from typing import Any

import yaml

from tidegate.api.pool import InferencePool
from tidegate.operator import names


def admission_config(pool: InferencePool) -> dict[str, Any]:
    """The config document the sidecar reads: ``{pool, namespace, model, admission, server, drainToken}``
    (``server``: the model server's ``healthPath`` and ``metricsPath``)."""
    server = pool.spec.server
    config = {
        "pool": pool.metadata.name,
        "namespace": pool.metadata.namespace,
        "model": pool.spec.model.model_dump(mode="json", exclude_none=True),
        "admission": pool.spec.admission.model_dump(mode="json", exclude_none=True),
        "server": {"healthPath": server.health_path, "metricsPath": server.metrics_path},
    }
    if token := names.drain_token(pool):
        config["drainToken"] = token
    return config


def admission_config_map(pool: InferencePool) -> dict[str, Any]:
    """The ConfigMap manifest (``v1``) holding :func:`admission_config` as ``config.yaml``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.config_map_name(pool),
            "namespace": pool.metadata.namespace,
            "labels": names.common_labels(pool),
        },
        "data": {names.CONFIG_FILE: yaml.safe_dump(admission_config(pool), sort_keys=True)},
    }
