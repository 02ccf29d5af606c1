"""The scaler's errors, translated to gRPC status codes at exactly one edge (``server._abort``).

::

    ScalerError
    ├── MetadataError     trigger metadata missing or invalid     -> INVALID_ARGUMENT (names the key)
    ├── UnknownMetricError  GetMetrics for a metric we never served  -> NOT_FOUND
    └── SourceError       the signal cannot be read at all         -> UNAVAILABLE (KEDA fallback counts it)
        └── PodSourceError  the pool's pods cannot be listed
"""


class ScalerError(Exception):
    """Root of the scaler's errors."""


class MetadataError(ScalerError):
    """A ScaledObject trigger's metadata is missing a key or has a bad value; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"metadata {key!r}: {message}")
        self.key = key


class UnknownMetricError(ScalerError):
    """GetMetrics asked for a metric name this scaler does not serve for that ScaledObject."""


class SourceError(ScalerError):
    """The pool's signal could not be read at all (not: some pods missing -- that is a hold)."""


class PodSourceError(SourceError):
    """The pool's pods could not be listed (Kubernetes API unreachable, forbidden, ...)."""
