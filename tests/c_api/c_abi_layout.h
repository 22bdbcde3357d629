/* The ABI 1 baseline's layout measured in one translation unit: the size of each struct, the
 * offset and size of each field and the value of each constant of abi/kiln_abi1_layout.h.
 * c_abi_layout_baseline.c measures them against the frozen baseline header,
 * c_abi_layout_current.c against the current <kiln/kiln.h>; c_abi_test.c compares the two. */
#ifndef KILN_TESTS_C_API_C_ABI_LAYOUT_H_
#define KILN_TESTS_C_API_C_ABI_LAYOUT_H_

#include <stddef.h>

typedef enum abi_record_kind {
  ABI_STRUCT_SIZE = 0, /* sizeof of a versioned struct: may grow */
  ABI_EXACT = 1        /* offsets, field sizes, array element types, constants: never change */
} abi_record_kind;

typedef struct abi_record {
  const char* what; /* "offsetof(kiln_model_params, path)" */
  abi_record_kind kind;
  long long value;
} abi_record;

/* Each sets *records to its table (in the order of abi/kiln_abi1_layout.h) and returns its
 * length. */
size_t abi_layout_baseline(const abi_record** records);
size_t abi_layout_current(const abi_record** records);

#endif /* KILN_TESTS_C_API_C_ABI_LAYOUT_H_ */
