// Paged KV cache benchmark: operation rates, slot utilization against a contiguous max-length
// allocation, and the cost of a prefix-cache hit per block.
//
//   kv_bench [repetitions=7]
//
// Every figure is measured `repetitions` times and printed as median [min - max]. Metadata
// operations use a small layout (1 layer, 1 KV head, head_dim 8, f16: 256-byte blocks) so the
// numbers are the cache's bookkeeping; copy-on-write is also measured with SmolLM2-135M's layout
// (30 layers, 3 KV heads, head_dim 64, f16: 360 KiB blocks), where it is one memcpy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "lib/kv/kv_cache.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

struct Stat {
  double median, min, max;
};

Stat Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

void Print(const char* what, const Stat& s, const char* unit) {
  std::printf("  %-52s %10.1f %s  [%.1f - %.1f]\n", what, s.median, unit, s.min, s.max);
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "kv_bench: %s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}
void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "kv_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::unique_ptr<KvCache> SmallCache(int32_t num_blocks) {
  const KvLayout layout = Check(KvLayout::Gqa(1, 1, 8, GgmlType::kF16, 16));
  return Check(KvCache::Create(layout, {.num_blocks = num_blocks}));
}

double NsPer(Clock::time_point t0, Clock::time_point t1, int64_t n) {
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

void BenchRates(int reps) {
  std::printf("Operation rates (ns per operation; 256 sequences, block size 16):\n");
  constexpr int kSeqs = 256;
  constexpr int kLen = 1024;  // 64 blocks per sequence
  std::vector<double> decode, prefill, fork, truncate, free_ns, tables, cow_small, cow_big;
  std::vector<int32_t> token = {7};
  std::vector<int32_t> chunk(kLen, 3);
  std::vector<KvSlot> slot(1);
  std::vector<KvSlot> chunk_slots(kLen);
  for (int r = 0; r < reps; ++r) {
    auto cache = SmallCache(kSeqs * (kLen / 16) * 2 + 8);
    std::vector<SeqId> seqs;
    for (int s = 0; s < kSeqs; ++s) seqs.push_back(cache->CreateSequence());
    // Decode-style: one token per call, round robin (a block allocation every 16th call).
    auto t0 = Clock::now();
    for (int i = 0; i < kLen; ++i) {
      for (SeqId s : seqs) Check(cache->AppendSlots(s, token, slot));
    }
    auto t1 = Clock::now();
    decode.push_back(NsPer(t0, t1, int64_t{kSeqs} * kLen));
    // BuildTables for the whole batch (256 sequences x 64 blocks), reused vectors.
    KvTables t;
    Check(cache->BuildTables(seqs, &t));
    t0 = Clock::now();
    for (int i = 0; i < 100; ++i) Check(cache->BuildTables(seqs, &t));
    t1 = Clock::now();
    tables.push_back(NsPer(t0, t1, 100));
    // Speculative rollback: append 8 draft tokens, truncate 5 of them.
    std::vector<int32_t> draft(8, 1);
    std::vector<KvSlot> draft_slots(8);
    t0 = Clock::now();
    for (SeqId s : seqs) {
      Check(cache->AppendSlots(s, draft, draft_slots));
      Check(cache->Truncate(s, kLen + 3));
    }
    t1 = Clock::now();
    truncate.push_back(NsPer(t0, t1, kSeqs));
    // Fork every sequence (64 shared blocks each), then free the forks.
    std::vector<SeqId> forks;
    forks.reserve(kSeqs);
    t0 = Clock::now();
    for (SeqId s : seqs) forks.push_back(Check(cache->Fork(s)));
    t1 = Clock::now();
    fork.push_back(NsPer(t0, t1, kSeqs));
    // Copy-on-write: the forks share a partial last block; one token each copies it.
    t0 = Clock::now();
    for (SeqId s : forks) Check(cache->AppendSlots(s, token, slot));
    t1 = Clock::now();
    cow_small.push_back(NsPer(t0, t1, kSeqs));
    t0 = Clock::now();
    for (SeqId s : forks) Check(cache->Free(s));
    for (SeqId s : seqs) Check(cache->Free(s));
    t1 = Clock::now();
    free_ns.push_back(NsPer(t0, t1, 2 * kSeqs));
    // Prefill-style: 1,024 tokens in one call.
    seqs.clear();
    for (int s = 0; s < kSeqs; ++s) seqs.push_back(cache->CreateSequence());
    t0 = Clock::now();
    for (SeqId s : seqs) Check(cache->AppendSlots(s, chunk, chunk_slots));
    t1 = Clock::now();
    prefill.push_back(NsPer(t0, t1, kSeqs));
  }
  Print("append 1 token (decode step)", Summarize(decode), "ns");
  Print("append 1,024 tokens in one call (prefill chunk)", Summarize(prefill), "ns");
  Print("append 8 draft tokens + truncate 5 (rollback)", Summarize(truncate), "ns");
  Print("fork a 64-block sequence", Summarize(fork), "ns");
  Print("copy-on-write append (256-byte blocks)", Summarize(cow_small), "ns");
  Print("free a 64-block sequence", Summarize(free_ns), "ns");
  Print("BuildTables, 256 sequences x 64 blocks", Summarize(tables), "ns");

  // Copy-on-write with a real model's block (SmolLM2-135M, f16): its 180 tiles of 2 KiB.
  const KvLayout big = Check(KvLayout::Gqa(30, 3, 64, GgmlType::kF16, 16));
  auto cache = Check(KvCache::Create(big, {.num_blocks = 2 * 64 + 4}));
  for (int r = 0; r < reps; ++r) {
    const SeqId base = cache->CreateSequence();
    Check(cache->AppendSlots(base, std::vector<int32_t>(8, 1)));
    const BlockId filled = Check(cache->SlotOf(base, 0)).block;
    for (int32_t t = 0; t < big.tiles_per_block(); ++t) {
      std::memset(cache->placement().Tile(filled, t), 1, big.tile_bytes());
    }
    std::vector<SeqId> forks;
    for (int i = 0; i < 64; ++i) forks.push_back(Check(cache->Fork(base)));
    const auto t0 = Clock::now();
    for (SeqId s : forks) Check(cache->AppendSlots(s, token, slot));
    const auto t1 = Clock::now();
    cow_big.push_back(NsPer(t0, t1, 64) / 1000.0);
    for (SeqId s : forks) Check(cache->Free(s));
    Check(cache->Free(base));
  }
  std::printf("  (SmolLM2-135M f16 block = %zu bytes)\n", big.block_bytes());
  Print("copy-on-write append (SmolLM2-135M block)", Summarize(cow_big), "us");
}

void BenchUtilization(int reps) {
  std::printf("\nUtilization, 1,000 sequences of uniform random length 1..4,096, block size 16:\n");
  std::vector<double> paged_util, contiguous_util, fit;
  for (int r = 0; r < reps; ++r) {
    std::mt19937_64 rng(1000 + r);
    std::vector<int32_t> lens(1000);
    int64_t tokens = 0;
    for (int32_t& l : lens) {
      l = 1 + static_cast<int32_t>(rng() % 4096);
      tokens += l;
    }
    auto cache = SmallCache(1000 * 256 + 1);
    std::vector<int32_t> ids;
    for (int32_t l : lens) {
      const SeqId s = cache->CreateSequence();
      ids.assign(l, 5);
      Check(cache->AppendSlots(s, ids));
    }
    const KvCacheCounters c = cache->Counters();
    paged_util.push_back(100.0 * c.utilization);
    // A contiguous allocator reserves max length (4,096 slots) per sequence.
    contiguous_util.push_back(100.0 * static_cast<double>(tokens) / (1000.0 * 4096.0));
    // With the paged pool's memory, a contiguous allocator fits this many sequences.
    fit.push_back(static_cast<double>(c.allocated_slots / 4096));
  }
  Print("paged: filled slots / allocated slots", Summarize(paged_util), "%");
  Print("contiguous max-length: filled / reserved", Summarize(contiguous_util), "%");
  Print("sequences a contiguous allocator fits in that memory", Summarize(fit), "of 1000");
}

void BenchPrefix(int reps) {
  std::printf("\nPrefix cache (4,096-token prompt = 256 blocks of 16):\n");
  constexpr int kTokens = 4096;
  std::vector<int32_t> prompt(kTokens);
  std::mt19937 rng(5);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 50000);
  std::vector<double> hit, miss, commit;
  for (int r = 0; r < reps; ++r) {
    auto cache = SmallCache(4 * 256 + 8);
    const SeqId a = cache->CreateSequence();
    Check(cache->AppendSlots(a, prompt));
    auto t0 = Clock::now();
    Check(cache->MarkComputed(a, kTokens));
    auto t1 = Clock::now();
    commit.push_back(NsPer(t0, t1, kTokens / 16));
    Check(cache->Free(a));  // all 256 blocks stay cached
    constexpr int kIters = 50;
    t0 = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      const SeqId s = cache->CreateSequence();
      if (Check(cache->AttachCachedPrefix(s, prompt)) != kTokens) std::exit(2);
      Check(cache->Free(s));
    }
    t1 = Clock::now();
    hit.push_back(NsPer(t0, t1, int64_t{kIters} * (kTokens / 16)));
    std::vector<int32_t> other = prompt;
    other[0] += 1;
    t0 = Clock::now();
    for (int i = 0; i < kIters * 100; ++i) {
      const SeqId s = cache->CreateSequence();
      if (Check(cache->AttachCachedPrefix(s, other)) != 0) std::exit(2);
      Check(cache->Free(s));
    }
    t1 = Clock::now();
    miss.push_back(NsPer(t0, t1, kIters * 100));
  }
  Print("hit: attach per block (hash + verify + ref)", Summarize(hit), "ns");
  Print("miss on the first block (create + lookup + free)", Summarize(miss), "ns");
  Print("MarkComputed: hash + register per block", Summarize(commit), "ns");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  std::printf("kv_bench: %d repetitions, median [min - max]\n\n", reps);
  kiln::BenchRates(reps);
  kiln::BenchUtilization(reps);
  kiln::BenchPrefix(reps);
  return 0;
}
