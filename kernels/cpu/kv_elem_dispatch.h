// The K/V element type as a compile-time constant for the attention kernels of every CPU level.
//
// Why a template in a header that ISA-specific files share (op_kernels.h keeps inline code out):
// WithKvElem is only ever instantiated with the calling file's own lambda, a type no other
// translation unit has, so no instantiation compiled with -mavx512f can stand in for an AVX2
// one at link time (the same reasoning as unroll.h).
#pragma once

#include "kernels/cpu/op_kernels.h"

namespace kiln::cpu {

// f.template operator()<E>() with E = elem (one instantiation per element type, so the
// kernels' per-element switches fold away).
template <typename F>
__attribute__((always_inline)) inline void WithKvElem(KvElem elem, F&& f) {
  switch (elem) {
    case KvElem::kF32:
      return f.template operator()<KvElem::kF32>();
    case KvElem::kF16:
      return f.template operator()<KvElem::kF16>();
    case KvElem::kBf16:
      return f.template operator()<KvElem::kBf16>();
    case KvElem::kQ8_0:
      return f.template operator()<KvElem::kQ8_0>();
  }
}

}  // namespace kiln::cpu
