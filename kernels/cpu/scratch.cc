#include "kernels/cpu/scratch.h"

#include <cstdlib>

namespace kiln::kernels {
namespace {

struct Slots {
  void* buf[kScratchSlots] = {};
  size_t size[kScratchSlots] = {};
  ~Slots() {
    for (void* p : buf) std::free(p);
  }
};

}  // namespace

void* ThreadScratch(int slot, size_t bytes) {
  thread_local Slots slots;
  if (bytes > slots.size[slot]) {
    // Grow by at least half, in whole cache lines, so a slowly growing request reallocates rarely.
    size_t grown = slots.size[slot] + slots.size[slot] / 2;
    if (grown < bytes) grown = bytes;
    grown = (grown + 63) & ~size_t{63};
    std::free(slots.buf[slot]);
    slots.buf[slot] = std::aligned_alloc(64, grown);
    if (slots.buf[slot] == nullptr) std::abort();
    slots.size[slot] = grown;
  }
  return slots.buf[slot];
}

}  // namespace kiln::kernels
