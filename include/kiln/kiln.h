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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */
