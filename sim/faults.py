"""Fault switches of the sim-backend: how a real model server misbehaves, on demand.

| switch | JSON (``POST /sim/faults``) | CLI (``--fault``) | effect |
| --- | --- | --- | --- |
| stall | ``"stall": true`` | ``stall`` | requests are accepted (stream headers sent) but no token is emitted; model time stops; ``/health`` stays 200 |
| slowdown | ``"slowdown": 3`` | ``slowdown=3`` | the replica runs 3x slower (prefill and decode) |
| error rate | ``"error_rate": 0.2`` | ``error_rate=0.2`` | that fraction of completion requests answer 500 at once |
| 429s | ``"reject_rate": 1`` | ``reject_rate=1`` | that fraction answer 429 (``Retry-After: 1``) at once |
| frozen metrics | ``"freeze_metrics": true`` or ``{"kv_cache_usage_perc": 0.99}`` | ``freeze_metrics`` or ``freeze_metrics=kv_cache_usage_perc:0.99`` | the gauges ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` keep their current values (or the given ones); counters and histograms go on |

``{"clear": true}`` turns every switch off first (then applies the rest of the same patch).
A patch names only the switches it changes. Errors: :class:`FaultError` (a ``ValueError``,
HTTP 400) naming the bad key or value. Pure: no I/O.
"""

import dataclasses
import math
from collections.abc import Mapping

FROZEN_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")


class FaultError(ValueError):
    """A fault patch or ``--fault`` flag that cannot be applied."""


@dataclasses.dataclass(frozen=True)
class Faults:
    """The fault switches now in force. ``freeze_metrics`` is ``None`` (live gauges) or gauge overrides."""

    stall: bool = False
    slowdown: float = 1.0
    error_rate: float = 0.0
    reject_rate: float = 0.0
    freeze_metrics: Mapping[str, float] | None = None

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["freeze_metrics"] = None if self.freeze_metrics is None else dict(self.freeze_metrics)
        return data


def _fraction(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise FaultError(f"{key} must be a number between 0 and 1, got {value!r}")
    return float(value)


def _freeze(value: object) -> Mapping[str, float] | None:
    if value is True:
        return {}
    if value is False or value is None:
        return None
    if isinstance(value, Mapping):
        out = {}
        for name, v in value.items():
            if name not in FROZEN_GAUGES:
                raise FaultError(f"freeze_metrics: unknown gauge {name!r}; known: {', '.join(FROZEN_GAUGES)}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise FaultError(f"freeze_metrics.{name} must be a number >= 0, got {v!r}")
            out[name] = float(v)
        return out
    raise FaultError("freeze_metrics must be true, false, or an object of gauge values")


def apply(current: Faults, patch: Mapping[str, object]) -> Faults:
    """``current`` with the switches named in ``patch`` changed; raises :class:`FaultError`."""
    if not isinstance(patch, Mapping):
        raise FaultError("the fault patch must be a JSON object")
    known = {"clear", *(f.name for f in dataclasses.fields(Faults))}
    unknown = sorted(set(patch) - known)
    if unknown:
        raise FaultError(f"unknown fault switch(es) {unknown}; known: {sorted(known)}")
    result = Faults() if patch.get("clear") is True else current
    changes: dict[str, object] = {}
    for key, value in patch.items():
        if key == "stall":
            if not isinstance(value, bool):
                raise FaultError(f"stall must be true or false, got {value!r}")
            changes[key] = value
        elif key == "slowdown":
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise FaultError(f"slowdown must be a positive number, got {value!r}")
            changes[key] = float(value)
        elif key in ("error_rate", "reject_rate"):
            changes[key] = _fraction(key, value)
        elif key == "freeze_metrics":
            changes[key] = _freeze(value)
        elif key == "clear" and not isinstance(value, bool):
            raise FaultError(f"clear must be true or false, got {value!r}")
    return dataclasses.replace(result, **changes)


def parse_flag(text: str) -> dict[str, object]:
    """One ``--fault`` flag as a patch: ``stall``, ``freeze_metrics``, ``NAME=VALUE``, ``freeze_metrics=G:V,G:V``."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep:
        if name in ("stall", "freeze_metrics"):
            return {name: True}
        raise FaultError(f"--fault {text!r}: only stall and freeze_metrics take no value")
    if name == "freeze_metrics":
        values: dict[str, object] = {}
        for item in raw.split(","):
            gauge, colon, number = item.partition(":")
            if not colon:
                raise FaultError(f"--fault {text!r}: expected freeze_metrics=GAUGE:VALUE[,GAUGE:VALUE]")
            values[gauge.strip()] = _number(text, number)
        return {name: values}
    if name == "stall":
        return {name: raw.strip().lower() in ("1", "true", "yes", "on")}
    return {name: _number(text, raw)}


def _number(flag: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise FaultError(f"--fault {flag!r}: {raw!r} is not a number") from None
