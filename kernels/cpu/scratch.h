// Per-thread scratch memory for the kernels, so the SIMD translation units need no std::vector
// (or any other template with an out-of-line copy: the linker keeps one copy of such a function
// for the whole program, and one compiled with -mavx512f would then run on every CPU).
#pragma once

#include <cstddef>

namespace kiln::kernels {

// Slots a kernel may hold at once: one kernel call uses at most this many buffers. Slots 0-3 are
// the kernels'; slot 4 is for a wrapper that calls a kernel (lib/quant/legacy.cc's packing
// in-place form).
inline constexpr int kScratchSlots = 5;
inline constexpr int kWrapperScratchSlot = 4;

// At least `bytes` bytes, 64-byte aligned, owned by the calling thread; contents undefined (kept
// from the previous use of the slot when it did not grow). Valid until the thread's next call
// with the same slot. slot < kScratchSlots. The kernels have no error path and ask for a few
// KiB per token, so a failed allocation aborts (as std::vector's bad_alloc would terminate).
void* ThreadScratch(int slot, size_t bytes);

}  // namespace kiln::kernels
