/* The ABI 1 baseline's layout as the current header declares it (c_abi_layout.h). */
#include <kiln/kiln.h>

#define ABI_LAYOUT_FN abi_layout_current
#include "c_abi_layout.inc"
