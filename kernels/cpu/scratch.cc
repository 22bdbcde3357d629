#include "kernels/cpu/scratch.h"

#include <cstdlib>

#include "kernels/cpu/per_thread.h"
#if defined(_WIN32)
#include <malloc.h>  // _aligned_malloc: Windows' C runtime has no aligned_alloc
#endif

namespace kiln::kernels {
namespace {

// 64-byte aligned blocks (kernels/ stays below lib/, so not lib/common/platform's AlignedAlloc).
void* Alloc64(size_t bytes) {
#if defined(_WIN32)
  return _aligned_malloc(bytes, 64);
#else
  return std::aligned_alloc(64, bytes);
#endif
}
void Free64(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

struct Slots {
  void* buf[kScratchSlots] = {};
  size_t size[kScratchSlots] = {};
  ~Slots() {
    for (void* p : buf) Free64(p);
  }
};

}  // namespace

void* ThreadScratch(int slot, size_t bytes) {
  Slots& slots = PerThread<Slots>();
  if (bytes > slots.size[slot]) {
    // Grow by at least half, in whole cache lines, so a slowly growing request reallocates rarely.
    size_t grown = slots.size[slot] + slots.size[slot] / 2;
    if (grown < bytes) grown = bytes;
    grown = (grown + 63) & ~size_t{63};
    Free64(slots.buf[slot]);
    slots.buf[slot] = Alloc64(grown);
    if (slots.buf[slot] == nullptr) std::abort();
    slots.size[slot] = grown;
  }
  return slots.buf[slot];
}

}  // namespace kiln::kernels
