"""The operator's log: a time, a level and the pool on every line; the routine out of sight.

kopf logs through ``kopf.objects`` with the object it handles in the record's ``k8s_ref``;
:func:`for_pool` gives tidegate's own loggers the same, so one formatter names the pool on
every line, ours and kopf's: ``[namespace/name]`` in plain text, ``object`` in JSON (kopf's
JSON formatter). A line about a pod or child carries that object; tidegate's messages about
it name the pool.

kopf logs every handler run at INFO (``Handler 'pod_event' succeeded.``, ``Timer 'resync'
succeeded.``, ``Creation is processed: ...``): with a pod event per readiness change and a
resync timer per pool that is most of the log and says nothing (so do its startup activities'
``Activity '_startup' succeeded.``). :class:`Routine` moves those
lines to DEBUG (shown with ``--verbose``); failures, retries and everything tidegate says stay.
"""

import logging
import time

import kopf

from tidegate.api import API_VERSION, KIND

PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s %(message)s"

# kopf 1.45 ``_core/actions/execution.py`` and ``_core/reactor/processing.py``.
_ROUTINE_ENDINGS = (" succeeded.",)
_ROUTINE_PARTS = (" is processed: ",)


class Routine(logging.Filter):
    """Moves kopf's success lines (handlers, timers, startup activities) to DEBUG; drops them unless ``verbose``."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kopf.") or record.levelno != logging.INFO:
            return True
        text = str(record.msg)
        if not (text.endswith(_ROUTINE_ENDINGS) or any(part in text for part in _ROUTINE_PARTS)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.verbose


class PlainFormatter(logging.Formatter):
    """``2026-12-01T17:32:10.123Z WARNING tidegate.operator.reconcile [ns/pool] message`` (UTC)."""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created)) + f".{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        ref = getattr(record, "k8s_ref", None)
        if ref:
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else str(ref.get("name"))
            record = logging.makeLogRecord({**record.__dict__, "msg": f"[{where}] {record.msg}"})
        return super().format(record)


def for_pool(logger: logging.Logger, namespace: str, name: str) -> logging.LoggerAdapter[logging.Logger]:
    """``logger`` with the pool as the object of every line (``[namespace/name]``)."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "namespace": namespace, "name": name}
    return logging.LoggerAdapter(logger, {"k8s_ref": ref})


def configure(verbose: bool, json: bool) -> None:
    """Install the one root handler (kopf's), with timestamps, levels and the pool; routine lines to DEBUG.

    kopf.configure installs the handler; a second one would print every line twice.
    """
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON if json else kopf.LogFormat.PLAIN)
    root = logging.getLogger()
    for handler in root.handlers:
        if not json:
            handler.setFormatter(PlainFormatter())
        handler.addFilter(Routine(verbose))
