/* A program that uses kiln the way a C application would: include <kiln/kiln.h>, link the
 * library, call it. Prints "kiln <version> abi <n>" and fails if the library loaded at run time
 * is not the one the header describes. */
#include <kiln/kiln.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const char* header_version = KILN_STRINGIFY(KILN_VERSION_MAJOR) "." KILN_STRINGIFY(
      KILN_VERSION_MINOR) "." KILN_STRINGIFY(KILN_VERSION_PATCH);
  const char* version = kiln_version();
  if (version == NULL || strcmp(version, header_version) != 0) {
    fprintf(stderr, "consumer: library version %s, header %s\n", version ? version : "(null)",
            header_version);
    return 1;
  }
  if (kiln_abi_version() != KILN_ABI_VERSION) {
    fprintf(stderr, "consumer: library ABI %d, header %d\n", kiln_abi_version(),
            KILN_ABI_VERSION);
    return 1;
  }
  printf("kiln %s abi %d\n", version, kiln_abi_version());
  return 0;
}
