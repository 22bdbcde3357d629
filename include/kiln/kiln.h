/*
 * kiln — embeddable LLM inference. This header is the whole public API and its specification.
 *
 * Conventions
 * - Opaque handles only (kiln_model, ...). Functions are named kiln_<noun>_<verb>.
 * - Every _create/_load has a _destroy; _destroy(NULL) is a no-op.
 * - Every fallible function returns a kiln_status. KILN_OK is 0; errors are positive and stable.
 *   After a failure, kiln_last_error_message() on the same thread describes it (what was wrong,
 *   e.g. the field and byte offset of a malformed file). No C++ exception ever crosses this
 *   boundary and the library never aborts the host process.
 * - Output parameters are written only on KILN_OK unless documented otherwise.
 * - Variable-length outputs use caller buffers (pointer, capacity): when the buffer is too small
 *   the call returns KILN_ERR_BUFFER_TOO_SMALL and stores the required length in the size output,
 *   so a caller can size and retry. Text is UTF-8 as (pointer, length); returned strings owned by
 *   a handle stay valid until that handle is destroyed.
 * - Thread-safety: a kiln_model is immutable after load and may be used from any number of
 *   threads at once. Each function says otherwise where it differs.
 * - A signature never changes once released; replacements get a _v2 suffix.
 * - This header is ABI 1, first released in 0.2.0. Everything in it is part of that release
 *   unless marked "Added in X.Y"; within one ABI version, later releases only add.
 *
 * Versioned structs (one rule for every struct a call reads or fills, except the element types
 * of arrays — kiln_logit_bias, kiln_chat_message, kiln_token_logprob — which never change):
 * - The struct starts with `uint32_t struct_size` and only ever grows at its end.
 * - The caller sets struct_size to the struct's size as its own header declares it: parameter
 *   structs through their init function, which also writes the defaults
 *   (kiln_model_params p; kiln_model_params_init(&p, sizeof p);), output structs by hand before
 *   the call (kiln_model_info info; info.struct_size = sizeof info;).
 * - The library reads and writes only the first struct_size bytes. A field takes part when
 *   struct_size covers all of its bytes: an input field outside them keeps its default, an
 *   output field outside them is not written.
 * - Any struct_size from the struct's first release up is accepted. The smallest is where the
 *   last field of the first release ends (sizeof of that struct, or less by its trailing
 *   padding). A struct_size larger than the loaded library knows (a caller built against a newer
 *   header) is accepted too: the fields it does not know are ignored on input and set to zero by
 *   init functions and output calls.
 * - A smaller struct_size, 0 included, fails with KILN_ERR_INVALID_ARGUMENT and a message naming
 *   the struct, the size given and the smallest accepted.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stddef.h>
#include <stdint.h>

/* KILN_API marks the exported functions. On Windows the library is a DLL: it is built with
 * KILN_BUILD defined (exporting), and callers import. Elsewhere only these symbols are visible. */
#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(KILN_BUILD)
#define KILN_API __declspec(dllexport)
#else
#define KILN_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 2
#define KILN_VERSION_PATCH 0
/* Bumped only when the binary interface breaks; it is the shared library's SONAME suffix. */
#define KILN_ABI_VERSION 1

#define KILN_STRINGIFY_INNER(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER(x)

/* "MAJOR.MINOR.PATCH" of the library actually loaded (may differ from the header's). */
KILN_API const char* kiln_version(void);
/* KILN_ABI_VERSION of the library actually loaded. */
KILN_API int kiln_abi_version(void);
/* The CPU kernels this process runs, then the CPU features they may use, e.g.
 * "avx2 (avx2 fma f16c)" or "scalar (none)": the level is "avx512", "avx2" or "scalar", the best
 * this CPU supports unless the environment variable KILN_CPU_LEVEL=scalar or =avx2 asks for a
 * lower one. Every level computes the same results (only the speed differs). Static storage;
 * thread-safe. */
KILN_API const char* kiln_cpu_info(void);

/* ---------------------------------------------------------------- status */

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERR_INVALID_ARGUMENT = 1, /* NULL handle/pointer, bad value, token id out of range,
                                  * struct_size below the smallest accepted */
  KILN_ERR_IO = 2,               /* file missing or unreadable */
  KILN_ERR_FORMAT = 3,           /* malformed or hostile model file */
  KILN_ERR_UNSUPPORTED = 4,      /* valid input that kiln cannot handle (type, architecture) */
  KILN_ERR_OUT_OF_MEMORY = 5,
  KILN_ERR_CACHE_FULL = 6,       /* KV cache exhausted; free or preempt and retry */
  KILN_ERR_CANCELLED = 7,        /* a callback or kiln_*_cancel stopped the call */
  KILN_ERR_OUT_OF_RANGE = 8,     /* position past the context, index past the end */
  KILN_ERR_BUFFER_TOO_SMALL = 9, /* the size output holds the required length */
  KILN_ERR_BUSY = 10,            /* a handle was used from two threads at once */
  KILN_ERR_INTERNAL = 11         /* a bug in kiln; the message says where */
} kiln_status;

/* Static name of a status ("KILN_ERR_FORMAT"); never NULL. Thread-safe. */
KILN_API const char* kiln_status_name(kiln_status status);

/* Message of the last failed call on this thread ("" if none). Valid until the next kiln call on
 * this thread. Thread-safe (the message is per thread). */
KILN_API const char* kiln_last_error_message(void);

/* ---------------------------------------------------------------- logging */

typedef enum kiln_log_level {
  KILN_LOG_DEBUG = 0,
  KILN_LOG_INFO = 1,
  KILN_LOG_WARN = 2,
  KILN_LOG_ERROR = 3
} kiln_log_level;

/* Receives log lines (no trailing newline). Errors are never reported only through the log:
 * the failing call's status and kiln_last_error_message() carry them. */
typedef void (*kiln_log_fn)(kiln_log_level level, const char* message, void* user_data);

/* ---------------------------------------------------------------- model */

typedef struct kiln_model kiln_model;

/* Called during loading with progress in [0, 1]. Return non-zero to cancel the load, which
 * then fails with KILN_ERR_CANCELLED. */
typedef int (*kiln_progress_fn)(float progress, void* user_data);

typedef struct kiln_model_params {
  uint32_t struct_size;      /* set by kiln_model_params_init */
  const char* path;          /* GGUF file (UTF-8 path); required */
  int use_mmap;              /* non-zero (default): map the file; 0: read it into memory */
  kiln_progress_fn progress; /* optional */
  void* progress_user_data;
  kiln_log_fn log; /* optional; lines from this load */
  void* log_user_data;
} kiln_model_params;

/* Writes the defaults into the first struct_size bytes of *params and sets params->struct_size
 * (pass sizeof *params; see "Versioned structs"). Defaults: path NULL, use_mmap 1, no callbacks.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL params, struct_size below the smallest accepted or
 * above UINT32_MAX). */
KILN_API kiln_status kiln_model_params_init(kiln_model_params* params, size_t struct_size);

/* Loads a model. On KILN_OK *out_model owns the model; free it with kiln_model_destroy.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL params/path/out_model, struct_size too small),
 * KILN_ERR_IO (missing or unreadable file), KILN_ERR_FORMAT (malformed file: the message names
 * the field and byte offset), KILN_ERR_UNSUPPORTED (architecture or tensor type kiln cannot run),
 * KILN_ERR_CANCELLED (the progress callback asked to stop), KILN_ERR_OUT_OF_MEMORY.
 * Thread-safe: any number of loads may run at once. */
KILN_API kiln_status kiln_model_load(const kiln_model_params* params, kiln_model** out_model);

/* Frees a model. NULL is a no-op. Every session using the model must be destroyed first. */
KILN_API void kiln_model_destroy(kiln_model* model);

/* Description of a loaded model. */
typedef struct kiln_model_info {
  uint32_t struct_size;     /* set by the caller: sizeof(kiln_model_info) */
  const char* architecture; /* "llama"; owned by the model */
  const char* name;         /* general.name or ""; owned by the model */
  int64_t n_params;
  int64_t size_bytes; /* bytes of all weights in the file */
  int32_t n_vocab;
  int32_t n_ctx_train;
  int32_t n_embd;
  int32_t n_layer;
  int32_t n_head;
  int32_t n_head_kv;
  int32_t head_dim;
  int32_t n_ff;
  int32_t token_bos; /* -1 when the vocabulary has none */
  int32_t token_eos;
  int32_t token_eot;
} kiln_model_info;

/* Fills *info (info->struct_size set by the caller; see "Versioned structs").
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL model/info, struct_size too small). */
KILN_API kiln_status kiln_model_get_info(const kiln_model* model, kiln_model_info* info);

/* Number of GGUF metadata entries. 0 for NULL. */
KILN_API size_t kiln_model_meta_count(const kiln_model* model);

/* Key and value (rendered as text; arrays shortened) of entry `index`. Both strings are owned by
 * the model. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_OUT_OF_RANGE (index). */
KILN_API kiln_status kiln_model_meta_at(const kiln_model* model, size_t index, const char** key,
                                        const char** value);

/* Value of metadata `key` rendered as text (owned by the model).
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_OUT_OF_RANGE (no such key). */
KILN_API kiln_status kiln_model_meta_get(const kiln_model* model, const char* key,
                                         const char** value);

/* Non-zero when `token` ends generation (eos, eot and similar control tokens). */
KILN_API int kiln_model_token_is_eog(const kiln_model* model, int32_t token);

/* ---------------------------------------------------------------- inspecting a file */

/* A GGUF file opened for inspection only: its metadata, and what kiln lacks to run it. Works for
 * any valid GGUF, also one of an architecture kiln cannot run (kiln_model_load refuses those).
 * Added in 0.2.0 after the ABI 1 baseline (new functions only). */
typedef struct kiln_gguf kiln_gguf;

/* Opens and validates `path`. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_IO (cannot
 * open or map), KILN_ERR_FORMAT (not a valid GGUF, with the field and byte offset). */
KILN_API kiln_status kiln_gguf_open(const char* path, kiln_gguf** out);
/* Frees the handle; NULL is a no-op. */
KILN_API void kiln_gguf_destroy(kiln_gguf* gguf);
/* Number of metadata entries; 0 for NULL. */
KILN_API size_t kiln_gguf_meta_count(const kiln_gguf* gguf);
/* Key and value (as text; arrays shortened) of entry `index`, owned by the handle.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_OUT_OF_RANGE (index). */
KILN_API kiln_status kiln_gguf_meta_at(const kiln_gguf* gguf, size_t index, const char** key,
                                       const char** value);
/* What kiln lacks to run the file (an architecture it does not know, a missing tensor, a tensor
 * type without kernels, a bad hyper-parameter), one problem per line; "" when kiln can run it.
 * Owned by the handle; "" for NULL. */
KILN_API const char* kiln_gguf_unsupported(const kiln_gguf* gguf);

/* The compute backends this process can use, one per line: the CPU's kernel level and features,
 * then the CUDA device(s) or why there is none. Static storage; thread-safe. Added in 0.2.0 after
 * the ABI 1 baseline. */
KILN_API const char* kiln_backends(void);

/* ---------------------------------------------------------------- text */

/* Flags of kiln_tokenize. */
#define KILN_TOKENIZE_ADD_SPECIAL 1u   /* add BOS/EOS as the model's vocabulary asks */
#define KILN_TOKENIZE_PARSE_SPECIAL 2u /* "<|im_start|>" in the text becomes the control token */

/* Tokenizes text[0, text_len) (UTF-8; each byte that is not valid UTF-8 becomes U+FFFD as in
 * llama.cpp, or stays a byte token with a SentencePiece vocabulary that has them; never dropped,
 * never rejected) into tokens[0, capacity). *n_tokens receives the count, also on
 * KILN_ERR_BUFFER_TOO_SMALL (then it is the required capacity and tokens is untouched). text may be
 * NULL when text_len is 0. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL model/n_tokens, NULL text with
 * text_len > 0, NULL tokens with capacity > 0), KILN_ERR_BUFFER_TOO_SMALL. */
KILN_API kiln_status kiln_tokenize(const kiln_model* model, const char* text, size_t text_len,
                                   uint32_t flags, int32_t* tokens, size_t capacity,
                                   size_t* n_tokens);

/* Flags of kiln_detokenize / kiln_token_to_piece. */
#define KILN_DETOKENIZE_RENDER_SPECIAL 1u /* control tokens are rendered as their text */

/* Concatenates the bytes of tokens[0, n_tokens) into text[0, capacity) (not NUL-terminated;
 * the bytes may be invalid UTF-8 when the tokens split a character). *text_len receives the
 * length, also on KILN_ERR_BUFFER_TOO_SMALL. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointers,
 * a token id outside [0, n_vocab): the message names its index), KILN_ERR_BUFFER_TOO_SMALL. */
KILN_API kiln_status kiln_detokenize(const kiln_model* model, const int32_t* tokens,
                                     size_t n_tokens, uint32_t flags, char* text, size_t capacity,
                                     size_t* text_len);

/* One chat message; both strings are NUL-terminated UTF-8. Roles: "system", "user", "assistant". */
typedef struct kiln_chat_message {
  const char* role;
  const char* content;
} kiln_chat_message;

/* Renders a conversation with a chat template into text[0, capacity) (not NUL-terminated).
 * tmpl NULL: the model's own tokenizer.chat_template. Otherwise tmpl is either a Jinja template
 * source of a recognised family or a family name: "chatml", "llama3", "llama2", "mistral",
 * "gemma", "deepseek", "phi3". add_generation_prompt non-zero appends the assistant header.
 * *text_len receives the length, also on KILN_ERR_BUFFER_TOO_SMALL.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointers, no messages, unknown role),
 * KILN_ERR_UNSUPPORTED (a template kiln does not recognise, or the model has none),
 * KILN_ERR_BUFFER_TOO_SMALL. */
KILN_API kiln_status kiln_chat_apply_template(const kiln_model* model, const char* tmpl,
                                              const kiln_chat_message* messages, size_t n_messages,
                                              int add_generation_prompt, char* text,
                                              size_t capacity, size_t* text_len);

/* ---------------------------------------------------------------- cache
 *
 * A kiln_cache is one paged KV cache for one model together with the engine that computes into
 * it (its thread pool and scratch memory). Any number of sessions share it. The engine batches
 * them (continuous batching): each step of the cache runs one forward pass over the next token of
 * every session that is generating (with its speculative draft, if any) plus chunks of the
 * prompts of sessions that are prefilling, so concurrent sessions share passes instead of taking
 * turns. A session's tokens do not depend on what else runs (the default numeric order is batch
 * invariant; with llama_cpp_order each pass holds one session's work). When the KV pool is full,
 * the youngest request in flight is preempted (its K/V freed and recomputed later, same bits)
 * before a request fails with KILN_ERR_CACHE_FULL. A cache is thread-safe: any thread may create
 * sessions on it or read its stats at any time. See "Non-blocking requests" for who steps it.
 */

typedef struct kiln_cache kiln_cache;

typedef enum kiln_kv_type {
  KILN_KV_F16 = 0, /* default */
  KILN_KV_F32 = 1,
  KILN_KV_BF16 = 2,
  /* ggml's q8_0 blocks (32 int8 and an f16 scale per 32 values): 34/64 of f16's bytes per token;
   * the model's head size must be a multiple of 32 (kiln_cache_create fails otherwise). Rows are
   * rounded as llama.cpp rounds its q8_0 cache; attention reads them back exactly. */
  KILN_KV_Q8_0 = 3
} kiln_kv_type;

/* The compute backends a cache can run on (kiln_cache_params.backend). Added in 0.2.0 after the
 * ABI 1 baseline. */
typedef enum kiln_backend_kind {
  KILN_BACKEND_CPU = 0, /* default */
  KILN_BACKEND_CUDA = 1,
  KILN_BACKEND_AUTO = 2 /* CUDA when it can run the model, else the CPU */
} kiln_backend_kind;

/* How MLA models (deepseek2) compute attention for prompt chunks; other models ignore it. */
typedef enum kiln_mla_prefill {
  /* Every token absorbed (keys and values never decompressed), as decode steps always are:
   * every bitwise guarantee holds, a token's logits never depend on how its prompt was chunked
   * or batched (default). */
  KILN_MLA_PREFILL_ABSORBED = 0,
  /* A prompt chunk of a sequence long enough that a measured cost rule says decompressing its
   * context's keys and values is faster runs decompressed (from about 128 tokens; a 512-token
   * prompt about 1.7x faster on CPU). Still batch and thread-count invariant (the choice depends
   * only on that sequence's own chunk and context sizes), but the two forms agree only to float
   * rounding, so a token's last logit bits can depend on how its prompt was chunked: a cold
   * prefill against a prefix-cache hit, another step_tokens, a chunk shortened by other
   * sessions' work or a preemption. Greedy tokens change only at near-ties. Decode steps, draft
   * trees and llama_cpp_order runs stay absorbed. */
  KILN_MLA_PREFILL_MEASURED = 1
} kiln_mla_prefill;

typedef struct kiln_cache_params {
  uint32_t struct_size; /* set by kiln_cache_params_init */
  size_t pool_bytes;    /* KV pool size (rounded down to whole blocks); 0: one full context */
  int32_t block_size;   /* tokens per block, in [1, 1024]; default 16 */
  kiln_kv_type kv_type; /* element type of the stored K/V; default KILN_KV_F16 */
  int prefix_caching;   /* non-zero (default): sessions starting with cached tokens reuse them */
  int32_t n_ctx;        /* most tokens one session may hold; 0 (default): training context */
  int32_t n_threads;    /* compute threads; 0 (default): physical cores */
  /* Non-zero: reproduce llama.cpp's CPU arithmetic exactly, so greedy output and logits equal
   * llama.cpp's bit for bit: batches of two or more tokens take llama.cpp's prompt-batch
   * reduction order and prompts are evaluated in batches of up to 512 tokens (llama.cpp's
   * default n_ubatch); it is slower (the matmuls and attention keep ggml's order).
   * 0 (default): kiln's order, the same for every token, so a token's results never depend on
   * what else is in its batch (what speculative decoding relies on), and faster (integer-order
   * matmuls on weights the model interleaves at load, docs/numerics.md); the two settings differ
   * in the last bits, which can change a sampled token. */
  int llama_cpp_order;
  /* Added in 0.2.0 after the ABI 1 baseline. Most tokens in one step's forward pass, >= 1
   * (decode tokens and speculative drafts of every generating session first, then prompt
   * chunks of at most 256 tokens per session; a step always takes at least one decode step per
   * generating session and a 32-token prompt chunk). Smaller: shorter steps while prompts are
   * computed (a game frame, a time to first token for the decoders), more steps per prompt.
   * Default 512. kiln_step_params.step_tokens overrides it for one kiln_cache_step call. */
  int32_t step_tokens;
  /* Added in 0.2.0 after the ABI 1 baseline. The compute backend of the cache's forward passes:
   * KILN_BACKEND_CPU (default), or KILN_BACKEND_CUDA / KILN_BACKEND_AUTO: the CUDA device
   * cuda_device when the CUDA module (libkiln_cuda.so), a driver and the device are present, the
   * device has room for the weights and the K/V pool, and the backend runs every op the model
   * needs; otherwise the CPU, and kiln_cache_backend says why (the cache is created either way).
   * Any other value fails with KILN_ERR_INVALID_ARGUMENT. */
  kiln_backend_kind backend;
  int32_t cuda_device; /* CUDA device index; default 0 */
  /* Added in 0.2.0 after the ABI 1 baseline. MLA prompt attention (kiln_mla_prefill above);
   * default KILN_MLA_PREFILL_ABSORBED. */
  kiln_mla_prefill mla_prefill;
  /* Added in 0.2.0 after the ABI 1 baseline; no longer read (the sliding-window layers' blocks
   * now share the pool, see swa_full), except that a negative value is still
   * KILN_ERR_INVALID_ARGUMENT. */
  int32_t sliding_window_sessions;
  /* Added in 0.2.0 after the ABI 1 baseline. Models with both sliding-window and global layers
   * (gemma3), CPU backend: 0 (default) keeps the sliding layers' K/V only while some window still
   * reads it and returns the blocks to the pool for any session (gemma3-270m at 4,096 tokens:
   * about a third of the K/V bytes). Outputs do not change. Then: rewinding a session past a
   * released window recomputes its K/V on the next generate (prefix-cached blocks are reused);
   * speculative steps draft at most 64 tokens; a session state's K/V hold the sliding layers'
   * rows inside the window only (a cache that keeps more recomputes them on restore).
   * Non-zero keeps every layer's K/V for the whole context (llama.cpp's --swa-full). Other models
   * and the CUDA backend keep every layer's K/V either way. */
  int swa_full;
  /* Added in 0.2.0 after the ABI 1 baseline. CPU backend: non-zero binds each of the cache's
   * worker threads to a core of its own (worker i to the i-th physical core the process may run
   * on, leaving the first to the threads that call into kiln, which are never pinned), so the OS
   * cannot move a worker onto the core of the thread it works for. Helps a host that steps the
   * cache in short bursts with sleeps between (a game loop: on a 2-core machine about 1.35x the
   * tokens in the same 2 ms a frame); leave it 0 (default) when other pinned threads or other
   * caches share the cores. Linux and Windows; elsewhere it has no effect. Outputs do not
   * change. */
  int pin_threads;
} kiln_cache_params;

/* Writes the defaults (pool_bytes 0, block_size 16, KILN_KV_F16, prefix_caching 1, n_ctx 0,
 * n_threads 0, llama_cpp_order 0, step_tokens 512, KILN_MLA_PREFILL_ABSORBED) as
 * kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_cache_params_init(kiln_cache_params* params, size_t struct_size);

/* Creates a cache (and its engine) for `model`; the model must outlive it.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointer, struct_size too small, bad block_size,
 * kv_type, n_ctx < 0, n_threads < 0, step_tokens < 1, mla_prefill not a kiln_mla_prefill, or
 * pool_bytes non-zero but smaller than two blocks: the message names the field),
 * KILN_ERR_OUT_OF_MEMORY. Thread-safe. */
KILN_API kiln_status kiln_cache_create(const kiln_model* model, const kiln_cache_params* params,
                                       kiln_cache** out_cache);

/* Frees a cache. NULL is a no-op. Every session on it must be destroyed first. */
KILN_API void kiln_cache_destroy(kiln_cache* cache);

/* The backend the cache runs on ("cpu (avx2, 4 threads)"), followed by "; cuda requested, running
 * on the CPU: <reason>" when a CUDA request fell back. Owned by the cache; "" for NULL.
 * Thread-safe. Added in 0.2.0 after the ABI 1 baseline. */
KILN_API const char* kiln_cache_backend(const kiln_cache* cache);

typedef struct kiln_cache_stats {
  uint32_t struct_size; /* set by the caller: sizeof(kiln_cache_stats) */
  int32_t n_ctx;        /* the effective per-session context */
  int32_t block_size;
  int32_t blocks_total;  /* usable blocks */
  int32_t blocks_free;   /* unused and not cached */
  int32_t blocks_used;   /* held by at least one session */
  int32_t blocks_cached; /* unused but kept for prefix reuse (evicted when space is needed) */
  int32_t n_sequences;   /* live sessions (and forks) */
  int64_t prefix_lookups;
  int64_t prefix_query_tokens;
  int64_t prefix_hit_tokens; /* prompt tokens taken from the cache instead of computed */
  int64_t evictions;
  size_t bytes_per_token;
  size_t block_bytes;
  /* Added in 0.2.0 after the ABI 1 baseline. K/V bytes held by sessions now (blocks_used *
   * block_bytes), and the sliding-window layers' blocks (kiln_cache_params.swa_full 0; zero
   * otherwise): sliding_blocks_used of blocks_used hold them, sliding_blocks_released were
   * returned to the pool so far because every window had left them. sliding_blocks_total is 0
   * and sliding_block_bytes block_bytes: they share the pool's blocks. */
  size_t kv_bytes_in_use;
  int32_t sliding_blocks_total;
  int32_t sliding_blocks_used;
  int64_t sliding_blocks_released;
  size_t sliding_block_bytes;
} kiln_cache_stats;

/* Fills *stats (stats->struct_size set by the caller). Statuses: KILN_ERR_INVALID_ARGUMENT
 * (NULL, struct_size too small). Thread-safe. */
KILN_API kiln_status kiln_cache_get_stats(const kiln_cache* cache, kiln_cache_stats* stats);

/* ---------------------------------------------------------------- sampler
 *
 * A kiln_sampler is an immutable set of sampling parameters. A session copies them when it is
 * created, so one sampler may serve many sessions and may be destroyed right after. Stage order
 * (llama.cpp's default chain): logit bias, penalties, top-k, typical, top-p, min-p, temperature.
 */

typedef struct kiln_sampler kiln_sampler;

typedef struct kiln_logit_bias {
  int32_t token;
  float bias; /* added to the logit; -INFINITY bans the token */
} kiln_logit_bias;

typedef struct kiln_sampler_params {
  uint32_t struct_size;    /* set by kiln_sampler_params_init */
  float temperature;       /* <= 0: greedy (argmax, no randomness); default 0.8 */
  int32_t top_k;           /* <= 0: off; default 40 */
  float top_p;             /* >= 1: off; default 0.95 */
  float min_p;             /* <= 0: off; default 0.05 */
  float typical_p;         /* >= 1: off (default) */
  float repeat_penalty;    /* > 0; 1: off (default) */
  float frequency_penalty; /* 0: off (default) */
  float presence_penalty;  /* 0: off (default) */
  int32_t penalty_last_n;  /* window of the penalties; 0: off, -1: whole history; default 64 */
  uint64_t seed;           /* seeds each session's random generator; default 0 */
  int32_t n_logprobs;      /* top log-probabilities kept per sampled token; default 0 */
  const kiln_logit_bias* logit_bias; /* optional array, copied by kiln_sampler_create */
  size_t n_logit_bias;
} kiln_sampler_params;

/* Writes the defaults as kiln_model_params_init does: those of llama.cpp (temperature 0.8, top_k
 * 40, top_p 0.95, min_p 0.05, penalty window 64, penalties off, typical off), seed 0, no
 * logprobs, no bias. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_sampler_params_init(kiln_sampler_params* params, size_t struct_size);

/* Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointer, struct_size too small, NaN anywhere,
 * repeat_penalty <= 0, n_logprobs < 0, penalty_last_n < -1, a bias token < 0 or a non-finite
 * bias other than -inf: the message names the field or index), KILN_ERR_OUT_OF_MEMORY. */
KILN_API kiln_status kiln_sampler_create(const kiln_sampler_params* params,
                                         kiln_sampler** out_sampler);

/* NULL is a no-op. Sessions created from it keep their own copy. */
KILN_API void kiln_sampler_destroy(kiln_sampler* sampler);

/* ---------------------------------------------------------------- session
 *
 * A kiln_session is one conversation: a token sequence in a cache, a copy of the sampling
 * parameters and a random generator seeded from them (same seed and calls, same tokens).
 *
 * Thread rules: a kiln_model and a kiln_cache may be shared by any number of threads. A session
 * must be used by one thread at a time: a call made while another thread is inside a call on the
 * same session fails with KILN_ERR_BUSY and changes nothing (detected, never undefined
 * behaviour); so does a mutating call made from inside the session's own generate callback
 * (getters are allowed there). kiln_session_cancel and kiln_session_n_tokens are the exceptions:
 * any thread, any time.
 * A destroyed handle must never be used again (that cannot be detected); destroy sessions before
 * their cache, and caches before their model.
 */

typedef struct kiln_session kiln_session;

/* Creates an empty session on `cache` (which must belong to `model`). sampler NULL: greedy.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL model/cache/out_session, cache of another model, a
 * logit-bias token >= n_vocab), KILN_ERR_OUT_OF_MEMORY. Thread-safe (per the thread rules). */
KILN_API kiln_status kiln_session_create(const kiln_model* model, kiln_cache* cache,
                                         const kiln_sampler* sampler, kiln_session** out_session);

/* Frees a session; its full computed blocks stay in the prefix cache. NULL is a no-op. */
KILN_API void kiln_session_destroy(kiln_session* session);

/* Tokenizes text[0, len) with flags KILN_TOKENIZE_* (see kiln_tokenize) and appends the tokens,
 * computing them (prefill in chunks) so that the next-token logits are available. On an empty
 * session with prefix caching, the longest cached prefix is reused instead of recomputed.
 * All or nothing: on any error the session is exactly as before.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL session, NULL text with len > 0, unknown flags),
 * KILN_ERR_OUT_OF_RANGE (the session would pass n_ctx), KILN_ERR_CACHE_FULL (free or destroy
 * another session and retry), KILN_ERR_CANCELLED (kiln_session_cancel during the call),
 * KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_append_text(kiln_session* session, const char* text, size_t len,
                                              uint32_t flags);

/* Appends token ids, like kiln_session_append_text. Statuses: as kiln_session_append_text, plus
 * KILN_ERR_INVALID_ARGUMENT for a token id outside [0, n_vocab) (the message names its index). */
KILN_API kiln_status kiln_session_append_tokens(kiln_session* session, const int32_t* tokens,
                                                size_t n_tokens);

/* Appends tokens[0, n_tokens) (n_tokens >= 2) and writes, for i in [0, n_tokens - 1), the natural
 * log-probability of tokens[i + 1] given the session and tokens[0, i] into logprobs[i]
 * (perplexity scoring). Statuses: as kiln_session_append_tokens. */
KILN_API kiln_status kiln_session_append_tokens_scored(kiln_session* session, const int32_t* tokens,
                                                       size_t n_tokens, float* logprobs);

/* Receives each generated token and the text it completed (piece[0, piece_len), UTF-8, not
 * NUL-terminated, possibly empty: a partial character, or text held back because it may begin a
 * stop string). At the end, text still held back comes in one last call with token -1. `piece`
 * is valid only during the call. Return non-zero to stop generating. */
typedef int (*kiln_token_fn)(int32_t token, const char* piece, size_t piece_len, void* user_data);

typedef struct kiln_generate_params {
  uint32_t struct_size;            /* set by kiln_generate_params_init */
  int32_t max_tokens;              /* >= 0; default 128 */
  const char* const* stop_strings; /* optional NUL-terminated non-empty strings; a stop string is
                                    * never emitted, also when split across tokens */
  size_t n_stop_strings;
  kiln_token_fn callback; /* optional */
  void* user_data;
} kiln_generate_params;

typedef enum kiln_stop_reason {
  KILN_STOP_EOG = 0, /* an end-of-generation token (kept in the session, not emitted) */
  KILN_STOP_MAX_TOKENS = 1,
  KILN_STOP_STRING = 2,      /* a stop string appeared */
  KILN_STOP_CALLBACK = 3,    /* the callback returned non-zero */
  KILN_STOP_CANCELLED = 4,   /* kiln_session_cancel */
  KILN_STOP_CONTEXT_FULL = 5 /* the session reached n_ctx tokens */
} kiln_stop_reason;

typedef struct kiln_generate_result {
  uint32_t struct_size; /* set by the caller: sizeof(kiln_generate_result) */
  int32_t n_tokens;     /* tokens generated and kept in the session */
  kiln_stop_reason stop_reason;
} kiln_generate_result;

/* Writes the defaults (max_tokens 128, no stop strings, no callback) as kiln_model_params_init
 * does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_generate_params_init(kiln_generate_params* params, size_t struct_size);

/* Generates up to params->max_tokens tokens after the session's tokens, sampling each with the
 * session's sampler and streaming it to the callback (on the calling thread, after each step of
 * the cache and before the session's next one). It runs as a request of the cache's batching
 * engine: the calling thread steps the cache while no other thread does (else it waits for the
 * worker's or another caller's steps), so concurrent generates on one cache share passes. Generated
 * tokens stay in the session (continue with another append or generate). A cancel ends it with
 * KILN_OK and KILN_STOP_CANCELLED. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL session/params/result,
 * struct_size too small, max_tokens < 0, NULL or empty stop string, empty session),
 * KILN_ERR_OUT_OF_RANGE (the session already holds n_ctx tokens), KILN_ERR_CACHE_FULL (the
 * tokens streamed so far stay in the session; free space and generate again), KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_generate(kiln_session* session,
                                           const kiln_generate_params* params,
                                           kiln_generate_result* result);

/* Stops the call in flight on `session`: an append at its next prefill chunk (it fails with
 * KILN_ERR_CANCELLED and changes nothing), a generate at its next decode step (KILN_OK,
 * KILN_STOP_CANCELLED), a submitted request at the cache's next step whatever its state (queued
 * or prefilling: it ends with KILN_ERR_CANCELLED and the prompt is not kept; decoding: KILN_OK,
 * KILN_STOP_CANCELLED; see kiln_session_submit). A cancel applies only to the call in flight: every
 * call that changes the session (append, generate, rewind, fork, set_strategy) drops a cancel that
 * arrived before it started, so a cancel that arrives while no call is in flight has no effect.
 * Allowed from any thread at any time, the generate callback included (but not concurrently with
 * kiln_session_destroy). Statuses: KILN_ERR_INVALID_ARGUMENT (NULL). */
KILN_API kiln_status kiln_session_cancel(kiln_session* session);

/* A new session with the same tokens (sharing cache blocks copy-on-write), logits, sampler and
 * random state. A session with a speculative strategy passes the fork its own clone of it (its
 * state and measured pass cost; metrics start at zero), owned by the fork and independent of
 * the kiln_strategy handle. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_BUSY,
 * KILN_ERR_OUT_OF_MEMORY, KILN_ERR_UNSUPPORTED (a strategy that cannot be cloned). */
KILN_API kiln_status kiln_session_fork(kiln_session* session, kiln_session** out_session);

/* Removes the last n_tokens tokens. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL),
 * KILN_ERR_OUT_OF_RANGE (n_tokens > kiln_session_n_tokens), KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_rewind(kiln_session* session, size_t n_tokens);

/* Number of tokens the session holds (prompt and generated); 0 for NULL. Allowed from any thread
 * at any time (but not concurrently with kiln_session_destroy), also while another thread is
 * inside a call on the session: it then returns the count as of the last completed token: an
 * append's tokens count once the append has succeeded, a generated token from the moment it is
 * passed to the callback. Between calls it is exact. */
KILN_API size_t kiln_session_n_tokens(const kiln_session* session);

/* Copies the session's tokens into tokens[0, capacity); *n_tokens receives the count, also on
 * KILN_ERR_BUFFER_TOO_SMALL. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL session/n_tokens, NULL
 * tokens with capacity > 0), KILN_ERR_BUFFER_TOO_SMALL, KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_get_tokens(const kiln_session* session, int32_t* tokens,
                                             size_t capacity, size_t* n_tokens);

/* The next-token logits [n_vocab] after the session's last token. *logits stays valid until the
 * next call on the session. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointers; no logits yet:
 * empty session, or after generate/rewind until the next append or generate computes them),
 * KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_get_logits(const kiln_session* session, const float** logits,
                                             int32_t* n_vocab);

typedef struct kiln_token_logprob {
  int32_t token;
  float logprob; /* natural log of the raw (pre-sampling) probability */
} kiln_token_logprob;

/* The top log-probabilities (highest first) of the distribution the last generated token was
 * sampled from; sampler n_logprobs entries (0 when it is 0). *n receives the count, also on
 * KILN_ERR_BUFFER_TOO_SMALL. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_BUFFER_TOO_SMALL,
 * KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_get_logprobs(const kiln_session* session, kiln_token_logprob* out,
                                               size_t capacity, size_t* n);

/* ---------------------------------------------------------------- non-blocking requests
 *
 * Added in 0.2.0 after the ABI 1 baseline (new functions and structs only).
 *
 * kiln_session_submit starts a request (append a prompt, then generate) and returns at once. The
 * request runs whenever some thread steps the session's cache:
 * - the host, with kiln_cache_step (a game loop calls it once per frame with a time budget, on
 *   a thread it owns);
 * - the library's worker thread (kiln_cache_start_worker), which steps while requests are in
 *   flight and sleeps otherwise;
 * - any blocking call (kiln_session_append_*, kiln_session_generate) on any session of the same
 *   cache: it steps the cache itself while no other thread does, else waits for that thread's
 *   steps. Concurrent blocking generates on one cache therefore share passes.
 * Results reach the host by polling (kiln_session_poll: no callback ever runs on a foreign
 * thread) or by the request's callbacks, which run on the thread that steps (see
 * kiln_request_params). Statuses of the step itself never depend on a request's fate: a request
 * that fails reports its status through poll or on_done.
 *
 * While a request is in flight, every other call on the session fails with KILN_ERR_BUSY, except
 * kiln_session_poll, kiln_session_cancel and kiln_session_n_tokens (any thread, any time) and
 * kiln_session_destroy (which cancels the request; not from the request's own callback). The
 * session takes calls again once kiln_session_poll has reported done, or once on_done returned.
 */

/* Called once when a submitted request ends, after its last on_token: status KILN_OK with the
 * stop reason and the generated token count, or the error (kiln_last_error_message() on this
 * thread describes it; reason and count are then 0). */
typedef void (*kiln_done_fn)(kiln_session* session, kiln_status status, kiln_stop_reason reason,
                             int32_t n_tokens, void* user_data);

typedef struct kiln_request_params {
  uint32_t struct_size; /* set by kiln_request_params_init */
  const char* text;     /* optional prompt appended first (UTF-8, text_len bytes) */
  size_t text_len;
  uint32_t text_flags;   /* KILN_TOKENIZE_* for text; default 0 */
  const int32_t* tokens; /* optional token ids appended after text */
  size_t n_tokens;
  int32_t max_tokens; /* tokens to generate after the prompt, >= 0; default 128; 0: only
                       * compute the prompt */
  const char* const* stop_strings; /* as in kiln_generate_params */
  size_t n_stop_strings;
  /* Optional callbacks, called on the thread that steps the cache (the kiln_cache_step caller,
   * the worker, or a thread in a blocking call), after the step that made the tokens, outside
   * kiln's locks, never concurrently for one cache. From them the host may call, for any
   * session: kiln_session_poll, kiln_session_cancel, kiln_session_n_tokens and
   * kiln_session_submit (on a session without a request in flight); not kiln_cache_step, not the
   * blocking calls (they fail with KILN_ERR_BUSY), not kiln_session_destroy of the request's
   * own session. Keep them short: the next step of every session waits for them. */
  kiln_token_fn on_token; /* each token and its text, as kiln_generate_params.callback; returning
                           * non-zero ends the request before its next step
                           * (KILN_STOP_CALLBACK). With on_token set, poll returns no text. */
  kiln_done_fn on_done;
  void* user_data;
} kiln_request_params;

/* Writes the defaults (no prompt, max_tokens 128, no stop strings, no callbacks) as
 * kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_request_params_init(kiln_request_params* params, size_t struct_size);

/* Starts a request on `session` and returns at once: the prompt (text, then tokens) is
 * tokenized and checked now, then computed and generated from as the cache is stepped. All or
 * nothing for the prompt: if the request ends before the prompt is computed (cancel, cache full)
 * its status is that error and the session is as before the submit. After that, generated tokens
 * stay in the session (a cancel then ends it with KILN_OK and KILN_STOP_CANCELLED).
 * Statuses (nothing changed, nothing submitted): KILN_ERR_INVALID_ARGUMENT (NULL session or
 * params, struct_size too small, NULL text with text_len > 0, NULL tokens with n_tokens > 0, bad
 * token id, unknown text_flags, max_tokens < 0, NULL or empty stop string, an empty session with
 * no prompt), KILN_ERR_OUT_OF_RANGE (the prompt would pass n_ctx), KILN_ERR_BUSY (a call or
 * request in flight on the session, or called from a blocking call's callback). Thread rules: as
 * the other session calls. */
KILN_API kiln_status kiln_session_submit(kiln_session* session, const kiln_request_params* params);

typedef struct kiln_poll_result {
  uint32_t struct_size; /* set by the caller: sizeof(kiln_poll_result) */
  size_t text_len;      /* bytes written to text (may end inside a UTF-8 character: the next
                         * poll continues it) */
  size_t n_new_tokens;  /* generated token ids written to tokens (an end-of-generation token
                         * is not returned) */
  size_t text_left;     /* bytes and tokens still queued after this poll (buffers too small) */
  size_t tokens_left;
  int done;           /* non-zero: the request ended and all its output was returned */
  kiln_status status; /* when done: KILN_OK, or the request's error (kiln_last_error_message()
                       * describes it) */
  kiln_stop_reason stop_reason; /* when done with KILN_OK */
  int32_t n_tokens;             /* tokens generated so far */
} kiln_poll_result;

/* Moves the output of the session's request made since the last poll into text[0,
 * text_capacity) and tokens[0, token_capacity) and reports whether it is done. What does not fit
 * stays queued for the next poll; a capacity of 0 (the buffer may then be NULL) drops that kind
 * of output (e.g. tokens NULL, 0 for a host that only wants text). Never blocks on a step. After
 * done, later polls report done again (with no new output) until the next submit. Statuses:
 * KILN_ERR_INVALID_ARGUMENT (NULL session/result, struct_size too small, NULL buffer with capacity
 * > 0, no request was ever submitted on the session). Any thread, any time (not concurrently with
 * kiln_session_destroy), callbacks included. */
KILN_API kiln_status kiln_session_poll(kiln_session* session, char* text, size_t text_capacity,
                                       int32_t* tokens, size_t token_capacity,
                                       kiln_poll_result* result);

typedef struct kiln_step_params {
  uint32_t struct_size; /* set by kiln_step_params_init */
  /* > 0: a per-frame budget. The call works on forward passes unit by unit (a unit is one layer of
   * a pass, one part of its output head (vocabulary rows whose weights weigh about a layer's), or
   * its finish (sampling); a pass is the next token of every generating session plus prompt chunks)
   * and runs only the units predicted to end within this many milliseconds of the call's start,
   * less a 3% reserve for the call's own work (predictions: running averages of measured unit times
   * for the pass's token count, times a 99th percentile of how far recent units of the kind strayed
   * above theirs, at most twice), but always at least one unit when there is work, so every call
   * makes progress. A pass that does not fit is suspended after its last unit run and the next
   * kiln_cache_step continues it; its bits are those of an unsplit pass. Between calls kiln holds
   * no lock: any call may be made from other threads (a session whose tokens are in the suspended
   * pass may be cancelled or destroyed: destroying it first runs the rest of the pass on the
   * destroying thread; its results for the other sessions wait for the next step). A pass begun
   * under a budget takes only the prompt tokens whose first layer is predicted to fit it (decoding
   * sessions always join). The time spent passes the budget by a unit forced to run, a
   * misprediction, or a thread the OS deschedules (a SmolLM2-135M layer for 4 decoding sessions on
   * 2 threads takes about 0.5 ms, as does each of the 14 parts of its output head over the
   * 49k-token vocabulary).
   * 0 (default): one whole step (a suspended pass is finished). Blocking calls and the worker
   * always run whole passes. */
  double time_budget_ms;
  /* Most tokens in one step's forward pass (decode tokens first, then prompt chunks); 0
   * (default): the cache's own (kiln_cache_params.step_tokens). */
  int32_t step_tokens;
} kiln_step_params;

typedef struct kiln_step_result {
  uint32_t struct_size; /* set by the caller: sizeof(kiln_step_result) */
  int32_t n_steps;      /* forward passes worked on (begun, continued or finished) */
  int64_t n_tokens;     /* tokens of the passes finished (decode, draft and prompt tokens) */
  int32_t n_active;     /* requests still in flight on the cache afterwards */
  double elapsed_ms;
} kiln_step_result;

/* Writes the defaults (one step, the cache's step size) as kiln_model_params_init does.
 * Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_step_params_init(kiln_step_params* params, size_t struct_size);

/* Runs steps of the cache on the calling thread (see "non-blocking requests"); params NULL: one
 * step with the defaults; result may be NULL. With nothing in flight it returns at once. Steps
 * of one cache never overlap: a call made while another thread steps waits for that step.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL cache, struct_size too small, time_budget_ms < 0 or
 * NaN, step_tokens < 0), KILN_ERR_BUSY (called from a request's callback). Thread-safe. */
KILN_API kiln_status kiln_cache_step(kiln_cache* cache, const kiln_step_params* params,
                                     kiln_step_result* result);

/* Starts the cache's worker thread, which steps the cache while requests are in flight (blocking
 * calls then wait for its steps instead of stepping themselves). Starting a running worker does
 * nothing. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_INTERNAL (the thread could not
 * be created).
 * Thread-safe. */
KILN_API kiln_status kiln_cache_start_worker(kiln_cache* cache);

/* Stops the worker after its current step and joins it (requests in flight stay queued; step
 * the cache or start the worker again to finish them). kiln_cache_destroy stops it too.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL), KILN_ERR_BUSY (called from a callback the worker
 * runs). Thread-safe. */
KILN_API kiln_status kiln_cache_stop_worker(kiln_cache* cache);

/* ---------------------------------------------------------------- saved sessions
 *
 * A session's state saved to a buffer or a file and restored into a session on a cache of the
 * same model (a saved game of an NPC, a server restart): its tokens, the K/V of the computed
 * ones (or only the tokens, see kiln_state_params), the next-token logits, the sampler
 * parameters and random state, and a speculative strategy's adaptive state. The restored session
 * continues bit for bit as the saved one would have: the same tokens, greedy or seeded.
 * The format is a Protobuf message (lib/session/session_state.proto, docs/session_state.md) with
 * a fingerprint of the model, a format version and a CRC-32C. A state from another model, a
 * truncated or corrupted one, or one from a newer kiln is refused with a status naming the
 * problem, and the session is left exactly as it was.
 * Thread rules: as the other session calls (KILN_ERR_BUSY from the generate callback).
 * Added in 0.2.0 after the ABI 1 baseline.
 */

typedef struct kiln_state_params {
  uint32_t struct_size; /* set by kiln_state_params_init */
  /* Non-zero (default): store the K/V of the computed tokens as the cache holds them (its element
   * type; about 23 KB per token for the default model at f16), so that a restore is a copy.
   * 0: tokens only, a state of a few bytes per token; the restore recomputes the K/V (a prefill,
   * attaching cached prefix blocks where the cache has them) and gets the same bits, except with
   * kiln_cache_params.llama_cpp_order. kiln_cache_params.swa_full: see there. */
  int32_t kv;
  /* Non-zero (default): store the speculative strategy's adaptive state; a strategy that cannot
   * save it (the draft model) makes the save fail with KILN_ERR_UNSUPPORTED. 0: leave it out; a
   * restored session's strategy then starts afresh (greedy output is the same either way). */
  int32_t strategy;
} kiln_state_params;

/* Writes the defaults (kv 1, strategy 1) as kiln_model_params_init does. Statuses: as
 * kiln_model_params_init. */
KILN_API kiln_status kiln_state_params_init(kiln_state_params* params, size_t struct_size);

/* Saves the session's state into buffer[0, capacity). *size receives its length, also on
 * KILN_ERR_BUFFER_TOO_SMALL (pass capacity 0 to learn it; each call serializes the state anew, so
 * for large states kiln_session_save_state_file saves the double work). params NULL: defaults.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL session/size, NULL buffer with capacity > 0,
 * struct_size too small), KILN_ERR_BUFFER_TOO_SMALL, KILN_ERR_UNSUPPORTED (a strategy that cannot
 * save its state, with params->strategy), KILN_ERR_OUT_OF_RANGE (a state over 2 GiB: save with
 * kv = 0), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_save_state(kiln_session* session, const kiln_state_params* params,
                                             void* buffer, size_t capacity, size_t* size);

/* Replaces the session's contents with the state in state[0, size), saved from a session on a
 * cache of the same model (any block size; the same kv_type when the state holds K/V). A
 * strategy: when the state holds the state of one, set a strategy of the same kind and
 * parameters on this session first (kiln_session_set_strategy) to restore it; a strategy whose
 * state was not saved starts afresh. All or nothing: on error the session is exactly as before.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL pointers; a state from another model, the message
 * names both; K/V of another element type; a strategy of another kind or with other parameters),
 * KILN_ERR_FORMAT (not a session state, truncated, corrupted, malformed: the message says which),
 * KILN_ERR_UNSUPPORTED (written by a newer kiln), KILN_ERR_OUT_OF_RANGE (more tokens than the
 * cache's n_ctx), KILN_ERR_CACHE_FULL (the restored K/V need blocks while the session's current
 * ones are still held: free space, or restore into a new session), KILN_ERR_CANCELLED
 * (kiln_session_cancel during a recompute), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_load_state(kiln_session* session, const void* state, size_t size);

/* kiln_session_save_state into the file `path` (written to "<path>.tmp", synced, then renamed
 * over `path`). Statuses: those of kiln_session_save_state except BUFFER_TOO_SMALL, KILN_ERR_IO
 * (cannot write the file, with the OS's reason). */
KILN_API kiln_status kiln_session_save_state_file(kiln_session* session,
                                                  const kiln_state_params* params,
                                                  const char* path);

/* kiln_session_load_state from the file `path`. Statuses: those of kiln_session_load_state,
 * KILN_ERR_IO (missing or unreadable file). */
KILN_API kiln_status kiln_session_load_state_file(kiln_session* session, const char* path);

/* ---------------------------------------------------------------- speculative decoding
 *
 * A kiln_strategy proposes draft tokens that a session's generate verifies with the target model
 * in one pass per step (docs/speculative.md). Lossless: the output is distributed exactly as
 * without a strategy, and identical token for token at temperature 0. A strategy serves one
 * session at a time; set it with kiln_session_set_strategy and detach it (NULL) or destroy the
 * session before destroying the strategy.
 */

typedef struct kiln_strategy kiln_strategy;

typedef struct kiln_ngram_params {
  uint32_t struct_size; /* set by kiln_ngram_params_init */
  int32_t max_ngram;    /* longest suffix matched first; default 3 */
  int32_t min_ngram;    /* shortest suffix matched (>= 1); default 1 */
  int32_t max_draft;    /* most tokens proposed per step (>= 1); default 8 */
  int32_t start_draft;  /* longest draft while the pass cost is not yet measured, in
                         * [1, max_draft]; default 4 */
  int32_t max_skip;     /* plain steps between probes of the pass cost (0: never); default 32 */
  int32_t adaptive;     /* nonzero: cost-aware draft length (docs/speculative.md); 0: always
                         * max_draft when a match is found; default 1 */
  /* >= 0: a pass over w tokens is taken to cost 1 + fixed_pass_cost_beta (w - 1) one-token
   * passes, so the draft lengths, and with a
   * sampler the text for a fixed seed, do not depend on timing; < 0 (default -1): the measured
   * cost. Greedy output never depends on it. */
  double fixed_pass_cost_beta;
} kiln_ngram_params;

/* Writes the defaults as kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_ngram_params_init(kiln_ngram_params* params, size_t struct_size);

/* N-gram prompt lookup (no model). Statuses: KILN_ERR_INVALID_ARGUMENT (NULL, struct_size too
 * small, a bad field: the message names it), KILN_ERR_OUT_OF_MEMORY. */
KILN_API kiln_status kiln_strategy_create_ngram(const kiln_ngram_params* params,
                                                kiln_strategy** out_strategy);

typedef struct kiln_draft_params {
  uint32_t struct_size; /* set by kiln_draft_params_init */
  int32_t max_draft;    /* most tokens drafted per step (>= 1); default 5 */
  int32_t adaptive;     /* nonzero: adapt the draft length to acceptance; default 1 */
  int32_t n_threads;    /* draft forward threads; <= 0: physical cores (default) */
  int32_t n_ctx;        /* longest context drafted for; 0: min(training context, 8192) */
  /* As in kiln_ngram_params; >= 0 also pins a draft pass to the cost of one one-token target
   * pass. Default -1: measured. */
  double fixed_pass_cost_beta;
} kiln_draft_params;

/* Writes the defaults as kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_draft_params_init(kiln_draft_params* params, size_t struct_size);

/* A draft model loaded from `draft_path` (any GGUF with the target's vocabulary size; kiln-mkdraft
 * makes one from the target) with its own KV cache. Statuses: KILN_ERR_INVALID_ARGUMENT (NULL,
 * struct_size too small, bad field, vocabulary size differing from `target`'s), the statuses of
 * kiln_model_load for the file, KILN_ERR_OUT_OF_MEMORY. */
KILN_API kiln_status kiln_strategy_create_draft(const kiln_model* target, const char* draft_path,
                                                const kiln_draft_params* params,
                                                kiln_strategy** out_strategy);

/* Medusa heads (added in 0.2.0 after the ABI 1 baseline: new struct and functions only). */
typedef struct kiln_medusa_params {
  uint32_t struct_size; /* set by kiln_medusa_params_init */
  int32_t max_draft;    /* most tree nodes verified per step (the head file's tree, cut); 0
                         * (default): the whole tree */
  int32_t n_threads;    /* threads of the heads' LM-head matmul; default 1; <= 0: physical cores */
  int32_t merge_ngram;  /* (after the struct's first 0.2.0 form) nonzero (default 1): the
                         * n-gram prompt-lookup continuation of the context is merged into every
                         * tree, on top of the file's tree (as kiln_eagle_params.merge_ngram) */
  /* (after merge_ngram) nonzero: Medusa's typical acceptance instead of exact verification
   * when sampling (temperature > 0). LOSSY: the text is no longer distributed as plain sampling;
   * kiln_spec_metrics.accepted_lossy counts the tokens it accepted. A draft token is accepted when
   * the target gives it a probability above min(typical_epsilon, typical_delta * exp(-H)), H the
   * entropy of the target's distribution after the sampler chain; the longest accepted path wins
   * and the next token is sampled from the target after it. 0 (default): exact. */
  int32_t typical_acceptance;
  float typical_epsilon; /* in (0, 1]; default 0.09 (Medusa's) */
  float typical_delta;   /* > 0; default 0.3 (Medusa's) */
} kiln_medusa_params;

/* Writes the defaults as kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_medusa_params_init(kiln_medusa_params* params, size_t struct_size);

/* Medusa heads for `target` from the head file `head_path` (GGUF, architecture "medusa";
 * tools/train/ makes them; docs/speculative.md): they draft a static tree from the target's
 * final hidden state, verified exactly (greedy output identical to plain decoding, sampling
 * distributed as plain sampling). Statuses: KILN_ERR_INVALID_ARGUMENT (NULL, struct_size too
 * small, a bad field, a head trained for another model: the message names what differs, a
 * file that is not a medusa head, a head format version newer than this library reads, or a
 * reduced vocabulary with ids outside the target's), KILN_ERR_FORMAT (a malformed head file),
 * KILN_ERR_IO,
 * KILN_ERR_OUT_OF_MEMORY. */
KILN_API kiln_status kiln_strategy_create_medusa(const kiln_model* target, const char* head_path,
                                                 const kiln_medusa_params* params,
                                                 kiln_strategy** out_strategy);

/* EAGLE heads (added in 0.2.0 after the ABI 1 baseline: new struct and functions only). */
typedef struct kiln_eagle_params {
  uint32_t struct_size; /* set by kiln_eagle_params_init */
  int32_t top_k;        /* children per expanded node and nodes expanded per depth, 1..64;
                         * 0 (default): the tree size the pass cost let through at the last
                         * step, 2..8 */
  int32_t max_depth;    /* deepest draft node, 1..16; 0 (default): deeper while another draft
                         * step can pay for itself (measured head and target pass costs), up
                         * to 8 */
  int32_t tree_tokens;  /* nodes verified per step; 0 (default): chosen each step from the
                         * drafts' path probabilities and the measured pass cost */
  int32_t n_threads;    /* threads of the head's matmuls; default 1; <= 0: physical cores */
  int32_t merge_ngram;  /* (after the struct's first 0.2.0 form) nonzero (default 1): the
                         * n-gram prompt-lookup continuation of the context (the defaults of
                         * kiln_strategy_create_ngram, its cost-aware length) is merged into
                         * every tree, on top of tree_tokens: text that copies its context
                         * (quoting, editing) gets long accepted runs */
  /* (after merge_ngram) as in kiln_medusa_params: the lossy typical acceptance when nonzero */
  int32_t typical_acceptance;
  float typical_epsilon; /* in (0, 1]; default 0.09 */
  float typical_delta;   /* > 0; default 0.3 */
} kiln_eagle_params;

/* Writes the defaults as kiln_model_params_init does. Statuses: as kiln_model_params_init. */
KILN_API kiln_status kiln_eagle_params_init(kiln_eagle_params* params, size_t struct_size);

/* An EAGLE head for `target` from the head file `head_path` (GGUF, architecture "eagle" for
 * EAGLE-1 heads or "eagle3" for EAGLE-3 heads, which fuse three target layers and draft with
 * their own LM head; docs/speculative.md lists the keys and tensors): one decoder layer over the
 * target's features with its own K/V cache, drafting EAGLE-2 dynamic trees, verified exactly
 * (greedy output identical to plain decoding, sampling distributed as plain sampling). Statuses:
 * KILN_ERR_INVALID_ARGUMENT (NULL, struct_size too small, a bad field, a head trained for
 * another model: the message names what differs, or a file that is not an eagle head),
 * KILN_ERR_FORMAT (a malformed head file: the message names the key or tensor), KILN_ERR_IO,
 * KILN_ERR_OUT_OF_MEMORY. */
KILN_API kiln_status kiln_strategy_create_eagle(const kiln_model* target, const char* head_path,
                                                const kiln_eagle_params* params,
                                                kiln_strategy** out_strategy);

/* NULL is a no-op. Must not be attached to a live session. */
KILN_API void kiln_strategy_destroy(kiln_strategy* strategy);

/* Attaches `strategy` (NULL: plain decoding) to the session's next generate calls. Statuses:
 * KILN_ERR_INVALID_ARGUMENT (NULL session), KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_set_strategy(kiln_session* session, kiln_strategy* strategy);

typedef struct kiln_spec_metrics {
  uint32_t struct_size;           /* set by the caller: sizeof(kiln_spec_metrics) */
  int64_t steps;                  /* target passes made by speculative steps */
  int64_t drafted;                /* draft tokens proposed */
  int64_t accepted;               /* draft tokens accepted */
  int64_t generated;              /* tokens emitted by speculative steps */
  double mean_accepted_per_step;  /* accepted / steps */
  double target_passes_per_token; /* steps / generated (1 = plain decoding) */
  /* (after target_passes_per_token) of `accepted`: the tokens the lossy typical acceptance
   * accepted (kiln_medusa_params.typical_acceptance); 0 unless chosen. Read it only when
   * struct_size covers it. */
  int64_t accepted_lossy;
} kiln_spec_metrics;

/* Fills *out (out->struct_size set by the caller) with the session's cumulative speculative
 * metrics (zeros without a strategy). Statuses: KILN_ERR_INVALID_ARGUMENT (NULL, struct_size too
 * small), KILN_ERR_BUSY. */
KILN_API kiln_status kiln_session_get_spec_metrics(const kiln_session* session,
                                                   kiln_spec_metrics* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
