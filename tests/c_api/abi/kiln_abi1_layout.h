/* The ABI 1 baseline (kiln_abi1.h) as lists, for the tests that hold the current header and
 * library to it: every struct, field, constant and function it declares. Frozen with
 * kiln_abi1.h: never edited (see README.md).
 *
 * KILN_ABI1_VERSIONED_STRUCTS(X): X(type) for each struct that starts with struct_size (it may
 *   grow at its end).
 * KILN_ABI1_FIXED_STRUCTS(X): X(type) for each element type of an array (it never changes).
 * KILN_ABI1_FIELDS(X): X(type, field) for each field of both, in declaration order.
 * KILN_ABI1_CONSTANTS(X): X(name) for each enumerator and numeric macro a caller compiles in.
 * KILN_ABI1_FUNCTIONS(X): X(name) for each exported function. */
#ifndef KILN_TESTS_C_API_ABI_KILN_ABI1_LAYOUT_H_
#define KILN_TESTS_C_API_ABI_KILN_ABI1_LAYOUT_H_

#define KILN_ABI1_VERSIONED_STRUCTS(X) \
  X(kiln_model_params)                 \
  X(kiln_model_info)                   \
  X(kiln_cache_params)                 \
  X(kiln_cache_stats)                  \
  X(kiln_sampler_params)               \
  X(kiln_generate_params)              \
  X(kiln_generate_result)              \
  X(kiln_ngram_params)                 \
  X(kiln_draft_params)                 \
  X(kiln_spec_metrics)

#define KILN_ABI1_FIXED_STRUCTS(X) \
  X(kiln_chat_message)             \
  X(kiln_logit_bias)               \
  X(kiln_token_logprob)

#define KILN_ABI1_FIELDS(X)                    \
  X(kiln_model_params, struct_size)            \
  X(kiln_model_params, path)                   \
  X(kiln_model_params, use_mmap)               \
  X(kiln_model_params, progress)               \
  X(kiln_model_params, progress_user_data)     \
  X(kiln_model_params, log)                    \
  X(kiln_model_params, log_user_data)          \
  X(kiln_model_info, struct_size)              \
  X(kiln_model_info, architecture)             \
  X(kiln_model_info, name)                     \
  X(kiln_model_info, n_params)                 \
  X(kiln_model_info, size_bytes)               \
  X(kiln_model_info, n_vocab)                  \
  X(kiln_model_info, n_ctx_train)              \
  X(kiln_model_info, n_embd)                   \
  X(kiln_model_info, n_layer)                  \
  X(kiln_model_info, n_head)                   \
  X(kiln_model_info, n_head_kv)                \
  X(kiln_model_info, head_dim)                 \
  X(kiln_model_info, n_ff)                     \
  X(kiln_model_info, token_bos)                \
  X(kiln_model_info, token_eos)                \
  X(kiln_model_info, token_eot)                \
  X(kiln_chat_message, role)                   \
  X(kiln_chat_message, content)                \
  X(kiln_cache_params, struct_size)            \
  X(kiln_cache_params, pool_bytes)             \
  X(kiln_cache_params, block_size)             \
  X(kiln_cache_params, kv_type)                \
  X(kiln_cache_params, prefix_caching)         \
  X(kiln_cache_params, n_ctx)                  \
  X(kiln_cache_params, n_threads)              \
  X(kiln_cache_params, llama_cpp_order)        \
  X(kiln_cache_stats, struct_size)             \
  X(kiln_cache_stats, n_ctx)                   \
  X(kiln_cache_stats, block_size)              \
  X(kiln_cache_stats, blocks_total)            \
  X(kiln_cache_stats, blocks_free)             \
  X(kiln_cache_stats, blocks_used)             \
  X(kiln_cache_stats, blocks_cached)           \
  X(kiln_cache_stats, n_sequences)             \
  X(kiln_cache_stats, prefix_lookups)          \
  X(kiln_cache_stats, prefix_query_tokens)     \
  X(kiln_cache_stats, prefix_hit_tokens)       \
  X(kiln_cache_stats, evictions)               \
  X(kiln_cache_stats, bytes_per_token)         \
  X(kiln_cache_stats, block_bytes)             \
  X(kiln_logit_bias, token)                    \
  X(kiln_logit_bias, bias)                     \
  X(kiln_sampler_params, struct_size)          \
  X(kiln_sampler_params, temperature)          \
  X(kiln_sampler_params, top_k)                \
  X(kiln_sampler_params, top_p)                \
  X(kiln_sampler_params, min_p)                \
  X(kiln_sampler_params, typical_p)            \
  X(kiln_sampler_params, repeat_penalty)       \
  X(kiln_sampler_params, frequency_penalty)    \
  X(kiln_sampler_params, presence_penalty)     \
  X(kiln_sampler_params, penalty_last_n)       \
  X(kiln_sampler_params, seed)                 \
  X(kiln_sampler_params, n_logprobs)           \
  X(kiln_sampler_params, logit_bias)           \
  X(kiln_sampler_params, n_logit_bias)         \
  X(kiln_generate_params, struct_size)         \
  X(kiln_generate_params, max_tokens)          \
  X(kiln_generate_params, stop_strings)        \
  X(kiln_generate_params, n_stop_strings)      \
  X(kiln_generate_params, callback)            \
  X(kiln_generate_params, user_data)           \
  X(kiln_generate_result, struct_size)         \
  X(kiln_generate_result, n_tokens)            \
  X(kiln_generate_result, stop_reason)         \
  X(kiln_token_logprob, token)                 \
  X(kiln_token_logprob, logprob)               \
  X(kiln_ngram_params, struct_size)            \
  X(kiln_ngram_params, max_ngram)              \
  X(kiln_ngram_params, min_ngram)              \
  X(kiln_ngram_params, max_draft)              \
  X(kiln_ngram_params, start_draft)            \
  X(kiln_ngram_params, max_skip)               \
  X(kiln_ngram_params, adaptive)               \
  X(kiln_ngram_params, fixed_pass_cost_beta)   \
  X(kiln_draft_params, struct_size)            \
  X(kiln_draft_params, max_draft)              \
  X(kiln_draft_params, adaptive)               \
  X(kiln_draft_params, n_threads)              \
  X(kiln_draft_params, n_ctx)                  \
  X(kiln_draft_params, fixed_pass_cost_beta)   \
  X(kiln_spec_metrics, struct_size)            \
  X(kiln_spec_metrics, steps)                  \
  X(kiln_spec_metrics, drafted)                \
  X(kiln_spec_metrics, accepted)               \
  X(kiln_spec_metrics, generated)              \
  X(kiln_spec_metrics, mean_accepted_per_step) \
  X(kiln_spec_metrics, target_passes_per_token)

#define KILN_ABI1_CONSTANTS(X)   \
  X(KILN_OK)                     \
  X(KILN_ERR_INVALID_ARGUMENT)   \
  X(KILN_ERR_IO)                 \
  X(KILN_ERR_FORMAT)             \
  X(KILN_ERR_UNSUPPORTED)        \
  X(KILN_ERR_OUT_OF_MEMORY)      \
  X(KILN_ERR_CACHE_FULL)         \
  X(KILN_ERR_CANCELLED)          \
  X(KILN_ERR_OUT_OF_RANGE)       \
  X(KILN_ERR_BUFFER_TOO_SMALL)   \
  X(KILN_ERR_BUSY)               \
  X(KILN_ERR_INTERNAL)           \
  X(KILN_LOG_DEBUG)              \
  X(KILN_LOG_INFO)               \
  X(KILN_LOG_WARN)               \
  X(KILN_LOG_ERROR)              \
  X(KILN_KV_F16)                 \
  X(KILN_KV_F32)                 \
  X(KILN_KV_BF16)                \
  X(KILN_STOP_EOG)               \
  X(KILN_STOP_MAX_TOKENS)        \
  X(KILN_STOP_STRING)            \
  X(KILN_STOP_CALLBACK)          \
  X(KILN_STOP_CANCELLED)         \
  X(KILN_STOP_CONTEXT_FULL)      \
  X(KILN_ABI_VERSION)            \
  X(KILN_TOKENIZE_ADD_SPECIAL)   \
  X(KILN_TOKENIZE_PARSE_SPECIAL) \
  X(KILN_DETOKENIZE_RENDER_SPECIAL)

#define KILN_ABI1_FUNCTIONS(X)         \
  X(kiln_version)                      \
  X(kiln_abi_version)                  \
  X(kiln_status_name)                  \
  X(kiln_last_error_message)           \
  X(kiln_model_params_init)            \
  X(kiln_model_load)                   \
  X(kiln_model_destroy)                \
  X(kiln_model_get_info)               \
  X(kiln_model_meta_count)             \
  X(kiln_model_meta_at)                \
  X(kiln_model_meta_get)               \
  X(kiln_model_token_is_eog)           \
  X(kiln_tokenize)                     \
  X(kiln_detokenize)                   \
  X(kiln_chat_apply_template)          \
  X(kiln_cache_params_init)            \
  X(kiln_cache_create)                 \
  X(kiln_cache_destroy)                \
  X(kiln_cache_get_stats)              \
  X(kiln_sampler_params_init)          \
  X(kiln_sampler_create)               \
  X(kiln_sampler_destroy)              \
  X(kiln_session_create)               \
  X(kiln_session_destroy)              \
  X(kiln_session_append_text)          \
  X(kiln_session_append_tokens)        \
  X(kiln_session_append_tokens_scored) \
  X(kiln_generate_params_init)         \
  X(kiln_session_generate)             \
  X(kiln_session_cancel)               \
  X(kiln_session_fork)                 \
  X(kiln_session_rewind)               \
  X(kiln_session_n_tokens)             \
  X(kiln_session_get_tokens)           \
  X(kiln_session_get_logits)           \
  X(kiln_session_get_logprobs)         \
  X(kiln_ngram_params_init)            \
  X(kiln_strategy_create_ngram)        \
  X(kiln_draft_params_init)            \
  X(kiln_strategy_create_draft)        \
  X(kiln_strategy_destroy)             \
  X(kiln_session_set_strategy)         \
  X(kiln_session_get_spec_metrics)

#endif /* KILN_TESTS_C_API_ABI_KILN_ABI1_LAYOUT_H_ */
