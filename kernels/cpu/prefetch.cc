#include "kernels/cpu/prefetch.h"

#include <atomic>

namespace kiln {
namespace {

std::atomic<bool> g_prefetch_one_token_stream{false};
std::atomic<bool> g_prefetch_kv_into_l1{false};

}  // namespace

void SetPrefetchOneTokenStream(bool on) {
  g_prefetch_one_token_stream.store(on, std::memory_order_relaxed);
}

bool PrefetchOneTokenStream() {
  return g_prefetch_one_token_stream.load(std::memory_order_relaxed);
}

void SetPrefetchKvIntoL1(bool on) { g_prefetch_kv_into_l1.store(on, std::memory_order_relaxed); }

bool PrefetchKvIntoL1() { return g_prefetch_kv_into_l1.load(std::memory_order_relaxed); }

void SetPrefetchForCore(bool amd, int x86_family) {
  const bool zen5_or_later = amd && x86_family >= 0x1A;
  SetPrefetchOneTokenStream(zen5_or_later);
  SetPrefetchKvIntoL1(zen5_or_later);
}

}  // namespace kiln
