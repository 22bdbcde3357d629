/* Exercises the public API from plain C (compiled with -std=c11 -Werror -Wstrict-prototypes). */
#include <kiln/kiln.h>
#include <stdio.h>
#include <string.h>

static int g_failures = 0;
#define CHECK(cond)                                               \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                               \
    }                                                             \
  } while (0)

static void test_versions(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", KILN_VERSION_MAJOR, KILN_VERSION_MINOR,
           KILN_VERSION_PATCH);
  CHECK(strcmp(kiln_version(), expected) == 0);
  CHECK(kiln_abi_version() == KILN_ABI_VERSION);
  CHECK(strcmp(kiln_status_name(KILN_ERR_FORMAT), "KILN_ERR_FORMAT") == 0);
  CHECK(strcmp(kiln_status_name((kiln_status)999), "KILN_ERR_UNKNOWN") == 0);
}

int main(void) {
  test_versions();
  if (g_failures) {
    fprintf(stderr, "c_api_test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
