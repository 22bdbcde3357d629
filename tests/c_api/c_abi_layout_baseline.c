/* The ABI 1 baseline's layout as the frozen baseline header declares it (c_abi_layout.h). */
#include "abi/kiln_abi1.h"

#define ABI_LAYOUT_FN abi_layout_baseline
#include "c_abi_layout.inc"
