// The op-kernel table for a SIMD level (kernels/cpu/op_kernels.h), clamped to what this CPU
// supports.
#pragma once

#include "kernels/cpu/op_kernels.h"
#include "lib/quant/quant.h"

namespace kiln::cpu {

// Lives forever; thread-safe.
const OpKernels& GetOpKernels(CpuLevel level);

// The KvElem of a cache element type, or false for types the attention kernels do not read.
bool KvElemOf(GgmlType type, KvElem* elem);

}  // namespace kiln::cpu
