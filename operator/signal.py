"""The scaler's last decision for a pool, for ``status.signal``, the RejectRate column and Events.

The scaler's side port serves ``GET /decisions/<namespace>/<pool>`` (``tidegate.scaler.sideport``).
Each scaler replica answers for the decisions it made itself, so a 404 from one replica means
"not this one", not "no decision": the previous ``status.signal`` is kept. Errors never fail a
reconcile; the signal is information, the scaling itself goes through KEDA.
"""

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

log = logging.getLogger(__name__)


def fetch(base_url: str, namespace: str, pool: str, timeout_s: float = 0.5) -> dict[str, Any] | None:
    """The decision JSON from ``{base_url}/decisions/{namespace}/{pool}``, or None."""
    path = f"/decisions/{urllib.parse.quote(namespace)}/{urllib.parse.quote(pool)}"
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            log.warning("scaler decisions %s: HTTP %s", path, exc.code)
        return None
    except (OSError, ValueError) as exc:
        log.warning("scaler decisions %s: %s", path, exc)
        return None


def _fraction(value: Any) -> float | None:
    return round(min(max(float(value), 0.0), 1.0), 4) if isinstance(value, int | float) else None


def to_status(decision: dict[str, Any]) -> dict[str, Any]:
    """``status`` fields (camelCase) from one scaler decision (pure)."""
    capacity = _fraction(decision.get("capacityRejectRate"))
    signal = {
        "desiredReplicas": int(decision["desired"]) if isinstance(decision.get("desired"), int) else None,
        "capacityRejectRate": capacity,
        "policyRejectRate": _fraction(decision.get("policyRejectRate")),
        "reason": str(decision.get("text", ""))[:1024],
        "time": decision.get("time"),
    }
    return {"capacityRejectRate": capacity, "signal": {k: v for k, v in signal.items() if v is not None}}
