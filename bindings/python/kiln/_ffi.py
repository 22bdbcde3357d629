"""Raw ctypes declarations of include/kiln/kiln.h (ABI 1) and the lookup of libkiln.

Every struct here mirrors the header field for field; the public module (kiln/__init__.py) is the
only user. Keep both in step with kiln.h when it grows (versioned structs only grow at their end).
"""

from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)

from ._libpath import ABI_VERSION, candidates


def _load() -> ctypes.CDLL:
    errors = []
    for path in candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "kiln: cannot load libkiln (set KILN_LIBRARY to the path of libkiln.so or kiln.dll); tried:\n  "
        + "\n  ".join(errors)
    )


lib = _load()

# ---------------------------------------------------------------- callbacks
LogFn = CFUNCTYPE(None, c_int, c_char_p, c_void_p)
ProgressFn = CFUNCTYPE(c_int, c_float, c_void_p)
# piece is (const char*, size_t): declared as a pointer so that embedded bytes are not cut at NUL.
TokenFn = CFUNCTYPE(c_int, c_int32, POINTER(c_char), c_size_t, c_void_p)
DoneFn = CFUNCTYPE(None, c_void_p, c_int, c_int, c_int32, c_void_p)


# ---------------------------------------------------------------- structs
class ModelParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("path", c_char_p),
        ("use_mmap", c_int),
        ("progress", ProgressFn),
        ("progress_user_data", c_void_p),
        ("log", LogFn),
        ("log_user_data", c_void_p),
    ]


class ModelInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("architecture", c_char_p),
        ("name", c_char_p),
        ("n_params", c_int64),
        ("size_bytes", c_int64),
        ("n_vocab", c_int32),
        ("n_ctx_train", c_int32),
        ("n_embd", c_int32),
        ("n_layer", c_int32),
        ("n_head", c_int32),
        ("n_head_kv", c_int32),
        ("head_dim", c_int32),
        ("n_ff", c_int32),
        ("token_bos", c_int32),
        ("token_eos", c_int32),
        ("token_eot", c_int32),
    ]


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class CacheParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("pool_bytes", c_size_t),
        ("block_size", c_int32),
        ("kv_type", c_int),
        ("prefix_caching", c_int),
        ("n_ctx", c_int32),
        ("n_threads", c_int32),
        ("llama_cpp_order", c_int),
        ("step_tokens", c_int32),
        ("backend", c_int),
        ("cuda_device", c_int32),
        ("mla_prefill", c_int),
        ("sliding_window_sessions", c_int32),  # no longer read
        ("swa_full", c_int),
        ("pin_threads", c_int),
    ]


class CacheStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_ctx", c_int32),
        ("block_size", c_int32),
        ("blocks_total", c_int32),
        ("blocks_free", c_int32),
        ("blocks_used", c_int32),
        ("blocks_cached", c_int32),
        ("n_sequences", c_int32),
        ("prefix_lookups", c_int64),
        ("prefix_query_tokens", c_int64),
        ("prefix_hit_tokens", c_int64),
        ("evictions", c_int64),
        ("bytes_per_token", c_size_t),
        ("block_bytes", c_size_t),
        ("kv_bytes_in_use", c_size_t),
        ("sliding_blocks_total", c_int32),
        ("sliding_blocks_used", c_int32),
        ("sliding_blocks_released", c_int64),
        ("sliding_block_bytes", c_size_t),
    ]


class LogitBias(Structure):
    _fields_ = [("token", c_int32), ("bias", c_float)]


class SamplerParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("typical_p", c_float),
        ("repeat_penalty", c_float),
        ("frequency_penalty", c_float),
        ("presence_penalty", c_float),
        ("penalty_last_n", c_int32),
        ("seed", c_uint64),
        ("n_logprobs", c_int32),
        ("logit_bias", POINTER(LogitBias)),
        ("n_logit_bias", c_size_t),
    ]


class GenerateParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_tokens", c_int32),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_size_t),
        ("callback", TokenFn),
        ("user_data", c_void_p),
    ]


class GenerateResult(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_tokens", c_int32), ("stop_reason", c_int)]


class TokenLogprob(Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float)]


class RequestParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("text", c_char_p),
        ("text_len", c_size_t),
        ("text_flags", c_uint32),
        ("tokens", POINTER(c_int32)),
        ("n_tokens", c_size_t),
        ("max_tokens", c_int32),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_size_t),
        ("on_token", TokenFn),
        ("on_done", DoneFn),
        ("user_data", c_void_p),
    ]


class PollResult(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("text_len", c_size_t),
        ("n_new_tokens", c_size_t),
        ("text_left", c_size_t),
        ("tokens_left", c_size_t),
        ("done", c_int),
        ("status", c_int),
        ("stop_reason", c_int),
        ("n_tokens", c_int32),
    ]


class StepParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("time_budget_ms", c_double), ("step_tokens", c_int32)]


class StepResult(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_steps", c_int32),
        ("n_tokens", c_int64),
        ("n_active", c_int32),
        ("elapsed_ms", c_double),
    ]


class StateParams(Structure):
    _fields_ = [("struct_size", c_uint32), ("kv", c_int32), ("strategy", c_int32)]


class NgramParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_ngram", c_int32),
        ("min_ngram", c_int32),
        ("max_draft", c_int32),
        ("start_draft", c_int32),
        ("max_skip", c_int32),
        ("adaptive", c_int32),
        ("fixed_pass_cost_beta", c_double),
    ]


class DraftParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_draft", c_int32),
        ("adaptive", c_int32),
        ("n_threads", c_int32),
        ("n_ctx", c_int32),
        ("fixed_pass_cost_beta", c_double),
    ]


class MedusaParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_draft", c_int32),
        ("n_threads", c_int32),
        ("merge_ngram", c_int32),
        ("typical_acceptance", c_int32),
        ("typical_epsilon", c_float),
        ("typical_delta", c_float),
    ]


class EagleParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("top_k", c_int32),
        ("max_depth", c_int32),
        ("tree_tokens", c_int32),
        ("n_threads", c_int32),
        ("merge_ngram", c_int32),
        ("typical_acceptance", c_int32),
        ("typical_epsilon", c_float),
        ("typical_delta", c_float),
    ]


class SpecMetrics(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("steps", c_int64),
        ("drafted", c_int64),
        ("accepted", c_int64),
        ("generated", c_int64),
        ("mean_accepted_per_step", c_double),
        ("target_passes_per_token", c_double),
        ("accepted_lossy", c_int64),
    ]


# ---------------------------------------------------------------- functions
H = c_void_p  # every opaque handle
P = POINTER
_status = c_int

_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "kiln_version": (c_char_p, []),
    "kiln_abi_version": (c_int, []),
    "kiln_cpu_info": (c_char_p, []),
    "kiln_backends": (c_char_p, []),
    "kiln_status_name": (c_char_p, [c_int]),
    "kiln_last_error_message": (c_char_p, []),
    "kiln_model_params_init": (_status, [P(ModelParams), c_size_t]),
    "kiln_model_load": (_status, [P(ModelParams), P(H)]),
    "kiln_model_destroy": (None, [H]),
    "kiln_model_get_info": (_status, [H, P(ModelInfo)]),
    "kiln_model_meta_count": (c_size_t, [H]),
    "kiln_model_meta_at": (_status, [H, c_size_t, P(c_char_p), P(c_char_p)]),
    "kiln_model_meta_get": (_status, [H, c_char_p, P(c_char_p)]),
    "kiln_model_token_is_eog": (c_int, [H, c_int32]),
    "kiln_gguf_open": (_status, [c_char_p, P(H)]),
    "kiln_gguf_destroy": (None, [H]),
    "kiln_gguf_meta_count": (c_size_t, [H]),
    "kiln_gguf_meta_at": (_status, [H, c_size_t, P(c_char_p), P(c_char_p)]),
    "kiln_gguf_unsupported": (c_char_p, [H]),
    "kiln_tokenize": (_status, [H, c_char_p, c_size_t, c_uint32, P(c_int32), c_size_t, P(c_size_t)]),
    "kiln_detokenize": (_status, [H, P(c_int32), c_size_t, c_uint32, P(c_char), c_size_t, P(c_size_t)]),
    "kiln_chat_apply_template": (
        _status,
        [H, c_char_p, P(ChatMessage), c_size_t, c_int, P(c_char), c_size_t, P(c_size_t)],
    ),
    "kiln_cache_params_init": (_status, [P(CacheParams), c_size_t]),
    "kiln_cache_create": (_status, [H, P(CacheParams), P(H)]),
    "kiln_cache_destroy": (None, [H]),
    "kiln_cache_backend": (c_char_p, [H]),
    "kiln_cache_get_stats": (_status, [H, P(CacheStats)]),
    "kiln_sampler_params_init": (_status, [P(SamplerParams), c_size_t]),
    "kiln_sampler_create": (_status, [P(SamplerParams), P(H)]),
    "kiln_sampler_destroy": (None, [H]),
    "kiln_session_create": (_status, [H, H, H, P(H)]),
    "kiln_session_destroy": (None, [H]),
    "kiln_session_append_text": (_status, [H, c_char_p, c_size_t, c_uint32]),
    "kiln_session_append_tokens": (_status, [H, P(c_int32), c_size_t]),
    "kiln_session_append_tokens_scored": (_status, [H, P(c_int32), c_size_t, P(c_float)]),
    "kiln_generate_params_init": (_status, [P(GenerateParams), c_size_t]),
    "kiln_session_generate": (_status, [H, P(GenerateParams), P(GenerateResult)]),
    "kiln_session_cancel": (_status, [H]),
    "kiln_session_fork": (_status, [H, P(H)]),
    "kiln_session_rewind": (_status, [H, c_size_t]),
    "kiln_session_n_tokens": (c_size_t, [H]),
    "kiln_session_get_tokens": (_status, [H, P(c_int32), c_size_t, P(c_size_t)]),
    "kiln_session_get_logits": (_status, [H, P(P(c_float)), P(c_int32)]),
    "kiln_session_get_logprobs": (_status, [H, P(TokenLogprob), c_size_t, P(c_size_t)]),
    "kiln_request_params_init": (_status, [P(RequestParams), c_size_t]),
    "kiln_session_submit": (_status, [H, P(RequestParams)]),
    "kiln_session_poll": (_status, [H, P(c_char), c_size_t, P(c_int32), c_size_t, P(PollResult)]),
    "kiln_step_params_init": (_status, [P(StepParams), c_size_t]),
    "kiln_cache_step": (_status, [H, P(StepParams), P(StepResult)]),
    "kiln_cache_start_worker": (_status, [H]),
    "kiln_cache_stop_worker": (_status, [H]),
    "kiln_state_params_init": (_status, [P(StateParams), c_size_t]),
    "kiln_session_save_state": (_status, [H, P(StateParams), c_void_p, c_size_t, P(c_size_t)]),
    "kiln_session_load_state": (_status, [H, c_void_p, c_size_t]),
    "kiln_session_save_state_file": (_status, [H, P(StateParams), c_char_p]),
    "kiln_session_load_state_file": (_status, [H, c_char_p]),
    "kiln_ngram_params_init": (_status, [P(NgramParams), c_size_t]),
    "kiln_strategy_create_ngram": (_status, [P(NgramParams), P(H)]),
    "kiln_draft_params_init": (_status, [P(DraftParams), c_size_t]),
    "kiln_strategy_create_draft": (_status, [H, c_char_p, P(DraftParams), P(H)]),
    "kiln_medusa_params_init": (_status, [P(MedusaParams), c_size_t]),
    "kiln_strategy_create_medusa": (_status, [H, c_char_p, P(MedusaParams), P(H)]),
    "kiln_eagle_params_init": (_status, [P(EagleParams), c_size_t]),
    "kiln_strategy_create_eagle": (_status, [H, c_char_p, P(EagleParams), P(H)]),
    "kiln_strategy_destroy": (None, [H]),
    "kiln_session_set_strategy": (_status, [H, H]),
    "kiln_session_get_spec_metrics": (_status, [H, P(SpecMetrics)]),
}

for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes

if lib.kiln_abi_version() != ABI_VERSION:
    raise ImportError(
        f"kiln: the loaded libkiln has ABI {lib.kiln_abi_version()}, this package needs {ABI_VERSION}"
    )
