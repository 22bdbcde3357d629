#include "kernels/cpu/prefetch.h"

#include <atomic>

namespace kiln {
namespace {

std::atomic<bool> g_prefetch_one_token_stream{false};

}  // namespace

void SetPrefetchOneTokenStream(bool on) {
  g_prefetch_one_token_stream.store(on, std::memory_order_relaxed);
}

bool PrefetchOneTokenStream() {
  return g_prefetch_one_token_stream.load(std::memory_order_relaxed);
}

}  // namespace kiln
