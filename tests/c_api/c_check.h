/* CHECK for the C API tests: records a failure (with kiln's last error message) and goes on.
 * Each test file includes the kiln header it is built against (the current <kiln/kiln.h>, or a
 * frozen baseline from abi/) and defines `static int g_failures` before including this; a test
 * whose threads check things uses TCHECK and defines `static atomic_int g_thread_failures`. */
#ifndef KILN_TESTS_C_CHECK_H_
#define KILN_TESTS_C_CHECK_H_

#include <stdio.h>

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kiln_last_error_message());                                                      \
      ++g_failures;                                                                            \
    }                                                                                          \
  } while (0)

/* CHECK from any thread: counts into g_thread_failures (<stdatomic.h>). */
#define TCHECK(cond)                                                                           \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kiln_last_error_message());                                                      \
      atomic_fetch_add(&g_thread_failures, 1);                                                 \
    }                                                                                          \
  } while (0)

#endif /* KILN_TESTS_C_CHECK_H_ */
