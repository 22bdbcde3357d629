//! Raw declarations of kiln's C API, `include/kiln/kiln.h` (ABI 1), one for one. The header is
//! the specification; the safe `kiln` crate wraps these.
//!
//! C enums are plain `c_int` type aliases with constants: a value from a newer library then stays
//! representable instead of being undefined behaviour in a Rust enum.
#![allow(non_camel_case_types)]

// std::os::raw rather than core::ffi: the C type aliases reached core in Rust 1.64, after the
// binding's minimum (Debian 12's 1.63).
use std::ffi::c_void;
use std::os::raw::{c_char, c_double, c_float, c_int};

pub const KILN_ABI_VERSION: c_int = 1;

/// Opaque handle types.
#[repr(C)]
pub struct kiln_model {
    _private: [u8; 0],
}
#[repr(C)]
pub struct kiln_gguf {
    _private: [u8; 0],
}
#[repr(C)]
pub struct kiln_cache {
    _private: [u8; 0],
}
#[repr(C)]
pub struct kiln_sampler {
    _private: [u8; 0],
}
#[repr(C)]
pub struct kiln_session {
    _private: [u8; 0],
}
#[repr(C)]
pub struct kiln_strategy {
    _private: [u8; 0],
}

pub type kiln_status = c_int;
pub const KILN_OK: kiln_status = 0;
pub const KILN_ERR_INVALID_ARGUMENT: kiln_status = 1;
pub const KILN_ERR_IO: kiln_status = 2;
pub const KILN_ERR_FORMAT: kiln_status = 3;
pub const KILN_ERR_UNSUPPORTED: kiln_status = 4;
pub const KILN_ERR_OUT_OF_MEMORY: kiln_status = 5;
pub const KILN_ERR_CACHE_FULL: kiln_status = 6;
pub const KILN_ERR_CANCELLED: kiln_status = 7;
pub const KILN_ERR_OUT_OF_RANGE: kiln_status = 8;
pub const KILN_ERR_BUFFER_TOO_SMALL: kiln_status = 9;
pub const KILN_ERR_BUSY: kiln_status = 10;
pub const KILN_ERR_INTERNAL: kiln_status = 11;

pub type kiln_log_level = c_int;
pub const KILN_LOG_DEBUG: kiln_log_level = 0;
pub const KILN_LOG_INFO: kiln_log_level = 1;
pub const KILN_LOG_WARN: kiln_log_level = 2;
pub const KILN_LOG_ERROR: kiln_log_level = 3;

pub type kiln_kv_type = c_int;
pub const KILN_KV_F16: kiln_kv_type = 0;
pub const KILN_KV_F32: kiln_kv_type = 1;
pub const KILN_KV_BF16: kiln_kv_type = 2;
pub const KILN_KV_Q8_0: kiln_kv_type = 3;

pub type kiln_backend_kind = c_int;
pub const KILN_BACKEND_CPU: kiln_backend_kind = 0;
pub const KILN_BACKEND_CUDA: kiln_backend_kind = 1;
pub const KILN_BACKEND_AUTO: kiln_backend_kind = 2;

pub type kiln_mla_prefill = c_int;
pub const KILN_MLA_PREFILL_ABSORBED: kiln_mla_prefill = 0;
pub const KILN_MLA_PREFILL_MEASURED: kiln_mla_prefill = 1;

pub type kiln_stop_reason = c_int;
pub const KILN_STOP_EOG: kiln_stop_reason = 0;
pub const KILN_STOP_MAX_TOKENS: kiln_stop_reason = 1;
pub const KILN_STOP_STRING: kiln_stop_reason = 2;
pub const KILN_STOP_CALLBACK: kiln_stop_reason = 3;
pub const KILN_STOP_CANCELLED: kiln_stop_reason = 4;
pub const KILN_STOP_CONTEXT_FULL: kiln_stop_reason = 5;

pub const KILN_TOKENIZE_ADD_SPECIAL: u32 = 1;
pub const KILN_TOKENIZE_PARSE_SPECIAL: u32 = 2;
pub const KILN_DETOKENIZE_RENDER_SPECIAL: u32 = 1;

pub type kiln_log_fn =
    Option<unsafe extern "C" fn(level: kiln_log_level, message: *const c_char, user_data: *mut c_void)>;
pub type kiln_progress_fn = Option<unsafe extern "C" fn(progress: c_float, user_data: *mut c_void) -> c_int>;
pub type kiln_token_fn = Option<
    unsafe extern "C" fn(token: i32, piece: *const c_char, piece_len: usize, user_data: *mut c_void) -> c_int,
>;
pub type kiln_done_fn = Option<
    unsafe extern "C" fn(
        session: *mut kiln_session,
        status: kiln_status,
        reason: kiln_stop_reason,
        n_tokens: i32,
        user_data: *mut c_void,
    ),
>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_model_params {
    pub struct_size: u32,
    pub path: *const c_char,
    pub use_mmap: c_int,
    pub progress: kiln_progress_fn,
    pub progress_user_data: *mut c_void,
    pub log: kiln_log_fn,
    pub log_user_data: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_model_info {
    pub struct_size: u32,
    pub architecture: *const c_char,
    pub name: *const c_char,
    pub n_params: i64,
    pub size_bytes: i64,
    pub n_vocab: i32,
    pub n_ctx_train: i32,
    pub n_embd: i32,
    pub n_layer: i32,
    pub n_head: i32,
    pub n_head_kv: i32,
    pub head_dim: i32,
    pub n_ff: i32,
    pub token_bos: i32,
    pub token_eos: i32,
    pub token_eot: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_cache_params {
    pub struct_size: u32,
    pub pool_bytes: usize,
    pub block_size: i32,
    pub kv_type: kiln_kv_type,
    pub prefix_caching: c_int,
    pub n_ctx: i32,
    pub n_threads: i32,
    pub llama_cpp_order: c_int,
    pub step_tokens: i32,
    pub backend: kiln_backend_kind,
    pub cuda_device: i32,
    pub mla_prefill: kiln_mla_prefill,
    pub sliding_window_sessions: i32, // no longer read
    pub swa_full: c_int,
    pub pin_threads: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_cache_stats {
    pub struct_size: u32,
    pub n_ctx: i32,
    pub block_size: i32,
    pub blocks_total: i32,
    pub blocks_free: i32,
    pub blocks_used: i32,
    pub blocks_cached: i32,
    pub n_sequences: i32,
    pub prefix_lookups: i64,
    pub prefix_query_tokens: i64,
    pub prefix_hit_tokens: i64,
    pub evictions: i64,
    pub bytes_per_token: usize,
    pub block_bytes: usize,
    pub kv_bytes_in_use: usize,
    pub sliding_blocks_total: i32,
    pub sliding_blocks_used: i32,
    pub sliding_blocks_released: i64,
    pub sliding_block_bytes: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_logit_bias {
    pub token: i32,
    pub bias: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_sampler_params {
    pub struct_size: u32,
    pub temperature: c_float,
    pub top_k: i32,
    pub top_p: c_float,
    pub min_p: c_float,
    pub typical_p: c_float,
    pub repeat_penalty: c_float,
    pub frequency_penalty: c_float,
    pub presence_penalty: c_float,
    pub penalty_last_n: i32,
    pub seed: u64,
    pub n_logprobs: i32,
    pub logit_bias: *const kiln_logit_bias,
    pub n_logit_bias: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_generate_params {
    pub struct_size: u32,
    pub max_tokens: i32,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub callback: kiln_token_fn,
    pub user_data: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_generate_result {
    pub struct_size: u32,
    pub n_tokens: i32,
    pub stop_reason: kiln_stop_reason,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_token_logprob {
    pub token: i32,
    pub logprob: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_request_params {
    pub struct_size: u32,
    pub text: *const c_char,
    pub text_len: usize,
    pub text_flags: u32,
    pub tokens: *const i32,
    pub n_tokens: usize,
    pub max_tokens: i32,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub on_token: kiln_token_fn,
    pub on_done: kiln_done_fn,
    pub user_data: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_poll_result {
    pub struct_size: u32,
    pub text_len: usize,
    pub n_new_tokens: usize,
    pub text_left: usize,
    pub tokens_left: usize,
    pub done: c_int,
    pub status: kiln_status,
    pub stop_reason: kiln_stop_reason,
    pub n_tokens: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_step_params {
    pub struct_size: u32,
    pub time_budget_ms: c_double,
    pub step_tokens: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_step_result {
    pub struct_size: u32,
    pub n_steps: i32,
    pub n_tokens: i64,
    pub n_active: i32,
    pub elapsed_ms: c_double,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_state_params {
    pub struct_size: u32,
    pub kv: i32,
    pub strategy: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_ngram_params {
    pub struct_size: u32,
    pub max_ngram: i32,
    pub min_ngram: i32,
    pub max_draft: i32,
    pub start_draft: i32,
    pub max_skip: i32,
    pub adaptive: i32,
    pub fixed_pass_cost_beta: c_double,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_draft_params {
    pub struct_size: u32,
    pub max_draft: i32,
    pub adaptive: i32,
    pub n_threads: i32,
    pub n_ctx: i32,
    pub fixed_pass_cost_beta: c_double,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_medusa_params {
    pub struct_size: u32,
    pub max_draft: i32,
    pub n_threads: i32,
    pub merge_ngram: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_eagle_params {
    pub struct_size: u32,
    pub top_k: i32,
    pub max_depth: i32,
    pub tree_tokens: i32,
    pub n_threads: i32,
    pub merge_ngram: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_spec_metrics {
    pub struct_size: u32,
    pub steps: i64,
    pub drafted: i64,
    pub accepted: i64,
    pub generated: i64,
    pub mean_accepted_per_step: c_double,
    pub target_passes_per_token: c_double,
}

extern "C" {
    pub fn kiln_version() -> *const c_char;
    pub fn kiln_abi_version() -> c_int;
    pub fn kiln_cpu_info() -> *const c_char;
    pub fn kiln_backends() -> *const c_char;
    pub fn kiln_status_name(status: kiln_status) -> *const c_char;
    pub fn kiln_last_error_message() -> *const c_char;

    pub fn kiln_model_params_init(params: *mut kiln_model_params, struct_size: usize) -> kiln_status;
    pub fn kiln_model_load(params: *const kiln_model_params, out_model: *mut *mut kiln_model) -> kiln_status;
    pub fn kiln_model_destroy(model: *mut kiln_model);
    pub fn kiln_model_get_info(model: *const kiln_model, info: *mut kiln_model_info) -> kiln_status;
    pub fn kiln_model_meta_count(model: *const kiln_model) -> usize;
    pub fn kiln_model_meta_at(
        model: *const kiln_model,
        index: usize,
        key: *mut *const c_char,
        value: *mut *const c_char,
    ) -> kiln_status;
    pub fn kiln_model_meta_get(
        model: *const kiln_model,
        key: *const c_char,
        value: *mut *const c_char,
    ) -> kiln_status;
    pub fn kiln_model_token_is_eog(model: *const kiln_model, token: i32) -> c_int;

    pub fn kiln_gguf_open(path: *const c_char, out: *mut *mut kiln_gguf) -> kiln_status;
    pub fn kiln_gguf_destroy(gguf: *mut kiln_gguf);
    pub fn kiln_gguf_meta_count(gguf: *const kiln_gguf) -> usize;
    pub fn kiln_gguf_meta_at(
        gguf: *const kiln_gguf,
        index: usize,
        key: *mut *const c_char,
        value: *mut *const c_char,
    ) -> kiln_status;
    pub fn kiln_gguf_unsupported(gguf: *const kiln_gguf) -> *const c_char;

    pub fn kiln_tokenize(
        model: *const kiln_model,
        text: *const c_char,
        text_len: usize,
        flags: u32,
        tokens: *mut i32,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> kiln_status;
    pub fn kiln_detokenize(
        model: *const kiln_model,
        tokens: *const i32,
        n_tokens: usize,
        flags: u32,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
    ) -> kiln_status;
    pub fn kiln_chat_apply_template(
        model: *const kiln_model,
        tmpl: *const c_char,
        messages: *const kiln_chat_message,
        n_messages: usize,
        add_generation_prompt: c_int,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
    ) -> kiln_status;

    pub fn kiln_cache_params_init(params: *mut kiln_cache_params, struct_size: usize) -> kiln_status;
    pub fn kiln_cache_create(
        model: *const kiln_model,
        params: *const kiln_cache_params,
        out_cache: *mut *mut kiln_cache,
    ) -> kiln_status;
    pub fn kiln_cache_destroy(cache: *mut kiln_cache);
    pub fn kiln_cache_backend(cache: *const kiln_cache) -> *const c_char;
    pub fn kiln_cache_get_stats(cache: *const kiln_cache, stats: *mut kiln_cache_stats) -> kiln_status;

    pub fn kiln_sampler_params_init(params: *mut kiln_sampler_params, struct_size: usize) -> kiln_status;
    pub fn kiln_sampler_create(
        params: *const kiln_sampler_params,
        out_sampler: *mut *mut kiln_sampler,
    ) -> kiln_status;
    pub fn kiln_sampler_destroy(sampler: *mut kiln_sampler);

    pub fn kiln_session_create(
        model: *const kiln_model,
        cache: *mut kiln_cache,
        sampler: *const kiln_sampler,
        out_session: *mut *mut kiln_session,
    ) -> kiln_status;
    pub fn kiln_session_destroy(session: *mut kiln_session);
    pub fn kiln_session_append_text(
        session: *mut kiln_session,
        text: *const c_char,
        len: usize,
        flags: u32,
    ) -> kiln_status;
    pub fn kiln_session_append_tokens(
        session: *mut kiln_session,
        tokens: *const i32,
        n_tokens: usize,
    ) -> kiln_status;
    pub fn kiln_session_append_tokens_scored(
        session: *mut kiln_session,
        tokens: *const i32,
        n_tokens: usize,
        logprobs: *mut c_float,
    ) -> kiln_status;
    pub fn kiln_generate_params_init(params: *mut kiln_generate_params, struct_size: usize) -> kiln_status;
    pub fn kiln_session_generate(
        session: *mut kiln_session,
        params: *const kiln_generate_params,
        result: *mut kiln_generate_result,
    ) -> kiln_status;
    pub fn kiln_session_cancel(session: *mut kiln_session) -> kiln_status;
    pub fn kiln_session_fork(session: *mut kiln_session, out_session: *mut *mut kiln_session) -> kiln_status;
    pub fn kiln_session_rewind(session: *mut kiln_session, n_tokens: usize) -> kiln_status;
    pub fn kiln_session_n_tokens(session: *const kiln_session) -> usize;
    pub fn kiln_session_get_tokens(
        session: *const kiln_session,
        tokens: *mut i32,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> kiln_status;
    pub fn kiln_session_get_logits(
        session: *const kiln_session,
        logits: *mut *const c_float,
        n_vocab: *mut i32,
    ) -> kiln_status;
    pub fn kiln_session_get_logprobs(
        session: *const kiln_session,
        out: *mut kiln_token_logprob,
        capacity: usize,
        n: *mut usize,
    ) -> kiln_status;

    pub fn kiln_request_params_init(params: *mut kiln_request_params, struct_size: usize) -> kiln_status;
    pub fn kiln_session_submit(session: *mut kiln_session, params: *const kiln_request_params)
        -> kiln_status;
    pub fn kiln_session_poll(
        session: *mut kiln_session,
        text: *mut c_char,
        text_capacity: usize,
        tokens: *mut i32,
        token_capacity: usize,
        result: *mut kiln_poll_result,
    ) -> kiln_status;
    pub fn kiln_step_params_init(params: *mut kiln_step_params, struct_size: usize) -> kiln_status;
    pub fn kiln_cache_step(
        cache: *mut kiln_cache,
        params: *const kiln_step_params,
        result: *mut kiln_step_result,
    ) -> kiln_status;
    pub fn kiln_cache_start_worker(cache: *mut kiln_cache) -> kiln_status;
    pub fn kiln_cache_stop_worker(cache: *mut kiln_cache) -> kiln_status;

    pub fn kiln_state_params_init(params: *mut kiln_state_params, struct_size: usize) -> kiln_status;
    pub fn kiln_session_save_state(
        session: *mut kiln_session,
        params: *const kiln_state_params,
        buffer: *mut c_void,
        capacity: usize,
        size: *mut usize,
    ) -> kiln_status;
    pub fn kiln_session_load_state(
        session: *mut kiln_session,
        state: *const c_void,
        size: usize,
    ) -> kiln_status;
    pub fn kiln_session_save_state_file(
        session: *mut kiln_session,
        params: *const kiln_state_params,
        path: *const c_char,
    ) -> kiln_status;
    pub fn kiln_session_load_state_file(session: *mut kiln_session, path: *const c_char) -> kiln_status;

    pub fn kiln_ngram_params_init(params: *mut kiln_ngram_params, struct_size: usize) -> kiln_status;
    pub fn kiln_strategy_create_ngram(
        params: *const kiln_ngram_params,
        out_strategy: *mut *mut kiln_strategy,
    ) -> kiln_status;
    pub fn kiln_draft_params_init(params: *mut kiln_draft_params, struct_size: usize) -> kiln_status;
    pub fn kiln_strategy_create_draft(
        target: *const kiln_model,
        draft_path: *const c_char,
        params: *const kiln_draft_params,
        out_strategy: *mut *mut kiln_strategy,
    ) -> kiln_status;
    pub fn kiln_medusa_params_init(params: *mut kiln_medusa_params, struct_size: usize) -> kiln_status;
    pub fn kiln_strategy_create_medusa(
        target: *const kiln_model,
        head_path: *const c_char,
        params: *const kiln_medusa_params,
        out_strategy: *mut *mut kiln_strategy,
    ) -> kiln_status;
    pub fn kiln_eagle_params_init(params: *mut kiln_eagle_params, struct_size: usize) -> kiln_status;
    pub fn kiln_strategy_create_eagle(
        target: *const kiln_model,
        head_path: *const c_char,
        params: *const kiln_eagle_params,
        out_strategy: *mut *mut kiln_strategy,
    ) -> kiln_status;
    pub fn kiln_strategy_destroy(strategy: *mut kiln_strategy);
    pub fn kiln_session_set_strategy(session: *mut kiln_session, strategy: *mut kiln_strategy)
        -> kiln_status;
    pub fn kiln_session_get_spec_metrics(
        session: *const kiln_session,
        out: *mut kiln_spec_metrics,
    ) -> kiln_status;
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn links_and_reports_abi() {
        // SAFETY: no arguments; static strings.
        unsafe {
            assert_eq!(kiln_abi_version(), KILN_ABI_VERSION);
            let v = std::ffi::CStr::from_ptr(kiln_version()).to_str().unwrap();
            assert_eq!(v.split('.').count(), 3);
        }
    }

    #[test]
    fn struct_sizes_match_the_header() {
        // sizeof of each struct in C (gcc, LP64: x86-64 and aarch64 Linux).
        assert_eq!(core::mem::size_of::<kiln_model_params>(), 56);
        assert_eq!(core::mem::size_of::<kiln_model_info>(), 88);
        assert_eq!(core::mem::size_of::<kiln_cache_params>(), 72);
        assert_eq!(core::mem::size_of::<kiln_cache_stats>(), 112);
        assert_eq!(core::mem::size_of::<kiln_sampler_params>(), 72);
        assert_eq!(core::mem::size_of::<kiln_generate_params>(), 40);
        assert_eq!(core::mem::size_of::<kiln_generate_result>(), 12);
        assert_eq!(core::mem::size_of::<kiln_request_params>(), 96);
        assert_eq!(core::mem::size_of::<kiln_poll_result>(), 56);
        assert_eq!(core::mem::size_of::<kiln_step_params>(), 24);
        assert_eq!(core::mem::size_of::<kiln_step_result>(), 32);
        assert_eq!(core::mem::size_of::<kiln_state_params>(), 12);
        assert_eq!(core::mem::size_of::<kiln_ngram_params>(), 40);
        assert_eq!(core::mem::size_of::<kiln_draft_params>(), 32);
        assert_eq!(core::mem::size_of::<kiln_medusa_params>(), 16);
        assert_eq!(core::mem::size_of::<kiln_eagle_params>(), 24);
        assert_eq!(core::mem::size_of::<kiln_spec_metrics>(), 56);
    }

    #[test]
    fn cache_params_offsets_match_the_header() {
        // offsetof of the fields added after the ABI 1 baseline, in the header's order
        // (core::mem::offset_of! needs Rust 1.77; the crates support 1.63).
        let p = core::mem::MaybeUninit::<kiln_cache_params>::uninit();
        let base = p.as_ptr() as usize;
        macro_rules! offset {
            ($field:ident) => {
                // SAFETY: addr_of! forms the field's address without reading it.
                unsafe { core::ptr::addr_of!((*p.as_ptr()).$field) as usize - base }
            };
        }
        assert_eq!(offset!(llama_cpp_order), 36);
        assert_eq!(offset!(step_tokens), 40);
        assert_eq!(offset!(backend), 44);
        assert_eq!(offset!(cuda_device), 48);
        assert_eq!(offset!(mla_prefill), 52);
        assert_eq!(offset!(sliding_window_sessions), 56);
        assert_eq!(offset!(swa_full), 60);
        assert_eq!(offset!(pin_threads), 64);
    }

    #[test]
    fn cache_stats_offsets_match_the_header() {
        // offsetof of the fields added after the ABI 1 baseline, in the header's order.
        let s = core::mem::MaybeUninit::<kiln_cache_stats>::uninit();
        let base = s.as_ptr() as usize;
        macro_rules! offset {
            ($field:ident) => {
                // SAFETY: addr_of! forms the field's address without reading it.
                unsafe { core::ptr::addr_of!((*s.as_ptr()).$field) as usize - base }
            };
        }
        assert_eq!(offset!(kv_bytes_in_use), 80);
        assert_eq!(offset!(sliding_blocks_total), 88);
        assert_eq!(offset!(sliding_blocks_used), 92);
        assert_eq!(offset!(sliding_blocks_released), 96);
        assert_eq!(offset!(sliding_block_bytes), 104);
    }

    #[test]
    fn head_params_offsets_match_the_header() {
        // offsetof of merge_ngram, added after the structs' first form.
        macro_rules! offset {
            ($struct:ty, $field:ident) => {{
                let p = core::mem::MaybeUninit::<$struct>::uninit();
                // SAFETY: addr_of! forms the field's address without reading it.
                unsafe { core::ptr::addr_of!((*p.as_ptr()).$field) as usize - p.as_ptr() as usize }
            }};
        }
        assert_eq!(offset!(kiln_eagle_params, merge_ngram), 20);
        assert_eq!(offset!(kiln_medusa_params, merge_ngram), 12);
    }
}
