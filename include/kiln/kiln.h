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
 * - Parameter structs start with `struct_size` and come from kiln_*_default_params(), so fields
 *   can be appended without breaking callers compiled against an older header.
 * - Thread-safety: a kiln_model is immutable after load and may be used from any number of
 *   threads at once. Each function says otherwise where it differs.
 * - A signature never changes once released; replacements get a _v2 suffix.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define KILN_API __declspec(dllimport)
#elif defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
/* Bumped only when the binary interface breaks; it is the shared library's SONAME suffix. */
#define KILN_ABI_VERSION 0

#define KILN_STRINGIFY_INNER(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER(x)

/* "MAJOR.MINOR.PATCH" of the library actually loaded (may differ from the header's). */
KILN_API const char* kiln_version(void);
/* KILN_ABI_VERSION of the library actually loaded. */
KILN_API int kiln_abi_version(void);

/* ---------------------------------------------------------------- status */

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERR_INVALID_ARGUMENT = 1, /* NULL handle/pointer, bad value, token id out of range */
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
  uint32_t struct_size;          /* sizeof(kiln_model_params), set by the default params call */
  const char* path;              /* GGUF file (UTF-8 path); required */
  int use_mmap;                  /* non-zero (default): map the file; 0: read it into memory */
  kiln_progress_fn progress;     /* optional */
  void* progress_user_data;
  kiln_log_fn log;               /* optional; lines from this load */
  void* log_user_data;
} kiln_model_params;

/* Defaults: path NULL, use_mmap 1, no callbacks. */
KILN_API kiln_model_params kiln_model_default_params(void);

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
  int64_t size_bytes;       /* bytes of all weights in the file */
  int32_t n_vocab;
  int32_t n_ctx_train;
  int32_t n_embd;
  int32_t n_layer;
  int32_t n_head;
  int32_t n_head_kv;
  int32_t head_dim;
  int32_t n_ff;
  int32_t token_bos;        /* -1 when the vocabulary has none */
  int32_t token_eos;
  int32_t token_eot;
} kiln_model_info;

/* Fills *info (info->struct_size must be set; fields past it are not written).
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

/* ---------------------------------------------------------------- text */

/* Flags of kiln_tokenize. */
#define KILN_TOKENIZE_ADD_SPECIAL 1u   /* add BOS/EOS as the model's vocabulary asks */
#define KILN_TOKENIZE_PARSE_SPECIAL 2u /* "<|im_start|>" in the text becomes the control token */

/* Tokenizes text[0, text_len) (UTF-8; invalid bytes are encoded as bytes, never rejected) into
 * tokens[0, capacity). *n_tokens receives the count, also on KILN_ERR_BUFFER_TOO_SMALL (then it
 * is the required capacity and tokens is untouched). text may be NULL when text_len is 0.
 * Statuses: KILN_ERR_INVALID_ARGUMENT (NULL model/n_tokens, NULL text with text_len > 0, NULL
 * tokens with capacity > 0), KILN_ERR_BUFFER_TOO_SMALL. */
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
                                              const kiln_chat_message* messages,
                                              size_t n_messages, int add_generation_prompt,
                                              char* text, size_t capacity, size_t* text_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
