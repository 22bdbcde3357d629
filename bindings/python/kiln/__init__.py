"""kiln: embeddable LLM inference, from Python.

A thin, typed layer over libkiln's C API (include/kiln/kiln.h), loaded with ctypes. Handles are
objects that free themselves (use them as context managers to free them at a known point);
failures raise KilnError with the C status and message; streaming is an iterator of text pieces.

    with kiln.Model(path) as model, model.cache() as cache, cache.session() as s:
        s.append(prompt, parse_special=True)
        for piece in s.stream(max_tokens=32):
            print(piece, end="", flush=True)
"""

from __future__ import annotations

import codecs
import ctypes
import enum
import os
import threading
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from ctypes import POINTER, byref, c_char, c_char_p, c_float, c_int32, c_size_t, c_void_p, sizeof
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _ffi
from ._ffi import lib as _lib

__all__ = [
    "Backend",
    "Cache",
    "CacheStats",
    "DraftStrategy",
    "EagleStrategy",
    "GenerateResult",
    "GgufFile",
    "KVType",
    "KilnError",
    "LogLevel",
    "MedusaStrategy",
    "MlaPrefill",
    "Model",
    "ModelInfo",
    "NgramStrategy",
    "PollResult",
    "RequestResult",
    "Sampler",
    "Session",
    "SpecMetrics",
    "Status",
    "StepResult",
    "StopReason",
    "Stream",
    "Strategy",
    "TokenLogprob",
    "abi_version",
    "backends",
    "cpu_info",
    "version",
]


# ---------------------------------------------------------------- status and errors
class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    IO = 2
    FORMAT = 3
    UNSUPPORTED = 4
    OUT_OF_MEMORY = 5
    CACHE_FULL = 6
    CANCELLED = 7
    OUT_OF_RANGE = 8
    BUFFER_TOO_SMALL = 9
    BUSY = 10
    INTERNAL = 11


class StopReason(enum.IntEnum):
    EOG = 0
    MAX_TOKENS = 1
    STRING = 2
    CALLBACK = 3
    CANCELLED = 4
    CONTEXT_FULL = 5


class LogLevel(enum.IntEnum):
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3


class KVType(enum.IntEnum):
    F16 = 0
    F32 = 1
    BF16 = 2
    Q8_0 = 3  # ggml's q8_0 blocks; the model's head size must be a multiple of 32


class Backend(enum.IntEnum):
    """The compute backend a cache asks for (kiln_backend_kind)."""

    CPU = 0
    CUDA = 1
    AUTO = 2  # CUDA when it can run the model, else the CPU


class MlaPrefill(enum.IntEnum):
    """How MLA models (deepseek2) compute prompt chunks (kiln_mla_prefill); others ignore it."""

    ABSORBED = 0  # as decode steps: every bitwise guarantee holds
    MEASURED = 1  # long chunks decompressed when faster; equal to float rounding


def _status(code: int) -> Union[Status, int]:
    try:
        return Status(code)
    except ValueError:  # a newer library's status: keep the number
        return code


class KilnError(Exception):
    """A kiln call failed. `status` is the C kiln_status, `message` kiln_last_error_message()."""

    def __init__(self, status: int, message: str, function: str = "") -> None:
        self.status = _status(status)
        self.message = message
        self.function = function
        name = _lib.kiln_status_name(status).decode()
        where = f"{function}: " if function else ""
        super().__init__(f"{where}{name}: {message}" if message else f"{where}{name}")


def _check(code: int, function: str) -> None:
    if code != 0:
        # Read at once: the message is valid only until the next kiln call on this thread.
        message = _lib.kiln_last_error_message().decode("utf-8", "replace")
        raise KilnError(code, message, function)


def _closed(what: str) -> KilnError:
    return KilnError(Status.INVALID_ARGUMENT, f"the {what} is closed")


def _utf8(text: Union[str, bytes]) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8")


def _init(struct_type: type, init_name: str) -> Any:
    params = struct_type()
    _check(getattr(_lib, init_name)(byref(params), sizeof(params)), init_name)
    return params


def _out(struct_type: type) -> Any:
    out = struct_type()
    out.struct_size = sizeof(out)
    return out


def _sized_call(call: Callable[[Any, int, Any], int], elem_type: Any, first: int, name: str) -> Any:
    """Calls a (buffer, capacity, *size) function, growing the buffer once it reports the size."""
    n = c_size_t(0)
    capacity = max(first, 1)
    while True:
        buf = (elem_type * capacity)()
        code = call(buf, capacity, byref(n))
        if code == Status.BUFFER_TOO_SMALL and n.value > capacity:
            capacity = n.value
            continue
        _check(code, name)
        return buf, n.value


class _CallbackGuard:
    """Runs Python callbacks from C: an exception is kept (and the C call asked to stop) instead
    of being lost inside ctypes, then re-raised by the caller after the C call returns."""

    def __init__(self) -> None:
        self.error: Optional[BaseException] = None

    def run(self, fn: Callable[[], Any], on_error: Any) -> Any:
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001 - re-raised after the C call
            if self.error is None:
                self.error = e
            return on_error

    def reraise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def version() -> str:
    """The version of the libkiln actually loaded ("0.2.0")."""
    return _lib.kiln_version().decode()


def abi_version() -> int:
    return int(_lib.kiln_abi_version())


def cpu_info() -> str:
    return _lib.kiln_cpu_info().decode()


def backends() -> str:
    return _lib.kiln_backends().decode()


class _Handle:
    """An owned C handle: closed once, by close(), the context manager or the garbage collector."""

    _destroy_name = ""
    _what = "handle"

    def __init__(self) -> None:
        self._h: Optional[int] = None
        self._children: "weakref.WeakSet[_Handle]" = weakref.WeakSet()

    @property
    def closed(self) -> bool:
        return self._h is None

    def _handle(self) -> int:
        if self._h is None:
            raise _closed(self._what)
        return self._h

    def close(self) -> None:
        """Frees the handle (and first every handle made from it: sessions of a cache, caches of
        a model), as the C API requires. Idempotent."""
        for child in list(self._children):
            child.close()
        h, self._h = self._h, None
        if h is not None:
            getattr(_lib, self._destroy_name)(h)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ---------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    name: str
    n_params: int
    size_bytes: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    token_bos: int
    token_eos: int
    token_eot: int


ChatMessage = Union[Mapping[str, str], tuple[str, str]]


def _meta_entries(h: int, count: Callable[[int], int], at: Any, name: str) -> dict[str, str]:
    result = {}
    for i in range(count(h)):
        key, value = c_char_p(), c_char_p()
        _check(at(h, i, byref(key), byref(value)), name)
        result[key.value.decode()] = value.value.decode("utf-8", "replace")
    return result


class GgufFile(_Handle):
    """A GGUF file opened for inspection only: its metadata and what kiln lacks to run it. Works
    for any valid GGUF, also one of an architecture kiln cannot load."""

    _destroy_name = "kiln_gguf_destroy"
    _what = "GGUF file"

    def __init__(self, path: Union[str, os.PathLike[str]]) -> None:
        """Opens and validates `path`: KilnError(IO) when it cannot be read, KilnError(FORMAT)
        when it is not a valid GGUF (the message names the field and byte offset)."""
        super().__init__()
        h = c_void_p()
        _check(_lib.kiln_gguf_open(os.fsencode(path), byref(h)), "kiln_gguf_open")
        self._h = h.value

    @property
    def metadata(self) -> dict[str, str]:
        """Every metadata entry, values rendered as text (arrays shortened)."""
        return _meta_entries(self._handle(), _lib.kiln_gguf_meta_count, _lib.kiln_gguf_meta_at, "kiln_gguf_meta_at")

    @property
    def unsupported(self) -> list[str]:
        """What kiln lacks to run the file, one problem per entry; empty when it can run it."""
        return _lib.kiln_gguf_unsupported(self._handle()).decode("utf-8", "replace").splitlines()


class Model(_Handle):
    """A loaded GGUF model; immutable and usable from any thread."""

    _destroy_name = "kiln_model_destroy"
    _what = "model"

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        *,
        use_mmap: bool = True,
        progress: Optional[Callable[[float], Optional[bool]]] = None,
        log: Optional[Callable[[LogLevel, str], None]] = None,
    ) -> None:
        """Loads `path`. `progress(fraction)` is called during the load; returning True cancels
        it (KilnError with Status.CANCELLED). `log(level, line)` receives the load's log lines (a
        failed load logs its error message at LogLevel.ERROR). An exception in either callback is
        re-raised here."""
        super().__init__()
        params = _init(_ffi.ModelParams, "kiln_model_params_init")
        params.path = os.fsencode(path)
        params.use_mmap = 1 if use_mmap else 0
        guard = _CallbackGuard()
        if progress is not None:

            def on_progress(fraction: float, _user: Any) -> int:
                return 1 if guard.run(lambda: bool(progress(fraction)), True) else 0

            params.progress = _ffi.ProgressFn(on_progress)
        if log is not None:

            def on_log(level: int, line: bytes, _user: Any) -> None:
                guard.run(lambda: log(LogLevel(level), line.decode("utf-8", "replace")), None)

            params.log = _ffi.LogFn(on_log)
        h = c_void_p()
        code = _lib.kiln_model_load(byref(params), byref(h))
        if guard.error is not None and code == 0:
            _lib.kiln_model_destroy(h)  # loaded anyway (a log callback cannot stop it)
        guard.reraise()
        _check(code, "kiln_model_load")
        self._h = h.value

    @property
    def info(self) -> ModelInfo:
        out = _out(_ffi.ModelInfo)
        _check(_lib.kiln_model_get_info(self._handle(), byref(out)), "kiln_model_get_info")
        values = {name: getattr(out, name) for name, _ in _ffi.ModelInfo._fields_[1:]}
        values["architecture"] = values["architecture"].decode()
        values["name"] = values["name"].decode()
        return ModelInfo(**values)

    @property
    def metadata(self) -> dict[str, str]:
        """Every GGUF metadata entry, values rendered as text (arrays shortened)."""
        return _meta_entries(
            self._handle(), _lib.kiln_model_meta_count, _lib.kiln_model_meta_at, "kiln_model_meta_at"
        )

    def meta(self, key: str) -> Optional[str]:
        """Metadata `key` as text, or None when the file has no such key."""
        value = c_char_p()
        code = _lib.kiln_model_meta_get(self._handle(), key.encode(), byref(value))
        if code == Status.OUT_OF_RANGE:
            return None
        _check(code, "kiln_model_meta_get")
        return value.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(_lib.kiln_model_token_is_eog(self._handle(), token))

    def tokenize(
        self, text: Union[str, bytes], *, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        data = _utf8(text)
        flags = (1 if add_special else 0) | (2 if parse_special else 0)
        h = self._handle()
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_tokenize(h, data, len(data), flags, b, cap, n),
            c_int32,
            len(data) + 2,
            "kiln_tokenize",
        )
        return list(buf[:n])

    def detokenize_bytes(self, tokens: Sequence[int], *, render_special: bool = False) -> bytes:
        ids = (c_int32 * len(tokens))(*tokens)
        h = self._handle()
        flags = 1 if render_special else 0
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_detokenize(h, ids, len(tokens), flags, b, cap, n),
            c_char,
            16 * len(tokens) + 16,
            "kiln_detokenize",
        )
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, render_special: bool = False) -> str:
        """The text of `tokens` (bytes that are not valid UTF-8 become U+FFFD)."""
        return self.detokenize_bytes(tokens, render_special=render_special).decode("utf-8", "replace")

    def apply_chat_template(
        self,
        messages: Iterable[ChatMessage],
        *,
        template: Optional[str] = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """Renders a conversation: messages are {"role": ..., "content": ...} or (role, content).
        template None: the model's own; else a Jinja source or a family name ("chatml", ...)."""
        pairs = [
            (m["role"], m["content"]) if isinstance(m, Mapping) else (m[0], m[1]) for m in messages
        ]
        encoded = [(_utf8(r), _utf8(c)) for r, c in pairs]
        array_ = (_ffi.ChatMessage * max(len(encoded), 1))(*[_ffi.ChatMessage(r, c) for r, c in encoded])
        tmpl = _utf8(template) if template is not None else None
        h = self._handle()
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_chat_apply_template(
                h, tmpl, array_, len(encoded), 1 if add_generation_prompt else 0, b, cap, n
            ),
            c_char,
            sum(len(r) + len(c) for r, c in encoded) + 256,
            "kiln_chat_apply_template",
        )
        return buf.raw[:n].decode("utf-8", "replace")

    def cache(self, **params: Any) -> "Cache":
        """A KV cache for this model; keyword arguments as Cache's."""
        return Cache(self, **params)


# ---------------------------------------------------------------- cache
@dataclass(frozen=True)
class CacheStats:
    n_ctx: int
    block_size: int
    blocks_total: int
    blocks_free: int
    blocks_used: int
    blocks_cached: int
    n_sequences: int
    prefix_lookups: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int
    bytes_per_token: int
    block_bytes: int
    kv_bytes_in_use: int
    sliding_blocks_total: int
    sliding_blocks_used: int
    sliding_blocks_released: int
    sliding_block_bytes: int


@dataclass(frozen=True)
class StepResult:
    n_steps: int
    n_tokens: int
    n_active: int
    elapsed_ms: float


class Cache(_Handle):
    """A paged KV cache and the engine that computes into it; thread-safe. Sessions live in it."""

    _destroy_name = "kiln_cache_destroy"
    _what = "cache"

    def __init__(
        self,
        model: Model,
        *,
        pool_bytes: int = 0,
        block_size: int = 16,
        kv_type: KVType = KVType.F16,
        prefix_caching: bool = True,
        n_ctx: int = 0,
        n_threads: int = 0,
        llama_cpp_order: bool = False,
        step_tokens: Optional[int] = None,
        backend: Backend = Backend.CPU,
        cuda_device: int = 0,
        mla_prefill: MlaPrefill = MlaPrefill.ABSORBED,
        swa_full: bool = False,
        pin_threads: bool = False,
    ) -> None:
        """kiln_cache_params. step_tokens: most tokens in one step's forward pass (None: kiln's
        512). backend CUDA or AUTO runs on the CUDA device `cuda_device` when it can, else on the
        CPU (the cache is created either way; the `backend` property says which and why).
        mla_prefill: MLA models only. swa_full: models with sliding-window and global layers
        (gemma3), CPU backend; False releases the sliding layers' K/V once every window has left
        it, back to the pool, True keeps every layer's K/V. pin_threads: CPU backend, each worker
        thread on a core of its own (for hosts that step in short bursts, such as a game loop).
        A bad value raises
        KilnError(INVALID_ARGUMENT) naming the field."""
        super().__init__()
        params = _init(_ffi.CacheParams, "kiln_cache_params_init")
        params.pool_bytes = pool_bytes
        params.block_size = block_size
        params.kv_type = int(kv_type)
        params.prefix_caching = 1 if prefix_caching else 0
        params.n_ctx = n_ctx
        params.n_threads = n_threads
        params.llama_cpp_order = 1 if llama_cpp_order else 0
        if step_tokens is not None:
            params.step_tokens = step_tokens
        params.backend = int(backend)
        params.cuda_device = cuda_device
        params.mla_prefill = int(mla_prefill)
        params.swa_full = 1 if swa_full else 0
        params.pin_threads = 1 if pin_threads else 0
        h = c_void_p()
        _check(_lib.kiln_cache_create(model._handle(), byref(params), byref(h)), "kiln_cache_create")
        self._h = h.value
        self.model = model
        model._children.add(self)

    @property
    def backend(self) -> str:
        """The backend the cache runs on ("cpu (avx2, 4 threads)"), followed by "; cuda
        requested, running on the CPU: <reason>" when a CUDA request fell back."""
        return _lib.kiln_cache_backend(self._handle()).decode("utf-8", "replace")

    @property
    def stats(self) -> CacheStats:
        out = _out(_ffi.CacheStats)
        _check(_lib.kiln_cache_get_stats(self._handle(), byref(out)), "kiln_cache_get_stats")
        return CacheStats(**{name: getattr(out, name) for name, _ in _ffi.CacheStats._fields_[1:]})

    def session(self, sampler: Optional["Sampler"] = None, **sampling: Any) -> "Session":
        """A new empty session. Pass a Sampler, or its keyword arguments (temperature=0.7, ...);
        neither: greedy."""
        if sampler is not None and sampling:
            raise TypeError("pass a Sampler or sampling keywords, not both")
        if sampling:
            with Sampler(**sampling) as own:
                return Session(self, own)
        return Session(self, sampler)

    def step(self, time_budget_ms: float = 0.0, step_tokens: int = 0) -> StepResult:
        """Runs steps of the cache on this thread (one, or as many as fit in the time budget);
        returns at once when nothing is in flight."""
        params = _init(_ffi.StepParams, "kiln_step_params_init")
        params.time_budget_ms = time_budget_ms
        params.step_tokens = step_tokens
        out = _out(_ffi.StepResult)
        _check(_lib.kiln_cache_step(self._handle(), byref(params), byref(out)), "kiln_cache_step")
        return StepResult(out.n_steps, out.n_tokens, out.n_active, out.elapsed_ms)

    def start_worker(self) -> None:
        """Starts the library's worker thread, which steps the cache while requests are in flight."""
        _check(_lib.kiln_cache_start_worker(self._handle()), "kiln_cache_start_worker")

    def stop_worker(self) -> None:
        _check(_lib.kiln_cache_stop_worker(self._handle()), "kiln_cache_stop_worker")


# ---------------------------------------------------------------- sampler
class Sampler(_Handle):
    """Sampling parameters (llama.cpp's defaults). Sessions copy them when they are created."""

    _destroy_name = "kiln_sampler_destroy"
    _what = "sampler"

    def __init__(
        self,
        *,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        typical_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        n_logprobs: Optional[int] = None,
        logit_bias: Optional[Mapping[int, float]] = None,
    ) -> None:
        """Unset arguments keep kiln's defaults (temperature 0.8, top_k 40, ...); temperature <= 0
        is greedy. logit_bias maps token ids to a bias (-inf bans the token)."""
        super().__init__()
        params = _init(_ffi.SamplerParams, "kiln_sampler_params_init")
        given = dict(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            penalty_last_n=penalty_last_n,
            seed=seed,
            n_logprobs=n_logprobs,
        )
        for name, value in given.items():
            if value is not None:
                setattr(params, name, value)
        bias = None
        if logit_bias:
            bias = (_ffi.LogitBias * len(logit_bias))(
                *[_ffi.LogitBias(t, b) for t, b in logit_bias.items()]
            )
            params.logit_bias = ctypes.cast(bias, POINTER(_ffi.LogitBias))
            params.n_logit_bias = len(logit_bias)
        h = c_void_p()
        _check(_lib.kiln_sampler_create(byref(params), byref(h)), "kiln_sampler_create")
        self._h = h.value


# ---------------------------------------------------------------- strategies
@dataclass(frozen=True)
class SpecMetrics:
    steps: int
    drafted: int
    accepted: int
    generated: int
    mean_accepted_per_step: float
    target_passes_per_token: float
    accepted_lossy: int = 0  # of accepted: kept by the lossy typical acceptance (0 unless chosen)


class Strategy(_Handle):
    """A speculative-decoding strategy; serves one session at a time (Session.set_strategy)."""

    _destroy_name = "kiln_strategy_destroy"
    _what = "strategy"

    def close(self) -> None:
        # The C API forbids destroying a strategy attached to a live session: detach it first.
        for session in list(self._children):
            if not session.closed and getattr(session, "_strategy", None) is self:
                session.set_strategy(None)
        self._children = weakref.WeakSet()
        super().close()


class NgramStrategy(Strategy):
    """N-gram prompt lookup: drafts continuations of text already in the session (no model)."""

    def __init__(self, **params: Union[int, float, bool]) -> None:
        """Keywords: max_ngram, min_ngram, max_draft, start_draft, max_skip, adaptive,
        fixed_pass_cost_beta (kiln_ngram_params; unset ones keep the defaults)."""
        super().__init__()
        p = _init(_ffi.NgramParams, "kiln_ngram_params_init")
        _set_fields(p, params, "NgramStrategy")
        h = c_void_p()
        _check(_lib.kiln_strategy_create_ngram(byref(p), byref(h)), "kiln_strategy_create_ngram")
        self._h = h.value


class DraftStrategy(Strategy):
    """A draft model (any GGUF with the target's vocabulary size) proposes the tokens."""

    def __init__(
        self, target: Model, draft_path: Union[str, os.PathLike[str]], **params: Union[int, float, bool]
    ) -> None:
        """Keywords: max_draft, adaptive, n_threads, n_ctx, fixed_pass_cost_beta."""
        super().__init__()
        p = _init(_ffi.DraftParams, "kiln_draft_params_init")
        _set_fields(p, params, "DraftStrategy")
        h = c_void_p()
        _check(
            _lib.kiln_strategy_create_draft(target._handle(), os.fsencode(draft_path), byref(p), byref(h)),
            "kiln_strategy_create_draft",
        )
        self._h = h.value


class MedusaStrategy(Strategy):
    """Trained Medusa heads for `target` (a head file made by tools/train/, such as the repository's
    models/SmolLM2-135M-Instruct.medusa.gguf) draft a token tree from the target's hidden state."""

    def __init__(
        self, target: Model, head_path: Union[str, os.PathLike[str]], **params: Union[int, float, bool]
    ) -> None:
        """Keywords: max_draft (tree nodes verified per step; 0: the head's whole tree), n_threads,
        merge_ngram (a bool, default True: the n-gram prompt-lookup continuation of the context is
        merged into every tree), typical_acceptance (a bool, default False: True trades exactness
        for more accepted drafts when sampling, LOSSY; thresholds typical_epsilon 0.09 and
        typical_delta 0.3) (kiln_medusa_params). A head trained for another model, or a file
        that is not a head, raises KilnError(INVALID_ARGUMENT) saying what differs; a missing file
        KilnError(IO)."""
        super().__init__()
        p = _init(_ffi.MedusaParams, "kiln_medusa_params_init")
        _set_fields(p, params, "MedusaStrategy")
        h = c_void_p()
        _check(
            _lib.kiln_strategy_create_medusa(target._handle(), os.fsencode(head_path), byref(p), byref(h)),
            "kiln_strategy_create_medusa",
        )
        self._h = h.value


class EagleStrategy(Strategy):
    """An EAGLE head for `target` (GGUF, architecture "eagle"; kiln-mkeagle writes untrained ones)
    drafts dynamic token trees from the target's features with its own K/V cache."""

    def __init__(
        self, target: Model, head_path: Union[str, os.PathLike[str]], **params: Union[int, float, bool]
    ) -> None:
        """Keywords: top_k (1..64), max_depth (1..16), tree_tokens (each 0, the default: chosen
        each step from the measured pass costs), n_threads, merge_ngram (a bool, default True: the
        n-gram prompt-lookup continuation of the context is merged into every tree),
        typical_acceptance, typical_epsilon, typical_delta (as MedusaStrategy's)
        (kiln_eagle_params). A head for another model or a file that is not an eagle head raises
        KilnError(INVALID_ARGUMENT), a malformed one KilnError(FORMAT)."""
        super().__init__()
        p = _init(_ffi.EagleParams, "kiln_eagle_params_init")
        _set_fields(p, params, "EagleStrategy")
        h = c_void_p()
        _check(
            _lib.kiln_strategy_create_eagle(target._handle(), os.fsencode(head_path), byref(p), byref(h)),
            "kiln_strategy_create_eagle",
        )
        self._h = h.value


def _set_fields(struct: Any, values: Mapping[str, Any], what: str) -> None:
    known = {name for name, _ in type(struct)._fields_[1:]}
    for name, value in values.items():
        if name not in known:
            raise TypeError(f"{what}: unknown parameter {name!r} (known: {', '.join(sorted(known))})")
        setattr(struct, name, int(value) if isinstance(value, bool) else value)


# ---------------------------------------------------------------- session
@dataclass(frozen=True)
class GenerateResult:
    text: str
    tokens: list[int]
    n_tokens: int
    stop_reason: StopReason


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float


@dataclass(frozen=True)
class PollResult:
    text: bytes
    tokens: list[int]
    done: bool
    error: Optional[KilnError]
    stop_reason: Optional[StopReason]
    n_tokens: int


@dataclass(frozen=True)
class RequestResult:
    """How a submitted request ended: error None and a stop reason, or the error."""

    error: Optional[KilnError]
    stop_reason: Optional[StopReason]
    n_tokens: int


def _stop_array(stop: Union[str, Sequence[str], None]) -> tuple[Any, int]:
    if stop is None:
        return None, 0
    items = [stop] if isinstance(stop, (str, bytes)) else list(stop)
    arr = (c_char_p * len(items))(*[_utf8(s) for s in items])
    return ctypes.cast(arr, POINTER(c_char_p)), len(items)


def _flags(add_special: bool, parse_special: bool) -> int:
    return (1 if add_special else 0) | (2 if parse_special else 0)


TokenCallback = Callable[[int, str], Optional[bool]]


class Session(_Handle):
    """One conversation in a cache. Use it from one thread at a time (another thread's call fails
    with Status.BUSY); cancel() and n_tokens work from any thread."""

    _destroy_name = "kiln_session_destroy"
    _what = "session"

    def __init__(self, cache: Cache, sampler: Optional[Sampler] = None, *, _handle: Optional[int] = None):
        super().__init__()
        self.cache = cache
        self.model = cache.model
        self._strategy: Optional[Strategy] = None
        self._request: Optional[dict[str, Any]] = None  # keeps a submitted request's C data alive
        if _handle is None:
            h = c_void_p()
            _check(
                _lib.kiln_session_create(
                    self.model._handle(), cache._handle(), sampler._handle() if sampler else None, byref(h)
                ),
                "kiln_session_create",
            )
            _handle = h.value
        self._h = _handle
        cache._children.add(self)

    # -- contents
    def append(self, text: Union[str, bytes], *, add_special: bool = False, parse_special: bool = False) -> None:
        """Tokenizes and appends text, computing it (a prefill)."""
        data = _utf8(text)
        _check(
            _lib.kiln_session_append_text(self._handle(), data, len(data), _flags(add_special, parse_special)),
            "kiln_session_append_text",
        )

    def append_tokens(self, tokens: Sequence[int]) -> None:
        ids = (c_int32 * len(tokens))(*tokens)
        _check(_lib.kiln_session_append_tokens(self._handle(), ids, len(tokens)), "kiln_session_append_tokens")

    def score(self, tokens: Sequence[int]) -> list[float]:
        """Appends tokens (at least 2) and returns the log-probability of each token after the
        first given what precedes it (perplexity scoring)."""
        ids = (c_int32 * len(tokens))(*tokens)
        out = (c_float * max(len(tokens) - 1, 1))()
        _check(
            _lib.kiln_session_append_tokens_scored(self._handle(), ids, len(tokens), out),
            "kiln_session_append_tokens_scored",
        )
        return list(out[: max(len(tokens) - 1, 0)])

    @property
    def n_tokens(self) -> int:
        """Tokens held (prompt and generated); safe from any thread."""
        return int(_lib.kiln_session_n_tokens(self._handle()))

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def tokens(self) -> list[int]:
        h = self._handle()
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_session_get_tokens(h, b, cap, n),
            c_int32,
            self.n_tokens,
            "kiln_session_get_tokens",
        )
        return list(buf[:n])

    @property
    def logits(self) -> array:
        """A copy of the next-token logits [n_vocab] (float32)."""
        ptr = POINTER(c_float)()
        n = c_int32()
        _check(_lib.kiln_session_get_logits(self._handle(), byref(ptr), byref(n)), "kiln_session_get_logits")
        return array("f", ctypes.string_at(ptr, n.value * 4))

    def logprobs(self) -> list[TokenLogprob]:
        """Top log-probabilities (highest first) of the last generated token's distribution;
        Sampler(n_logprobs=N) entries."""
        h = self._handle()
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_session_get_logprobs(h, b, cap, n),
            _ffi.TokenLogprob,
            16,
            "kiln_session_get_logprobs",
        )
        return [TokenLogprob(e.token, e.logprob) for e in buf[:n]]

    def rewind(self, n_tokens: int) -> None:
        """Removes the last n_tokens tokens."""
        if n_tokens < 0:
            raise KilnError(Status.INVALID_ARGUMENT, f"rewind: n_tokens {n_tokens} < 0")
        _check(_lib.kiln_session_rewind(self._handle(), n_tokens), "kiln_session_rewind")

    def fork(self) -> "Session":
        """A new session with the same tokens (blocks shared copy-on-write), sampler and state."""
        h = c_void_p()
        _check(_lib.kiln_session_fork(self._handle(), byref(h)), "kiln_session_fork")
        return Session(self.cache, _handle=h.value)

    def cancel(self) -> None:
        """Stops the call or request in flight on this session; any thread, any time."""
        _check(_lib.kiln_session_cancel(self._handle()), "kiln_session_cancel")

    # -- generation
    def generate(
        self,
        max_tokens: int = 128,
        *,
        stop: Union[str, Sequence[str], None] = None,
        callback: Optional[TokenCallback] = None,
    ) -> GenerateResult:
        """Generates up to max_tokens tokens, blocking. callback(token, piece) sees each token and
        the text it completed (token -1: held-back text at the end); returning True stops.
        An exception in the callback stops the generate and is re-raised here."""
        params = _init(_ffi.GenerateParams, "kiln_generate_params_init")
        params.max_tokens = max_tokens
        params.stop_strings, params.n_stop_strings = _stop_array(stop)
        pieces: list[bytes] = []
        tokens: list[int] = []
        guard = _CallbackGuard()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")

        def on_token(token: int, piece: Any, length: int, _user: Any) -> int:
            data = ctypes.string_at(piece, length) if length else b""
            pieces.append(data)
            if token >= 0:
                tokens.append(token)
            if callback is None:
                return 0
            text = decoder.decode(data, final=token < 0)
            return 1 if guard.run(lambda: bool(callback(token, text)), True) else 0

        params.callback = _ffi.TokenFn(on_token)
        out = _out(_ffi.GenerateResult)
        code = _lib.kiln_session_generate(self._handle(), byref(params), byref(out))
        guard.reraise()
        _check(code, "kiln_session_generate")
        text = b"".join(pieces).decode("utf-8", "replace")
        return GenerateResult(text, tokens, out.n_tokens, StopReason(out.stop_reason))

    def stream(
        self,
        max_tokens: int = 128,
        *,
        prompt: Union[str, bytes, None] = None,
        parse_special: bool = False,
        stop: Union[str, Sequence[str], None] = None,
        time_budget_ms: float = 0.0,
    ) -> "Stream":
        """Generates as an iterator of text pieces (whole UTF-8 characters), via submit/poll: each
        next() steps the cache on this thread (or waits for the cache's worker) until text
        arrives. Leaving the loop early cancels the request. The Stream's `result` holds the stop
        reason once it is exhausted."""
        return Stream(self, max_tokens, prompt, parse_special, stop, time_budget_ms)

    # -- non-blocking requests
    def submit(
        self,
        text: Union[str, bytes, None] = None,
        *,
        tokens: Optional[Sequence[int]] = None,
        max_tokens: int = 128,
        add_special: bool = False,
        parse_special: bool = False,
        stop: Union[str, Sequence[str], None] = None,
        on_token: Optional[TokenCallback] = None,
        on_done: Optional[Callable[[RequestResult], None]] = None,
    ) -> None:
        """Starts a request (append the prompt, then generate) and returns at once. It runs as the
        cache is stepped: Cache.step() on a thread of yours, Cache.start_worker(), or a blocking
        call on another session of the cache. Read results with poll(), or with the callbacks
        (they run on the stepping thread; exceptions there are printed, not raised)."""
        params = _init(_ffi.RequestParams, "kiln_request_params_init")
        keep: dict[str, Any] = {}
        if text is not None:
            keep["text"] = data = _utf8(text)
            params.text, params.text_len = data, len(data)
        params.text_flags = _flags(add_special, parse_special)
        if tokens is not None:
            keep["tokens"] = ids = (c_int32 * len(tokens))(*tokens)
            params.tokens, params.n_tokens = ctypes.cast(ids, POINTER(c_int32)), len(tokens)
        params.max_tokens = max_tokens
        keep["stop"] = params.stop_strings, params.n_stop_strings = _stop_array(stop)
        if on_token is not None:
            decoder = codecs.getincrementaldecoder("utf-8")("replace")

            def token_fn(token: int, piece: Any, length: int, _user: Any) -> int:
                try:
                    text = decoder.decode(ctypes.string_at(piece, length) if length else b"", final=token < 0)
                    return 1 if on_token(token, text) else 0
                except BaseException:  # noqa: BLE001 - no exception may unwind into C
                    import traceback

                    traceback.print_exc()
                    return 1

            keep["on_token"] = params.on_token = _ffi.TokenFn(token_fn)
        if on_done is not None:

            def done_fn(_session: Any, status: int, reason: int, n: int, _user: Any) -> None:
                try:
                    error = None
                    if status != 0:
                        error = KilnError(status, _lib.kiln_last_error_message().decode("utf-8", "replace"), "request")
                    on_done(RequestResult(error, None if error else StopReason(reason), n))
                except BaseException:  # noqa: BLE001 - no exception may unwind into C
                    import traceback

                    traceback.print_exc()

            keep["on_done"] = params.on_done = _ffi.DoneFn(done_fn)
        _check(_lib.kiln_session_submit(self._handle(), byref(params)), "kiln_session_submit")
        # The callbacks and the C strings must outlive the request (until the next submit).
        self._request = keep

    def poll(self, text_capacity: int = 4096, token_capacity: int = 256) -> PollResult:
        """Takes the output of the submitted request made since the last poll (raw UTF-8 bytes,
        which may end inside a character) and whether it is done. Any thread, any time."""
        text = (c_char * text_capacity)()
        toks = (c_int32 * token_capacity)()
        out = _out(_ffi.PollResult)
        _check(
            _lib.kiln_session_poll(self._handle(), text, text_capacity, toks, token_capacity, byref(out)),
            "kiln_session_poll",
        )
        error = None
        if out.done and out.status != 0:
            error = KilnError(out.status, _lib.kiln_last_error_message().decode("utf-8", "replace"), "request")
        return PollResult(
            text.raw[: out.text_len],
            list(toks[: out.n_new_tokens]),
            bool(out.done),
            error,
            StopReason(out.stop_reason) if out.done and error is None else None,
            out.n_tokens,
        )

    # -- speculative decoding
    def set_strategy(self, strategy: Optional[Strategy]) -> None:
        """Attaches a speculative strategy (None: plain decoding) to the next generates."""
        _check(
            _lib.kiln_session_set_strategy(self._handle(), strategy._handle() if strategy else None),
            "kiln_session_set_strategy",
        )
        self._strategy = strategy
        if strategy is not None:
            strategy._children.add(self)

    @property
    def spec_metrics(self) -> SpecMetrics:
        out = _out(_ffi.SpecMetrics)
        _check(_lib.kiln_session_get_spec_metrics(self._handle(), byref(out)), "kiln_session_get_spec_metrics")
        return SpecMetrics(
            out.steps,
            out.drafted,
            out.accepted,
            out.generated,
            out.mean_accepted_per_step,
            out.target_passes_per_token,
            out.accepted_lossy,
        )

    # -- saved states
    def save_state(self, *, kv: bool = True, strategy: bool = True) -> bytes:
        """The session's state (tokens, K/V unless kv=False, sampler, strategy) as bytes."""
        params = self._state_params(kv, strategy)
        h = self._handle()
        buf, n = _sized_call(
            lambda b, cap, n: _lib.kiln_session_save_state(h, byref(params), b, cap, n),
            c_char,
            0,
            "kiln_session_save_state",
        )
        return buf.raw[:n]

    def load_state(self, state: bytes) -> None:
        """Replaces the contents with a saved state (all or nothing)."""
        _check(_lib.kiln_session_load_state(self._handle(), state, len(state)), "kiln_session_load_state")

    def save_state_file(self, path: Union[str, os.PathLike[str]], *, kv: bool = True, strategy: bool = True) -> None:
        params = self._state_params(kv, strategy)
        _check(
            _lib.kiln_session_save_state_file(self._handle(), byref(params), os.fsencode(path)),
            "kiln_session_save_state_file",
        )

    def load_state_file(self, path: Union[str, os.PathLike[str]]) -> None:
        _check(_lib.kiln_session_load_state_file(self._handle(), os.fsencode(path)), "kiln_session_load_state_file")

    @staticmethod
    def _state_params(kv: bool, strategy: bool) -> Any:
        params = _init(_ffi.StateParams, "kiln_state_params_init")
        params.kv = 1 if kv else 0
        params.strategy = 1 if strategy else 0
        return params

    def close(self) -> None:
        super().close()
        self._request = None


class Stream(Iterator[str]):
    """Text pieces of a submitted request, stepped by the consumer (see Session.stream)."""

    def __init__(
        self,
        session: Session,
        max_tokens: int,
        prompt: Union[str, bytes, None],
        parse_special: bool,
        stop: Union[str, Sequence[str], None],
        time_budget_ms: float,
    ) -> None:
        self.session = session
        self.result: Optional[RequestResult] = None
        self.tokens: list[int] = []
        self._budget = time_budget_ms
        self._raised = False
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        session.submit(prompt, max_tokens=max_tokens, parse_special=parse_special, stop=stop)

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        while self.result is None:
            polled = self.session.poll()
            self.tokens += polled.tokens
            text = self._decoder.decode(polled.text, final=polled.done)
            if polled.done:
                self.result = RequestResult(polled.error, polled.stop_reason, polled.n_tokens)
            if text:
                return text
            if polled.done:
                break
            # Waits for the worker's step when one runs, else computes one itself.
            self.session.cache.step(self._budget)
        if self.result is not None and self.result.error is not None and not self._raised:
            self._raised = True  # once; `result` keeps the error
            raise self.result.error
        raise StopIteration

    def close(self) -> None:
        """Cancels the request if it is still running and waits until it has ended."""
        if self.result is None and not self.session.closed:
            self.session.cancel()
            try:
                for _ in self:
                    pass
            except KilnError as e:  # cancelled before its first token: nothing was kept
                if e.status != Status.CANCELLED:
                    raise

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
