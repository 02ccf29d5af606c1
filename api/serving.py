"""What is served (``spec.model``) and the container that serves it (``spec.server``)."""

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from tidegate.api.base import ApiModel, RawObject, cel, validations


class Engine(StrEnum):
    """The model server behind the sidecar; decides which metric names are read.

    ``openai`` is any OpenAI-compatible server whose metrics tidegate does not know: admission
    then relies on its own accounting only (no KV-cache gate).
    """

    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    TGI = "tgi"
    OPENAI = "openai"


class PromptTokenizer(StrEnum):
    """How the sidecar counts prompt tokens.

    ``estimate``: bytes of prompt text divided by ``estimateCharsPerToken`` (no I/O; conservative
    for English and code with the default of 3). ``backend``: the model server's own tokenizer
    endpoint (vLLM ``/tokenize``, llama.cpp ``/tokenize``), falling back to the estimate when it
    fails.
    """

    ESTIMATE = "estimate"
    BACKEND = "backend"


class ModelSpec(ApiModel):
    """The model a pool serves."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=253,
            description="Model name clients send in the OpenAI `model` field, e.g. "
            "`meta-llama/Llama-3.1-8B-Instruct`. Shown in `kubectl get tgpool`.",
        ),
    ]
    engine: Engine = Field(
        default=Engine.VLLM,
        description="Model server: `vllm`, `llamacpp`, `tgi`, or `openai` (any OpenAI-compatible "
        "server; no backend metrics are read).",
    )
    max_context_tokens: int = Field(
        default=8192,
        ge=16,
        le=10_000_000,
        description="Context window in tokens (prompt + output) the server is started with "
        "(vLLM `--max-model-len`, llama.cpp `--ctx-size` per slot). Requests whose prompt exceeds "
        "it are refused with 400.",
    )
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Output tokens reserved when a request sets no `max_tokens`. Unset: the "
        "context left after the prompt (always safe, may over-reserve).",
    )
    tokenizer: PromptTokenizer = Field(
        default=PromptTokenizer.ESTIMATE,
        description="How prompt tokens are counted: `estimate` (from text length) or `backend` "
        "(the server's /tokenize endpoint).",
    )
    estimate_chars_per_token: float = Field(
        default=3.0,
        gt=0.5,
        le=16.0,
        description="Characters per token assumed by the `estimate` tokenizer. Lower is more "
        "conservative (reserves more). Typical BPE tokenizers average about 4 on English text.",
    )

    @model_validator(mode="after")
    def _default_within_context(self) -> "ModelSpec":
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_context_tokens:
            raise ValueError("model.defaultMaxTokens must be <= model.maxContextTokens")
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!has(self.defaultMaxTokens) || self.defaultMaxTokens <= self.maxContextTokens",
                "model.defaultMaxTokens must be <= model.maxContextTokens",
                ".defaultMaxTokens",
            )
        )
    }


class ServerSpec(ApiModel):
    """The model-server container tidegate puts next to its admission sidecar."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Model-server image, e.g. `vllm/vllm-openai:v0.11.0`. Required unless "
        "`podTemplate` names the container.",
    )
    command: list[str] = Field(
        default_factory=list, max_length=64, description="Container command (entrypoint override)."
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Container args, e.g. `[--model, meta-llama/Llama-3.1-8B-Instruct, --max-model-len, '8192']`.",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="Port the model server listens on inside the pod (vLLM 8000, llama.cpp 8080, "
        "TGI 80). The sidecar forwards to 127.0.0.1:<port>.",
    )
    gpus: int = Field(
        default=1,
        ge=0,
        le=64,
        description="GPUs per replica, requested and limited as `nvidia.com/gpu`. 0 for CPU-only servers.",
    )
    resources: RawObject = Field(
        default_factory=dict,
        description="Extra container resources (`requests`/`limits` for cpu, memory, ...), merged "
        "with the GPU request.",
    )
    env: list[RawObject] = Field(
        default_factory=list, max_length=256, description="Container env (Kubernetes EnvVar list)."
    )
    volume_mounts: list[RawObject] = Field(default_factory=list, max_length=64, description="Container volumeMounts.")
    volumes: list[RawObject] = Field(
        default_factory=list, max_length=64, description="Pod volumes (model caches, shm)."
    )
    health_path: str = Field(
        default="/health",
        max_length=256,
        description="HTTP path that answers 200 once the model is loaded (vLLM and TGI `/health`, "
        "llama.cpp `/health`, which is 503 while loading).",
    )
    metrics_path: str = Field(
        default="/metrics",
        max_length=256,
        description="HTTP path of the server's Prometheus metrics, read by the sidecar for the load signals "
        "(KV-cache usage, running and queued requests).",
    )
    startup_timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=7200,
        description="How long a new replica may take to load its model before Kubernetes restarts it.",
    )
    pod_template: RawObject | None = Field(
        default=None,
        description="Advanced: a full pod template (`metadata`, `spec`) used as the base; "
        "tidegate adds its sidecar, labels and volumes. The model container is the one named "
        "`model`, or the first.",
    )
    security_context: RawObject | None = Field(
        default=None,
        description="securityContext of the model container. To run in a namespace enforcing Pod "
        "Security `restricted`, set `runAsNonRoot: true`, `allowPrivilegeEscalation: false`, "
        "`capabilities: {drop: [ALL]}` (stock vLLM and TGI images run as root and need a non-root build).",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra pod nodeSelector.")
    tolerations: list[RawObject] = Field(default_factory=list, max_length=32, description="Extra pod tolerations.")

    @model_validator(mode="after")
    def _image_or_template(self) -> "ServerSpec":
        if self.image is None and self.pod_template is None:
            raise ValueError("server.image is required (or give server.podTemplate)")
        _check_shapes(self)
        return self

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "has(self.image) || has(self.podTemplate)",
                "server.image is required (or give server.podTemplate)",
                ".image",
            )
        )
    }


def _check_shapes(server: "ServerSpec") -> None:
    """The parts of pass-through Kubernetes objects tidegate itself builds on must have the shape
    Kubernetes gives them (the API server cannot check them in a preserve-unknown-fields field).

    Raises ``ValueError`` naming the field.
    """

    def need(value: object, kind: type | tuple[type, ...], where: str, what: str) -> None:
        if value is not None and not isinstance(value, kind):
            raise ValueError(f"server.{where} must be {what}")

    for kind in ("requests", "limits"):
        need(server.resources.get(kind), dict, f"resources.{kind}", "a map of resource name to quantity")
    template = server.pod_template
    if template is None:
        return
    meta = template.get("metadata")
    need(meta, dict, "podTemplate.metadata", "an object")
    for key in ("labels", "annotations"):
        value = (meta or {}).get(key)
        need(value, dict, f"podTemplate.metadata.{key}", "a map of strings")
        if isinstance(value, dict) and not all(isinstance(v, str) for v in value.values()):
            raise ValueError(f"server.podTemplate.metadata.{key} must be a map of strings")
    spec = template.get("spec")
    need(spec, dict, "podTemplate.spec", "a PodSpec object")
    spec = spec or {}
    for key in ("containers", "initContainers", "volumes", "tolerations"):
        items = spec.get(key)
        need(items, list, f"podTemplate.spec.{key}", "a list of objects")
        if isinstance(items, list) and not all(isinstance(i, dict) for i in items):
            raise ValueError(f"server.podTemplate.spec.{key} must be a list of objects")
    for key in ("nodeSelector", "securityContext"):
        need(spec.get(key), dict, f"podTemplate.spec.{key}", "an object")
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool)):
        raise ValueError("server.podTemplate.spec.terminationGracePeriodSeconds must be an integer")
