"""The sidecar's settings: the config file (the pool's ``admission`` and ``model``) and the flags.

Config file (YAML or JSON; the operator mounts it from a ConfigMap)::

    pool: small            # optional: the InferencePool's name, a metrics label
    namespace: default     # optional, informational
    model: {name: meta-llama/Llama-3.1-8B-Instruct, engine: vllm, maxContextTokens: 8192}
    server: {metricsPath: /metrics, healthPath: /health}        # optional: these defaults
    admission: {tokenBudget: 65536, maxConcurrency: 64, ...}   # optional: all defaults

Both sections are validated by the same pydantic models as the CRD (camelCase or snake_case).
An InferencePool manifest (``kind: InferencePool``, e.g. ``examples/minimal.yaml``; in a file of
several documents, the one InferencePool) is accepted as well: its ``metadata.name`` / ``namespace``, ``spec.model``,
``spec.admission`` and ``spec.server.metricsPath`` / ``healthPath`` are used, the rest of the spec is the operator's
business and ignored here. Its ``apiVersion``, when given, must be in
the ``tidegate.dev`` group (the Gateway API inference extension has an InferencePool kind too), and
top-level keys other than ``apiVersion``, ``kind``, ``metadata``, ``spec`` and ``status`` are refused
(a ``model`` or ``admission`` section beside ``kind`` would otherwise be silently ignored).
:class:`ConfigWatcher` re-reads the file when its content changes (ConfigMap volumes swap a
``..data`` symlink, so it compares content, not just mtime); a file that does not parse keeps
the last good configuration and says why.

Errors: :class:`ConfigError` (file missing, not YAML/JSON, fails validation).
"""

import dataclasses
import hashlib
import os
import pathlib

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidegate.api.admission import AdmissionSpec
from tidegate.api.base import ApiModel
from tidegate.api.constants import API_VERSION, GROUP, KIND, LABEL_SERVING
from tidegate.api.serving import ModelSpec, ServerSpec


class ConfigError(Exception):
    """The sidecar's config file cannot be used (the message names the file and the field)."""


class ServerPaths(ApiModel):
    """The model server's paths the sidecar reads: the pool's ``spec.server.healthPath`` and
    ``metricsPath`` (same defaults). A path without a leading ``/`` gets one."""

    health_path: str = Field(default=ServerSpec.model_fields["health_path"].default, min_length=1, max_length=256)
    metrics_path: str = Field(default=ServerSpec.model_fields["metrics_path"].default, min_length=1, max_length=256)

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _rooted(cls, path: str) -> str:
        return path if path.startswith("/") else "/" + path


class SidecarConfig(BaseModel):
    """The parsed config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str = Field(default="", max_length=253, description="InferencePool name (metrics and stats label).")
    namespace: str = Field(default="", max_length=253, description="The pool's namespace (informational).")
    model: ModelSpec
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    server: ServerPaths = Field(
        default_factory=ServerPaths, description="Where the model server's health and metrics are."
    )
    drain_token: str | None = Field(
        default=None,
        alias="drainToken",
        min_length=16,
        max_length=256,
        description="Secret the preStop hook sends (header X-Tidegate-Drain-Token) to drain this "
        "sidecar; without it only loopback callers may drain. The operator sets both.",
    )


def parse(text: str, source: str = "<config>") -> SidecarConfig:
    """Parse a YAML/JSON config document. Raises :class:`ConfigError`."""
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML/JSON: {exc}") from exc
    if len(docs) > 1:  # a manifest file: the one InferencePool in it
        docs = [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == KIND and _ours(doc)]
        if len(docs) != 1:
            raise ConfigError(f"{source}: several YAML documents; expected exactly one {API_VERSION} {KIND} among them")
    data = docs[0] if docs else None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'model' and 'admission'")
    if data.get("kind") == KIND:
        data = _from_manifest(data, source)
    try:
        return SidecarConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


_MANIFEST_KEYS = ("apiVersion", "kind", "metadata", "spec", "status")


def _ours(doc: dict) -> bool:
    """Whether a ``kind: InferencePool`` document is tidegate's (no ``apiVersion``: taken as ours)."""
    return "apiVersion" not in doc or str(doc["apiVersion"]).split("/", 1)[0] == GROUP


def _from_manifest(doc: dict, source: str) -> dict:
    """The sidecar's sections of an InferencePool manifest. Raises :class:`ConfigError` for another
    API group's InferencePool, top-level keys a manifest does not have, or no ``spec.model``."""
    if not _ours(doc):
        raise ConfigError(f"{source}: apiVersion {doc['apiVersion']!r} is not tidegate's {KIND} ({API_VERSION})")
    extra = sorted(str(key) for key in doc if key not in _MANIFEST_KEYS)
    if extra:
        raise ConfigError(
            f"{source}: an {KIND} manifest has only {', '.join(_MANIFEST_KEYS)} at the top; "
            f"move {', '.join(extra)} under spec (or drop kind for the sidecar's own file)"
        )
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    spec = doc.get("spec")
    if not isinstance(spec, dict) or "model" not in spec:
        raise ConfigError(f"{source}: an InferencePool manifest needs spec.model")
    out = {"model": spec["model"], "pool": metadata.get("name", ""), "namespace": metadata.get("namespace", "")}
    if "admission" in spec:
        out["admission"] = spec["admission"]
    server = spec.get("server")
    if isinstance(server, dict):
        out["server"] = {key: server[key] for key in ("healthPath", "metricsPath") if key in server}
    return out


def load(path: str | os.PathLike[str]) -> SidecarConfig:
    """Read and parse a config file. Raises :class:`ConfigError`."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    return parse(text, str(path))


class ConfigWatcher:
    """Detects a changed config file by content hash; :meth:`poll` returns the new config or None."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self._digest = self._read_digest()
        self.config = load(self.path)
        self.last_error: str | None = None

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def poll(self) -> SidecarConfig | None:
        """A newly valid config when the file changed; None when unchanged or invalid (see ``last_error``)."""
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return None
        self._digest = digest
        try:
            self.config = load(self.path)
        except ConfigError as exc:
            self.last_error = str(exc)
            return None
        self.last_error = None
        return self.config


class ApiKeys:
    """API-key -> tenant mapping from a mounted Secret (``tenancy.identity: apiKey``).

    The Secret named by ``tenancy.apiKeySecret`` is mounted as a directory: one file per tenant
    (the file name is the tenant), holding SHA-256 hex digests of that tenant's keys, one per line
    (``#`` comments and blank lines ignored). Keys themselves never reach the sidecar. The directory
    is re-read when its content changes (Secret volumes update in place). An unknown key is a 401,
    never the default tenant.
    """

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.directory = None if directory is None else pathlib.Path(directory)
        self._digest: bytes | None = None
        self._tenants: dict[str, str] = {}
        self.reload()

    def reload(self) -> bool:
        """Re-read the directory if it changed; True when the mapping changed."""
        if self.directory is None:
            return False
        files: list[tuple[str, bytes]] = []
        try:
            for path in sorted(self.directory.iterdir()):
                if not path.name.startswith(".") and path.is_file():
                    files.append((path.name, path.read_bytes()))
        except OSError:
            files = []
        digest = hashlib.sha256(repr(files).encode()).digest()
        if digest == self._digest:
            return False
        self._digest = digest
        tenants: dict[str, str] = {}
        for tenant, data in files:
            for line in data.decode("utf-8", "replace").splitlines():
                line = line.split("#", 1)[0].strip().lower()
                if line:
                    tenants[line] = tenant
        self._tenants = tenants
        return True

    def tenant(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer <key>`` header, or None (unknown / absent)."""
        if not authorization or not authorization.lower().startswith("bearer "):
            return None
        key = authorization[len("bearer ") :].strip()
        return self._tenants.get(hashlib.sha256(key.encode()).hexdigest()) if key else None

    def __len__(self) -> int:
        return len(self._tenants)


ROLE_LABEL = "tidegate.dev/role"
SERVING_LABEL = LABEL_SERVING


@dataclasses.dataclass(frozen=True)
class PodLabels:
    """What the sidecar reads from its pod's labels: its role, and ``serving`` from the
    ``tidegate.dev/serving`` label (``True``/``False``; ``None`` when absent: an operator before it)."""

    role: str
    serving: bool | None = None


def read_labels(labels_file: str | os.PathLike[str] | None) -> PodLabels:
    """The pod's role and serving label from a downward-API labels file (``key="value"`` lines),
    read once, so the two come from the same version of the file (the kubelet swaps it whole).

    No file configured, or no role label: role ``active`` (a pod not managed by the operator serves).
    An unreadable configured file (missing, a directory, not UTF-8): role ``unknown`` (not ready:
    better out of the Service than wrong).
    """
    if labels_file is None:
        return PodLabels("active")
    try:
        text = pathlib.Path(labels_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # never raise: the reload that calls this also reloads the config
        return PodLabels("unknown")
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            labels[key.strip()] = value.strip().strip('"')
    serving = labels.get(SERVING_LABEL)
    return PodLabels(labels.get(ROLE_LABEL, "active"), None if serving is None else serving == "true")


def read_role(labels_file: str | os.PathLike[str] | None) -> str:
    """The pod's role alone (:func:`read_labels`)."""
    return read_labels(labels_file).role


@dataclasses.dataclass(frozen=True)
class SidecarSettings:
    """The flags and environment of one ``tidegate admission`` process (parsed once in main)."""

    config_path: str
    upstream: str
    listen_host: str = "0.0.0.0"
    listen_port: int = 8081
    labels_file: str | None = None
    api_keys_dir: str | None = None
    pod: str = ""
    drain_grace_s: float | None = None  # None: the config's requestTimeoutSeconds
    tick_s: float = 0.05
    reload_s: float = 1.0
    # How long an operator's push (PUT /tidegate/role) outranks an unchanged labels file. The kubelet
    # rewrites the file on its periodic sync (KubeletConfiguration syncFrequency, default 1 m); a
    # push the file has not confirmed by then was lost or reverted, and the file is the truth.
    push_hold_s: float = 120.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **flags: object) -> "SidecarSettings":
        """Flags plus the environment (``POD_NAME`` from the downward API)."""
        env = dict(os.environ) if env is None else env
        return cls(pod=env.get("POD_NAME", ""), **flags)  # type: ignore[arg-type]
