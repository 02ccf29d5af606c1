"""tidegate's public API: the ``InferencePool`` custom resource (``tidegate.dev/v1alpha1``).

The pydantic models in this package are the single source of truth for the resource: the
CRD YAML under ``crds/`` is generated from them (:mod:`tidegate.api.crd`), the operator reads
pools through them, and the admission sidecar's config file is their ``admission`` and
``model`` sections. Every cross-field rule exists twice on purpose: as a CEL rule on the
CRD, so ``kubectl apply`` refuses nonsense, and as a pydantic validator with the same message,
so a config file read outside Kubernetes is held to the same rules.

Invariant: this package does no I/O and imports no kopf, aiohttp, grpc or Kubernetes client
(checked by the import contract in ``pyproject.toml``).
"""

from tidegate.api.constants import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION
from tidegate.api.pool import InferencePool, InferencePoolSpec
from tidegate.api.status import Condition, InferencePoolStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "Condition",
    "InferencePool",
    "InferencePoolSpec",
    "InferencePoolStatus",
]
