"""The one wire contract between the gateway and runtime workers.

Every message that crosses the process boundary is a msgspec struct defined here and travels as
MessagePack over HTTP (``CONTENT_TYPE``). Streams (``/generate``) are a sequence of frames, each a
4-byte big-endian length followed by one encoded ``GenerateChunk``.

Every call carries ``Authorization: Bearer <secret>``, the per-deployment worker secret a worker
reads from ``$KILN_WORKER_SECRET`` (``WORKER_SECRET_ENV``); a call without it gets 401 and an
``ErrorReply`` of code ``unauthorized``. Only the kubelet's probes, ``GET /livez`` (the process
serves) and ``GET /readyz`` (200 ready, else 503; no body), go without it.

Worker endpoints:

- ``GET /health``    -> ``WorkerInfo`` (200 when ready, 503 while warming up or draining)
- ``POST /embed``    ``EmbedRequest`` -> ``EmbedResult`` | ``ErrorReply``
- ``POST /generate`` ``GenerateRequest`` -> frames of ``GenerateChunk`` | ``ErrorReply``
- ``POST /infer``    ``InferRequest`` -> ``InferResult`` | ``ErrorReply`` (``task == "tensor"``)
- ``GET /metrics``   Prometheus text format
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from kiln_runtimes.accuracy import AccuracyReport

CONTENT_TYPE = "application/msgpack"
MANIFEST_NAME = "kiln.json"
WORKER_SECRET_ENV = "KILN_WORKER_SECRET"  # noqa: S105 (a variable's name)
"""The environment variable a worker reads its secret from (never a flag: ``ps`` shows those)."""

Task = Literal["embeddings", "generate", "tensor"]
GENERATE_PRECISION: Final = "int8"
"""A generation build's precision when none is asked for (the build library and the import API
both read it): int4 drifts from the source (docs/benchmarks.md, "Bundled chat model quality")."""
ErrorCode = Literal[
    "bad_request",
    "overloaded",
    "deadline_exceeded",
    "draining",
    "internal",
    "unauthorized",
    "busy",
    "unsupported",
]
FinishReason = Literal["stop", "length", "cancelled", "error"]
# Open Inference Protocol datatypes -> little-endian numpy dtype strings (BYTES is not served).
DATATYPES: dict[str, str] = {
    "BOOL": "|b1", "UINT8": "|u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "|i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}  # fmt: skip


class TensorSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A model input or output: OIP datatype and shape, ``-1`` for a dynamic dimension."""

    name: str
    datatype: str
    shape: list[int]
    dim_names: list[str | None] = []


class ModelManifest(msgspec.Struct, frozen=True, kw_only=True):
    """Describes a built model folder (written as ``kiln.json`` beside the model files)."""

    name: str
    task: Task
    engine: Literal["onnxruntime", "onnxruntime-genai", "tensorrt"]
    model_file: str = "model.onnx"
    tokenizer_file: str | None = "tokenizer.json"
    context_length: int = 512
    dimensions: int | None = None
    source: str = ""
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    opset: int | None = None
    batching: bool = False
    architecture: str | None = None
    """The source's ``config.json`` architecture (``LlamaForCausalLM``, ``BertModel``, ...)."""
    precision: str | None = None
    """Weight precision the model was built in: ``int4``, ``int8``, ``fp16`` or ``fp32``."""
    target: str | None = None
    """What the graph was built for: ``cpu`` or ``cuda``."""
    stop_token_ids: list[int] = []
    """Generation ends at any of these (``eos_token_id`` of config and generation config)."""
    sampling: dict[str, float] = {}
    """The model's sampling defaults (``generation_config.json``'s ``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``repetition_penalty``, and ``max_new_tokens`` as ``max_tokens``): a
    request that leaves one out gets it."""
    pooling: str | None = None
    """How the embeddings graph pools token states, sentence-transformers' modes ``+``-joined
    when concatenated (``cls+mean``); it is inside the graph (informational)."""
    normalize: bool | None = None
    """Whether the embeddings graph L2-normalizes its output."""
    matryoshka_dimensions: list[int] | None = None
    """The widths its embeddings were trained to be cut to (Matryoshka), which a request's
    ``dimensions`` may ask for: its ``config.json``'s ``matryoshka_dimensions``, or ``[]`` (any
    width) for ``is_matryoshka``, as vLLM reads them; ``None``: only the whole width."""
    prompts: dict[str, str] = {}
    """Named prefixes (``config_sentence_transformers.json``'s) a request may embed its texts
    with: ``prompt_name``."""
    default_prompt_name: str | None = None
    """The prompt a text gets when the request names none, as ``SentenceTransformer.encode``."""
    scores: bool = False
    """A cross-encoder (an embeddings-task graph of one output): a row is a text pair (its
    tokenizer's pair template) and its output the pair's relevance, its logit through the
    activation its config names (a sigmoid by default), as ``CrossEncoder.predict``; served
    by ``/v1/score`` and ``/v1/rerank``, not ``/v1/embeddings``."""
    labels: list[str] = []
    """A classifier (a sequence classifier of two or more labels, an embeddings-task graph):
    its labels in the order of its output's columns, each row a text's probabilities
    (softmax, or sigmoid for a multi-label one), as transformers' text-classification pipeline;
    served by ``/v1/classify`` only."""


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's self-description, also its readiness report."""

    model: str
    version: str
    task: Task
    ready: bool
    draining: bool
    in_flight: int
    queued: int
    free_slots: int
    max_batch_size: int
    max_queue: int = 0
    """Items the batch queue holds, the most one request may have; 0 for a generation worker,
    whose bound is its sequences."""
    load_s: float = 0.0
    """Seconds the model's load took (a tensor model's compile included); 0 until ready."""
    warmup_s: float = 0.0
    """Seconds its warm-up took (the gateway's cold-start phases, ``pools.coldstart``)."""


class _Call(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """A gateway-to-worker request. Fields left at their defaults are not sent, and a field
    the worker does not know is refused (``unsupported``), not ignored: during a rolling
    upgrade a worker older than the gateway refuses a request that uses a feature it lacks
    (a ``grammar``, say) instead of answering it without, and serves every other."""


class EmbedRequest(_Call, frozen=True, kw_only=True):
    """Token ids of one API request's inputs (tokenized in the gateway, unpadded)."""

    request_id: str
    input_ids: list[list[int]]
    timeout_ms: int | None = None
    express: bool = False
    """Sent on the gateway's express credit: run ahead of queued requests, in a batch of its own
    (a tenant with nothing else in flight; docs/scheduler.md)."""
    traceparent: str | None = None
    """The W3C ``traceparent`` of the gateway's dispatch span (the worker's spans are its
    children), or, unsampled flag, of a request the gateway's sampler left out: the worker makes
    no span for it (``kiln_runtimes.tracing``). ``None``: tracing off."""


class EmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    """Float32 little-endian embeddings, ``len(input_ids) x dimensions``, row-major."""

    request_id: str
    dimensions: int
    data: bytes
    queue_ms: float
    compute_ms: float


MAX_LOGPROBS = 20
"""The most alternatives a ``GenerateRequest`` may ask per token (OpenAI's chat limit)."""


class ThinkBudget(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A reasoning model's reasoning budget: once ``tokens`` tokens are written inside its
    reasoning (after ``open``, or from the start when ``inside``: the prompt left it open), the
    next token drawn is ``close``, then the tokens of ``then`` (gpt-oss's header of its final
    message). ``open`` opens it only right after ``after`` (harmony's ``<|message|>`` after
    ``analysis``), if given."""

    open: int
    close: int
    tokens: int
    inside: bool
    after: int = -1
    then: tuple[int, ...] = ()


class GenerateRequest(_Call, frozen=True, kw_only=True):
    """One sequence to generate from prompt token ids."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = []
    timeout_ms: int | None = None
    express: bool = False
    """Sent on the gateway's express credit: admitted ahead of waiting sequences, behind earlier
    express ones (a running sequence is never stopped for it)."""
    adapter: str | None = None
    """A LoRA adapter to generate with: the digest of its folder in the worker's artifact store
    (``adapter_config.json``, ``adapter_model.safetensors``), loaded on first use."""
    traceparent: str | None = None
    """The W3C ``traceparent`` of the gateway's dispatch span (the worker's spans are its
    children), or, unsampled flag, of a request the gateway's sampler left out: the worker makes
    no span for it (``kiln_runtimes.tracing``). ``None``: tracing off."""
    top_k: int = 0
    """Draw among the ``top_k`` most probable tokens only (0: all)."""
    min_p: float = 0.0
    """Drop tokens less probable than ``min_p`` times the most probable one (0: none)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated so far (OpenAI semantics)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated so far."""
    repetition_penalty: float = 1.0
    """vLLM's: logits of tokens in the prompt or output divided (positive) or multiplied
    (negative) by it; 1 is off."""
    logit_bias: dict[int, float] = {}
    """Added to the logits of these token ids before sampling."""
    logprobs: int | None = None
    """Report each generated token's log-probability and this many top alternatives (0 to
    ``MAX_LOGPROBS``; ``None``: no log-probabilities). They are of the model's raw distribution
    (vLLM's ``raw_logprobs``)."""
    tenant: str = ""
    """Whose request: the worker's prefix cache shares KV blocks only among one tenant's
    requests, except those within ``public_prefix``."""
    public_prefix: int = 0
    """Leading prompt tokens any tenant may share in the prefix cache (a public system prompt)."""
    grammar: str | None = None
    """Structured output: an llguidance grammar (its JSON form, e.g. compiled from a JSON schema)
    the generated text must follow; it ends on a stop token once the grammar is complete."""
    ignore_eos: bool = False
    """vLLM's: the model's end-of-sequence tokens do not end it (only ``stop_token_ids`` and
    ``max_tokens`` do)."""
    min_tokens: int = 0
    """vLLM's: no token that would end the sequence is drawn before this many are generated."""
    think_budget: ThinkBudget | None = None
    """vLLM's ``thinking_token_budget`` (Anthropic's ``budget_tokens``): the reasoning is closed
    when it reaches its budget (``None``: unbounded)."""
    prompt_logprobs: int | None = None
    """Score the prompt: each prompt token's log-probability given those before it (from the
    second on) and this many top alternatives (0 to ``MAX_LOGPROBS``), of the model's raw
    distribution. Needs a build with every position's logits (not ``prune_lm_head``); the
    prompt is then prefilled whole, not restored from the prefix cache."""


class TokenLogprobs(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One generated token's log-probability and its best alternatives, most probable first."""

    logprob: float
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    rank: int = 0
    """The token's place among all by probability, 1 the most probable (a scored prompt
    token's; 0: not computed)."""


class GenerateChunk(msgspec.Struct, frozen=True, kw_only=True):
    """New token ids for a sequence; the last chunk has ``finish_reason`` set."""

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Leading prompt tokens whose KV came from the prefix cache rather than a prefill."""
    queue_ms: float = 0.0
    """How long the sequence waited for a slot."""
    compute_ms: float = 0.0
    """The sequence's share of the engine steps it took part in, so far (each step's time is
    split among the sequences in it, in proportion to the tokens each processed)."""
    logprobs: list[TokenLogprobs] | None = None
    """One entry per id of ``token_ids`` when the request asked for ``logprobs``."""
    prompt_logprobs: list[TokenLogprobs] | None = None
    """On the first chunk of a request that asked for ``prompt_logprobs``: one entry per
    prompt token from the second on."""
    stop_token: int | None = None
    """On a last chunk whose ``finish_reason`` is ``stop``: the stop token that ended it (an
    end-of-sequence token or a ``stop_token_ids`` entry; not in ``token_ids``)."""


class Tensor(msgspec.Struct, frozen=True, kw_only=True):
    """A named tensor: raw little-endian row-major bytes of ``datatype`` in ``shape``."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes


class InferRequest(_Call, frozen=True, kw_only=True):
    """Named input tensors of one request; batched along dim 0 when the model allows it."""

    request_id: str
    inputs: list[Tensor]
    outputs: list[str] | None = None
    timeout_ms: int | None = None
    express: bool = False
    """Sent on the gateway's express credit: run ahead of queued requests, in a batch of its own
    (a tenant with nothing else in flight; docs/scheduler.md)."""
    traceparent: str | None = None
    """The W3C ``traceparent`` of the gateway's dispatch span (the worker's spans are its
    children), or, unsampled flag, of a request the gateway's sampler left out: the worker makes
    no span for it (``kiln_runtimes.tracing``). ``None``: tracing off."""


class InferResult(msgspec.Struct, frozen=True, kw_only=True):
    """Named output tensors of one request, with where its time went."""

    request_id: str
    outputs: list[Tensor]
    queue_ms: float
    compute_ms: float


class CompileReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``python -m kiln_runtimes.compile`` built (its last stdout line, as JSON)."""

    cache_key: str
    engine_digest: str
    target: str
    precision: str
    hardware: str
    seconds: float
    cache_hit: bool = False
    max_abs_diff: float | None = None
    cosine: float | None = None
    reference_ms: float | None = None
    engine_ms: float | None = None
    notes: str = ""


BuildPhase = Literal[
    "validating", "converting", "quantizing", "optimizing", "checking accuracy", "ready"
]


class BuildProgress(msgspec.Struct, frozen=True, kw_only=True):
    """One progress line of ``python -m kiln_runtimes.build``."""

    phase: BuildPhase
    percent: int
    message: str


class BuildFailure(msgspec.Struct, frozen=True, kw_only=True):
    """The last line of a failed build: what is wrong, in which file, which field."""

    error: str
    file: str | None = None
    field: str | None = None


class BuildReport(msgspec.Struct, frozen=True, kw_only=True):
    """The last line of a successful build; ``accuracy`` is also ``accuracy.json`` in the folder."""

    out_dir: str
    manifest: ModelManifest
    accuracy: AccuracyReport
    seconds: float


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    """A worker-side refusal or failure; ``retry_after_s`` is set for transient ones.

    ``code`` is one of ``ErrorCode`` when written; it is read as any string so that a gateway
    older than its worker (a rolling upgrade) reads a newer code rather than failing on it."""

    code: str
    message: str
    retry_after_s: float | None = None
    param: str | None = None
    """The request field a ``bad_request`` is about, as the client named it."""


encoder = msgspec.msgpack.Encoder()


def frame(chunk: GenerateChunk) -> bytes:
    """Encode one stream frame: 4-byte big-endian length, then the msgpack body."""
    body = encoder.encode(chunk)
    return len(body).to_bytes(4, "big") + body
