"""Names that identify the InferencePool resource and the labels tidegate puts on objects.

The group is ``tidegate.dev`` and never a ``*.k8s.io`` group: the Gateway API Inference
Extension owns a kind called ``InferencePool`` in ``inference.networking.k8s.io`` with the
short name ``infpool``, and both can be installed in one cluster.
"""

GROUP = "tidegate.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAME = "tgpool"
CATEGORY = "tidegate"

# Labels and annotations shared by the operator, the sidecar and the scaler.
LABEL_POOL = f"{GROUP}/pool"
LABEL_ROLE = f"{GROUP}/role"
ROLE_ACTIVE = "active"
ROLE_WARM = "warm"
ROLE_DRAINING = "draining"
ROLES = (ROLE_ACTIVE, ROLE_WARM, ROLE_DRAINING)
LABEL_SERVING = f"{GROUP}/serving"
"""``"true"`` on every pod the pool's Service sends requests to: the active ones, and the warm ones
when ``spec.warmPool.serve`` (set by the operator; the sidecar serves only then)."""
