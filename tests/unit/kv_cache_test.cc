// KvCache unit tests with exact block ids and reference counts: append, fork, copy-on-write,
// truncate, free, prefix hits and misses, eviction order, exhaustion, flat tables.
#include "lib/kv/kv_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int kBs = 4;

std::unique_ptr<KvCache> MakeCache(int32_t num_blocks) {
  auto layout = KvLayout::Gqa(2, 2, 4, GgmlType::kF32, kBs);
  EXPECT_TRUE(layout.ok()) << layout.status();
  auto cache = KvCache::Create(*layout, {.num_blocks = num_blocks});
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

std::vector<BlockId> Table(const KvCache& c, SeqId s) {
  auto t = c.BlockTable(s);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::vector<BlockId>(t->begin(), t->end());
}

std::vector<int32_t> Iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(KvCacheTest, AppendForkCopyOnWriteTruncateFree) {
  auto cache = MakeCache(8);  // usable blocks 1..7
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  std::vector<KvSlot> slots(6);
  ASSERT_TRUE(c.AppendSlots(a, Iota(6), slots).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2));
  EXPECT_THAT(slots, ElementsAre(KvSlot{1, 0}, KvSlot{1, 1}, KvSlot{1, 2}, KvSlot{1, 3},
                                 KvSlot{2, 0}, KvSlot{2, 1}));
  EXPECT_EQ(c.RefCount(1), 1);
  EXPECT_EQ(c.RefCount(2), 1);
  // Mark the data of block 2 so the copy can be checked.
  *reinterpret_cast<float*>(c.KeyRow(KvSlot{2, 1}, 1, 1)) = 42.0f;

  // Fork shares every block.
  auto b = c.Fork(a);
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(Table(c, *b), ElementsAre(1, 2));
  EXPECT_EQ(c.RefCount(1), 2);
  EXPECT_EQ(c.RefCount(2), 2);
  EXPECT_EQ(c.Counters().blocks_used, 2);

  // Writing into the shared partial last block copies it first.
  std::vector<KvSlot> one(1);
  ASSERT_TRUE(c.AppendSlots(*b, {{100}}, one).ok());
  EXPECT_THAT(Table(c, *b), ElementsAre(1, 3));
  EXPECT_EQ(one[0], (KvSlot{3, 2}));
  EXPECT_EQ(c.RefCount(1), 2);
  EXPECT_EQ(c.RefCount(2), 1);
  EXPECT_EQ(c.RefCount(3), 1);
  EXPECT_EQ(*reinterpret_cast<float*>(c.KeyRow(KvSlot{3, 1}, 1, 1)), 42.0f);
  EXPECT_EQ(c.Counters().cow_copies, 1);

  // `a` is the only holder of block 2 now: it writes in place.
  ASSERT_TRUE(c.AppendSlots(a, {{6, 7}}, std::span<KvSlot>(slots).first(2)).ok());
  EXPECT_EQ(slots[0], (KvSlot{2, 2}));
  EXPECT_EQ(slots[1], (KvSlot{2, 3}));
  ASSERT_TRUE(c.AppendSlots(a, {{8}}, one).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2, 4));
  EXPECT_EQ(one[0], (KvSlot{4, 0}));
  EXPECT_EQ(*c.Length(a), 9);

  // Truncate releases the blocks past the new length, last first (free list is LIFO).
  ASSERT_TRUE(c.Truncate(a, 3).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1));
  EXPECT_EQ(*c.Length(a), 3);
  EXPECT_EQ(c.RefCount(2), 0);
  EXPECT_EQ(c.RefCount(4), 0);
  const auto counters = c.Counters();
  EXPECT_EQ(counters.blocks_used, 2);  // 1 (a, b) and 3 (b)
  EXPECT_EQ(counters.blocks_free, 5);
  // Slot 3 of block 1 is shared: `a` appends there only after a copy; the copy takes block 2,
  // the most recently freed.
  ASSERT_TRUE(c.AppendSlots(a, {{50}}, one).ok());
  EXPECT_EQ(one[0], (KvSlot{2, 3}));
  EXPECT_THAT(Table(c, a), ElementsAre(2));
  EXPECT_EQ(c.RefCount(1), 1);

  ASSERT_TRUE(c.Free(*b).ok());
  EXPECT_EQ(c.RefCount(1), 0);
  EXPECT_EQ(c.RefCount(3), 0);
  EXPECT_FALSE(c.Contains(*b));
  ASSERT_TRUE(c.Free(a).ok());
  EXPECT_EQ(c.Counters().blocks_free, 7);
  EXPECT_EQ(c.Counters().blocks_used, 0);
  EXPECT_TRUE(c.CheckInvariants().ok());
}

// The host pool is tile-major (kv_layout.h), so a sequence's K/V is one run of memory only when
// its blocks are consecutive: they are on a fresh cache and again after a Free.
TEST(KvCacheTest, BlocksAreHandedOutInOrderAgainAfterAFree) {
  auto cache = MakeCache(16);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  for (int32_t i = 0; i < 6; ++i) ASSERT_TRUE(c.AppendSlots(a, Iota(kBs, 100 * i)).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2, 3, 4, 5, 6));
  ASSERT_TRUE(c.Free(a).ok());
  const SeqId b = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(b, Iota(3 * kBs, 1000)).ok());
  ASSERT_TRUE(c.AppendSlots(b, Iota(3 * kBs, 2000)).ok());
  EXPECT_THAT(Table(c, b), ElementsAre(1, 2, 3, 4, 5, 6));
  // A truncated tail comes back in order too.
  ASSERT_TRUE(c.Truncate(b, 2 * kBs).ok());
  ASSERT_TRUE(c.AppendSlots(b, Iota(4 * kBs, 3000)).ok());
  EXPECT_THAT(Table(c, b), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(KvCacheTest, PrefixHitMissAndExtraKey) {
  auto cache = MakeCache(16);
  KvCache& c = *cache;
  const std::vector<int32_t> prompt = Iota(10);  // 2 full blocks + 2 tokens
  const SeqId a = c.CreateSequence(/*extra_key=*/7);
  ASSERT_TRUE(c.AppendSlots(a, prompt).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2, 3));
  // Nothing is cached before the K/V are computed.
  const SeqId early = c.CreateSequence(7);
  EXPECT_EQ(*c.AttachCachedPrefix(early, prompt), 0);
  ASSERT_TRUE(c.MarkComputed(a, 5).ok());  // block 1 full and computed
  EXPECT_TRUE(c.BlockHasHash(1));
  EXPECT_FALSE(c.BlockHasHash(2));
  ASSERT_TRUE(c.MarkComputed(a, 10).ok());
  EXPECT_TRUE(c.BlockHasHash(2));
  EXPECT_FALSE(c.BlockHasHash(3));  // partial block: never cached

  // Hit: the two full blocks, by reference.
  const SeqId b = c.CreateSequence(7);
  EXPECT_EQ(*c.AttachCachedPrefix(b, prompt), 8);
  EXPECT_THAT(Table(c, b), ElementsAre(1, 2));
  EXPECT_EQ(c.RefCount(1), 2);
  EXPECT_EQ(c.RefCount(2), 2);
  EXPECT_EQ(*c.Length(b), 8);
  EXPECT_EQ(*c.NumComputed(b), 8);
  EXPECT_THAT(*c.Tokens(b), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));

  // Partial hit: the second block differs.
  std::vector<int32_t> other = prompt;
  other[5] = 99;
  const SeqId d = c.CreateSequence(7);
  EXPECT_EQ(*c.AttachCachedPrefix(d, other), 4);
  EXPECT_THAT(Table(c, d), ElementsAre(1));
  // Miss: first block differs, or a different extra key.
  other[0] = 99;
  const SeqId e = c.CreateSequence(7);
  EXPECT_EQ(*c.AttachCachedPrefix(e, other), 0);
  EXPECT_THAT(Table(c, e), IsEmpty());
  const SeqId f = c.CreateSequence(8);
  EXPECT_EQ(*c.AttachCachedPrefix(f, prompt), 0);
  // Fewer tokens than a block: nothing to look up.
  const SeqId g = c.CreateSequence(7);
  EXPECT_EQ(*c.AttachCachedPrefix(g, std::span(prompt).first(3)), 0);
  // Only on an empty sequence.
  EXPECT_EQ(c.AttachCachedPrefix(b, prompt).status().code(), absl::StatusCode::kFailedPrecondition);

  const auto counters = c.Counters();
  EXPECT_EQ(counters.prefix_lookups, 6);  // the refused call does not count
  EXPECT_EQ(counters.prefix_query_tokens, 10 * 5 + 3);
  EXPECT_EQ(counters.prefix_hit_tokens, 12);
  EXPECT_TRUE(c.CheckInvariants().ok()) << c.CheckInvariants();
}

TEST(KvCacheTest, ReleasedCachedBlocksStayResidentAndEvictTailFirst) {
  auto cache = MakeCache(8);  // 7 usable
  KvCache& c = *cache;
  const std::vector<int32_t> prompt = Iota(12, 100);  // exactly 3 blocks
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, prompt).ok());
  ASSERT_TRUE(c.MarkComputed(a, 12).ok());
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2, 3));
  ASSERT_TRUE(c.Free(a).ok());
  // All three stay cached; the tail entered the LRU first.
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(3, 2, 1));
  auto counters = c.Counters();
  EXPECT_EQ(counters.blocks_cached, 3);
  EXPECT_EQ(counters.blocks_free, 4);

  // Reattach: blocks leave the LRU.
  const SeqId b = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(b, prompt), 12);
  EXPECT_THAT(Table(c, b), ElementsAre(1, 2, 3));
  EXPECT_THAT(c.CachedBlocksLruOrder(), IsEmpty());
  ASSERT_TRUE(c.Free(b).ok());
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(3, 2, 1));

  // Plain free blocks are used before any cached block is evicted.
  const SeqId x = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(x, Iota(16)).ok());
  EXPECT_THAT(Table(c, x), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(c.Counters().evictions, 0);
  // Now evictions: tail of the chain (3) first, then 2.
  ASSERT_TRUE(c.AppendSlots(x, Iota(4)).ok());
  EXPECT_THAT(Table(c, x), ElementsAre(4, 5, 6, 7, 3));
  EXPECT_EQ(c.Counters().evictions, 1);
  EXPECT_FALSE(c.BlockHasHash(3));
  ASSERT_TRUE(c.AppendSlots(x, Iota(1)).ok());
  EXPECT_THAT(Table(c, x), ElementsAre(4, 5, 6, 7, 3, 2));
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(1));
  // The chain still hits its first block only.
  const SeqId y = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(y, prompt), 4);
  EXPECT_THAT(Table(c, y), ElementsAre(1));
  EXPECT_TRUE(c.CheckInvariants().ok());
}

TEST(KvCacheTest, LruIsLeastRecentlyReleasedFirst) {
  auto cache = MakeCache(10);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  const SeqId b = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(8, 0)).ok());   // blocks 1, 2
  ASSERT_TRUE(c.AppendSlots(b, Iota(8, 50)).ok());  // blocks 3, 4
  ASSERT_TRUE(c.MarkComputed(a, 8).ok());
  ASSERT_TRUE(c.MarkComputed(b, 8).ok());
  ASSERT_TRUE(c.Free(b).ok());
  ASSERT_TRUE(c.Free(a).ok());
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(4, 3, 2, 1));
  // Touch b's chain again: it becomes most recent.
  const SeqId b2 = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(b2, Iota(8, 50)), 8);
  ASSERT_TRUE(c.Free(b2).ok());
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(2, 1, 4, 3));
  // Fill the 5 free blocks, then two evictions take a's chain, tail first.
  const SeqId x = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(x, Iota(5 * kBs + 2 * kBs)).ok());
  EXPECT_THAT(Table(c, x), ElementsAre(5, 6, 7, 8, 9, 2, 1));
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(4, 3));
  EXPECT_EQ(c.Counters().evictions, 2);
}

TEST(KvCacheTest, TruncateIntoCachedBlockCopiesBeforeWriting) {
  auto cache = MakeCache(8);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(8)).ok());
  ASSERT_TRUE(c.MarkComputed(a, 8).ok());
  ASSERT_TRUE(c.Truncate(a, 6).ok());  // rollback into cached block 2
  EXPECT_EQ(*c.NumComputed(a), 6);
  EXPECT_THAT(Table(c, a), ElementsAre(1, 2));
  std::vector<KvSlot> one(1);
  ASSERT_TRUE(c.AppendSlots(a, {{77}}, one).ok());
  // Block 2 holds hashed (immutable) content: written through a copy, 2 stays cached.
  EXPECT_THAT(Table(c, a), ElementsAre(1, 3));
  EXPECT_EQ(one[0], (KvSlot{3, 2}));
  EXPECT_EQ(c.RefCount(2), 0);
  EXPECT_THAT(c.CachedBlocksLruOrder(), ElementsAre(2));
  const SeqId b = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(b, Iota(8)), 8);
  EXPECT_THAT(Table(c, b), ElementsAre(1, 2));
  EXPECT_TRUE(c.CheckInvariants().ok());
}

TEST(KvCacheTest, PrepareOverwriteCopiesSharedBlocksOnly) {
  auto cache = MakeCache(8);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(7)).ok());  // blocks 1, 2
  ASSERT_TRUE(c.MarkComputed(a, 2).ok());
  auto slot = c.PrepareOverwrite(a, 5, 500);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(*slot, (KvSlot{2, 1}));  // sole holder: in place
  EXPECT_EQ((*c.Tokens(a))[5], 500);
  auto b = c.Fork(a);
  ASSERT_TRUE(b.ok());
  slot = c.PrepareOverwrite(*b, 2, 200);  // block 1 is shared
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(*slot, (KvSlot{3, 2}));
  EXPECT_THAT(Table(c, *b), ElementsAre(3, 2));
  EXPECT_EQ(c.RefCount(1), 1);
  EXPECT_EQ(c.RefCount(2), 2);
  EXPECT_EQ((*c.Tokens(a))[2], 2);
  EXPECT_EQ((*c.Tokens(*b))[2], 200);
  // Computed positions and positions past the end are not writable.
  EXPECT_EQ(c.PrepareOverwrite(a, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.PrepareOverwrite(a, 7, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.CheckInvariants().ok());
}

TEST(KvCacheTest, ExhaustionFailsCleanlyAndRetrySucceedsAfterFree) {
  auto cache = MakeCache(5);  // 4 usable
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(14)).ok());  // blocks 1..4, last one half full
  auto b = c.Fork(a);
  ASSERT_TRUE(b.ok());  // forks never allocate
  const auto before = c.Counters();
  // b's append needs a copy of shared block 4: cache full.
  absl::Status st = c.AppendSlots(*b, {{1}});
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("KV cache full"), std::string_view::npos);
  const SeqId d = c.CreateSequence();
  EXPECT_EQ(c.AppendSlots(d, Iota(1)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.PrepareOverwrite(*b, 13, 9).status().code(), absl::StatusCode::kResourceExhausted);
  // Nothing changed.
  EXPECT_EQ(*c.Length(*b), 14);
  EXPECT_EQ(*c.Length(d), 0);
  EXPECT_THAT(Table(c, *b), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ((*c.Tokens(*b))[13], 13);
  EXPECT_EQ(c.RefCount(4), 2);
  const auto after = c.Counters();
  EXPECT_EQ(after.blocks_used, before.blocks_used);
  EXPECT_EQ(after.blocks_free, 0);
  // a's own append into its shared last block also needs a copy; the exact need is reported.
  EXPECT_EQ(*c.BlocksNeededToAppend(a, 3), 2);
  EXPECT_EQ(*c.BlocksNeededToAppend(a, 0), 0);
  // Preempt: truncating b drops its references to blocks 3 and 4; freeing a then frees them
  // (4 first, so 3 is on top of the LIFO free list).
  ASSERT_TRUE(c.Truncate(*b, 8).ok());
  EXPECT_EQ(c.RefCount(3), 1);
  EXPECT_EQ(c.RefCount(4), 1);
  ASSERT_TRUE(c.Free(a).ok());  // frees 4 and 3
  ASSERT_TRUE(c.AppendSlots(d, Iota(1)).ok());
  EXPECT_THAT(Table(c, d), ElementsAre(3));
  EXPECT_TRUE(c.CheckInvariants().ok());
}

TEST(KvCacheTest, DuplicateComputedBlockStaysUnhashed) {
  auto cache = MakeCache(8);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  const SeqId b = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(8)).ok());  // 1, 2
  ASSERT_TRUE(c.AppendSlots(b, Iota(8)).ok());  // 3, 4: same content, computed independently
  ASSERT_TRUE(c.MarkComputed(a, 8).ok());
  ASSERT_TRUE(c.MarkComputed(b, 8).ok());
  EXPECT_TRUE(c.BlockHasHash(1));
  EXPECT_FALSE(c.BlockHasHash(3));
  EXPECT_FALSE(c.BlockHasHash(4));
  ASSERT_TRUE(c.Free(b).ok());
  EXPECT_EQ(c.Counters().blocks_free, 5);  // 3 and 4 are plain free blocks
  const SeqId d = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(d, Iota(8)), 8);
  EXPECT_THAT(Table(c, d), ElementsAre(1, 2));
}

TEST(KvCacheTest, BlockPoolLookupVerifiesTokensParentAndKey) {
  auto layout = KvLayout::Gqa(1, 1, 4, GgmlType::kF32, kBs);
  ASSERT_TRUE(layout.ok());
  auto pool = BlockPool::Create(*layout, 4);
  ASSERT_TRUE(pool.ok());
  BlockPool& p = **pool;
  const BlockId b = p.Allocate();
  EXPECT_EQ(b, 1);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const BlockHash parent = RootBlockHash(5, 0);
  const BlockHash h = ChainBlockHash(parent, 5, tokens);
  ASSERT_TRUE(p.RegisterHash(b, h, parent, 5, tokens));
  EXPECT_EQ(p.Lookup(h, parent, 5, tokens), b);
  // A forged hash match (as a collision would look) is rejected by the stored data.
  EXPECT_EQ(p.Lookup(h, parent, 5, std::vector<int32_t>{1, 2, 3, 5}), kNullBlock);
  EXPECT_EQ(p.Lookup(h, parent, 6, tokens), kNullBlock);
  EXPECT_EQ(p.Lookup(h, RootBlockHash(5, 1), 5, tokens), kNullBlock);
  // Second registration of the same hash keeps the first block.
  const BlockId b2 = p.Allocate();
  EXPECT_FALSE(p.RegisterHash(b2, h, parent, 5, tokens));
  EXPECT_FALSE(p.has_hash(b2));
  EXPECT_TRUE(p.CheckInvariants().ok());
  // Chained hashes differ with the parent, the key, any token and the seed.
  EXPECT_NE(ChainBlockHash(parent, 5, std::vector<int32_t>{1, 2, 4, 3}), h);
  EXPECT_NE(ChainBlockHash(RootBlockHash(6, 0), 6, tokens), h);
  EXPECT_NE(ChainBlockHash(h, 5, tokens), h);
}

TEST(KvCacheTest, BuildTablesIsCsrAndReusesCapacity) {
  auto cache = MakeCache(16);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  const SeqId b = c.CreateSequence();
  const SeqId e = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(9)).ok());  // 1 2 3, last has 1
  ASSERT_TRUE(c.AppendSlots(b, Iota(8)).ok());  // 4 5, last has 4
  KvTables t;
  const std::vector<SeqId> batch = {b, e, a};
  ASSERT_TRUE(c.BuildTables(batch, &t).ok());
  EXPECT_THAT(t.indptr, ElementsAre(0, 2, 2, 5));
  EXPECT_THAT(t.indices, ElementsAre(4, 5, 1, 2, 3));
  EXPECT_THAT(t.last_page_len, ElementsAre(4, 0, 1));
  const int32_t* data = t.indices.data();
  ASSERT_TRUE(c.Truncate(a, 2).ok());
  ASSERT_TRUE(c.BuildTables(batch, &t).ok());
  EXPECT_EQ(t.indices.data(), data);  // no reallocation
  EXPECT_THAT(t.indices, ElementsAre(4, 5, 1));
  EXPECT_THAT(t.last_page_len, ElementsAre(4, 0, 2));
  const std::vector<SeqId> bad = {a, 12345};
  const absl::Status st = c.BuildTables(bad, &t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("seqs[1] = 12345"), std::string_view::npos) << st;
}

TEST(KvCacheTest, BadIdsAndRangesAreInvalidArgument) {
  auto cache = MakeCache(8);
  KvCache& c = *cache;
  const SeqId bad = 999;
  EXPECT_EQ(c.AppendSlots(bad, Iota(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Fork(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Truncate(bad, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Free(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Length(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.MarkComputed(bad, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AttachCachedPrefix(bad, Iota(4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SlotOf(bad, 0).status().code(), absl::StatusCode::kInvalidArgument);
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(5)).ok());
  EXPECT_EQ(c.Truncate(a, 6).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Truncate(a, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.MarkComputed(a, 6).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.MarkComputed(a, 3).ok());
  EXPECT_EQ(c.MarkComputed(a, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SlotOf(a, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*c.SlotOf(a, 4), (KvSlot{2, 0}));
  std::vector<KvSlot> wrong(2);
  EXPECT_EQ(c.AppendSlots(a, Iota(3), wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*c.Length(a), 5);
  ASSERT_TRUE(c.Free(a).ok());
  EXPECT_EQ(c.Free(a).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTest, PrefixCachingCanBeDisabled) {
  auto layout = KvLayout::Gqa(1, 1, 4, GgmlType::kF32, kBs);
  ASSERT_TRUE(layout.ok());
  auto cache = KvCache::Create(*layout, {.num_blocks = 8, .enable_prefix_caching = false});
  ASSERT_TRUE(cache.ok());
  KvCache& c = **cache;
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(8)).ok());
  ASSERT_TRUE(c.MarkComputed(a, 8).ok());
  EXPECT_FALSE(c.BlockHasHash(1));
  ASSERT_TRUE(c.Free(a).ok());
  EXPECT_EQ(c.Counters().blocks_cached, 0);
  EXPECT_EQ(c.Counters().blocks_free, 7);
  const SeqId b = c.CreateSequence();
  EXPECT_EQ(*c.AttachCachedPrefix(b, Iota(8)), 0);
  EXPECT_EQ(c.Counters().prefix_lookups, 1);
}

TEST(KvCacheTest, UtilizationCountsSharedBlocksOnce) {
  auto cache = MakeCache(16);
  KvCache& c = *cache;
  const SeqId a = c.CreateSequence();
  ASSERT_TRUE(c.AppendSlots(a, Iota(6)).ok());  // 2 blocks, 6 of 8 slots
  auto b = c.Fork(a);
  ASSERT_TRUE(b.ok());
  auto counters = c.Counters();
  EXPECT_EQ(counters.filled_slots, 6);
  EXPECT_EQ(counters.allocated_slots, 8);
  EXPECT_DOUBLE_EQ(counters.utilization, 0.75);
  EXPECT_EQ(counters.num_sequences, 2);
  EXPECT_EQ(counters.bytes_per_token, size_t{2} * 2 * 2 * 4 * 4);
  ASSERT_TRUE(c.AppendSlots(*b, Iota(3)).ok());  // copy of block 2 + one new block
  counters = c.Counters();
  EXPECT_EQ(counters.blocks_used, 4);
  EXPECT_EQ(counters.filled_slots, 4 + 2 + 4 + 1);
  EXPECT_DOUBLE_EQ(counters.utilization, 11.0 / 16.0);
}

// ---- Sliding-window groups (KvLayout::WithSlidingGroups): layers 0-2 sliding with a window of
// 8 positions, layer 3 global; blocks of 4 tokens, one layer per group: group 0 holds layer 3,
// groups 1-3 layers 0-2.
constexpr int32_t kWindow = 8;
constexpr int32_t kSlidingGroups = 3;

std::unique_ptr<KvCache> MakeSlidingCache(int32_t num_blocks, int32_t margin = 0) {
  auto plain = KvLayout::Gqa(4, 1, 8, GgmlType::kF32, 4);
  EXPECT_TRUE(plain.ok());
  const std::vector<uint8_t> sliding = {1, 1, 1, 0};
  auto layout = plain->WithSlidingGroups(sliding, kWindow);
  EXPECT_TRUE(layout.ok()) << layout.status();
  KvCacheOptions options;
  options.num_blocks = num_blocks;
  options.sliding_release_margin = margin;
  auto cache = KvCache::Create(*layout, options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

TEST(KvCacheSlidingTest, LayoutGroupsSplitTheLayers) {
  auto plain = KvLayout::Gqa(4, 2, 8, GgmlType::kF16, 4);
  ASSERT_TRUE(plain.ok());
  const std::vector<uint8_t> sliding = {1, 0, 1, 1};
  auto g = plain->WithSlidingGroups(sliding, 8);
  ASSERT_TRUE(g.ok());
  // One global layer: groups of one layer, the global one first.
  EXPECT_EQ(g->n_groups(), 4);
  EXPECT_EQ(g->layers_per_group(), 1);
  EXPECT_EQ(g->first_sliding_group(), 1);
  EXPECT_FALSE(g->group_is_sliding(0));
  EXPECT_TRUE(g->group_is_sliding(3));
  EXPECT_EQ(g->layer_group(1), 0);
  EXPECT_EQ(g->layer_group(0), 1);
  EXPECT_EQ(g->layer_group(3), 3);
  EXPECT_EQ(g->bytes_per_token(), plain->bytes_per_token());
  EXPECT_EQ(g->block_data_bytes(), plain->block_data_bytes() / 4);
  // Tiles are numbered inside the layer's group: every layer is its group's first.
  EXPECT_EQ(g->KeyTileIndex(1, 0), 0u);
  EXPECT_EQ(g->KeyTileIndex(3, 1), 1u);
  EXPECT_EQ(g->ValueTileIndex(3, 1), 3u);
  EXPECT_EQ(g->tiles_per_block(), 4);
  // Refusals: all sliding, all global, wrong count, a second split.
  EXPECT_FALSE(plain->WithSlidingGroups(std::vector<uint8_t>{1, 1, 1, 1}, 8).ok());
  EXPECT_FALSE(plain->WithSlidingGroups(std::vector<uint8_t>{0, 0, 0, 0}, 8).ok());
  EXPECT_FALSE(plain->WithSlidingGroups(std::vector<uint8_t>{1, 0}, 8).ok());
  EXPECT_FALSE(plain->WithSlidingGroups(sliding, 0).ok());
  EXPECT_FALSE(g->WithSlidingGroups(sliding, 8).ok());
}

// Group sizes: the smaller kind's layer count, widened to at most KvLayout::kMaxGroups groups.
TEST(KvCacheSlidingTest, LayoutGroupSizes) {
  struct Case {
    int32_t n_layers;
    std::vector<int32_t> global;  // the global layers
    int32_t per_group, n_groups, first_sliding;
  };
  const Case cases[] = {
      {18, {5, 11, 17}, 3, 6, 1},      // gemma3-270m: 3 global, 15 sliding
      {26, {5, 11, 17, 23}, 4, 7, 1},  // gemma3-1b: 4 and 22, the last sliding group half used
      {21, {0}, 3, 8, 1},              // 1 and 20: groups of one would make 21
      {12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 2, 6, 5},  // more global layers than sliding ones
  };
  for (const Case& c : cases) {
    auto plain = KvLayout::Gqa(c.n_layers, 1, 32, GgmlType::kF16, 16);
    ASSERT_TRUE(plain.ok());
    std::vector<uint8_t> sliding(static_cast<size_t>(c.n_layers), 1);
    for (int32_t l : c.global) sliding[static_cast<size_t>(l)] = 0;
    auto g = plain->WithSlidingGroups(sliding, 64);
    ASSERT_TRUE(g.ok()) << g.status();
    SCOPED_TRACE(::testing::Message() << c.n_layers << " layers");
    EXPECT_EQ(g->layers_per_group(), c.per_group);
    EXPECT_EQ(g->n_groups(), c.n_groups);
    EXPECT_EQ(g->first_sliding_group(), c.first_sliding);
    EXPECT_LE(g->n_groups(), KvLayout::kMaxGroups);
    // Every layer in a group of its kind, at most per_group layers per group, distinct tiles.
    std::vector<int32_t> per_group(static_cast<size_t>(g->n_groups()), 0);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      EXPECT_EQ(g->group_is_sliding(g->layer_group(l)), sliding[static_cast<size_t>(l)] != 0);
      EXPECT_EQ(g->KeyTileIndex(l, 0) / 2,
                static_cast<size_t>(per_group[static_cast<size_t>(g->layer_group(l))]++));
    }
    for (int32_t n : per_group) EXPECT_LE(n, c.per_group);
  }
}

// Decoding one token at a time, a sliding block is released once every present and future
// token's window (rounded down to the kernels' 16 rows) has left it; the global group keeps all.
TEST(KvCacheSlidingTest, ReleasesBlocksThatLeaveEveryWindow) {
  auto cache = MakeSlidingCache(128);
  const SeqId seq = cache->CreateSequence();
  const std::vector<int32_t> tokens = Iota(100);
  for (int32_t n = 1; n <= 100; ++n) {
    ASSERT_TRUE(cache->AppendSlots(seq, std::span(tokens).subspan(n - 1, 1)).ok());
    ASSERT_TRUE(cache->MarkComputed(seq, n).ok());
    // The first window row of the next token is n - 7; below its multiple of 16, whole blocks go.
    const int32_t released = std::max(0, n - kWindow + 1) / 16 * 16 / 4;
    ASSERT_EQ(cache->Counters().sliding_blocks_released, kSlidingGroups * released) << "n = " << n;
    ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  }
  const KvCacheCounters c = cache->Counters();
  EXPECT_EQ(c.sliding_blocks_released, kSlidingGroups * 20);  // rows [0, 80) of 100
  EXPECT_EQ(c.sliding_blocks_used, kSlidingGroups * 5);
  EXPECT_EQ(c.blocks_used, 25 + kSlidingGroups * 5);
  EXPECT_EQ(c.kv_bytes_in_use, (25 + kSlidingGroups * 5) * c.block_bytes);
  EXPECT_EQ(*cache->SlidingBlocksReleased(seq), 20);
  for (int32_t g = 1; g <= kSlidingGroups; ++g) {
    auto table = cache->BlockTable(seq, g);
    ASSERT_TRUE(table.ok());
    ASSERT_EQ(table->size(), 25u);
    EXPECT_EQ((*table)[19], kNullBlock);
    EXPECT_NE((*table)[20], kNullBlock);
    // Every token's slot names its block in every group; released ones are the null block.
    EXPECT_EQ(cache->SlotOf(seq, 99)->group_block(g), (*table)[24]);
    EXPECT_EQ(cache->SlotOf(seq, 0)->group_block(g), kNullBlock);
  }
  EXPECT_FALSE(cache->BlockTable(seq, 4).ok());
  KvTables tables;
  ASSERT_TRUE(cache->BuildTables(std::vector<SeqId>{seq}, &tables).ok());
  ASSERT_EQ(tables.group_indices.size(), 3u);
  EXPECT_EQ(tables.indices_of(3).size(), tables.indices.size());
}

// The groups share one pool: blocks released by the sliding groups serve the global one. 100
// tokens would take 100 blocks with every group's kept; 48 hold them here.
TEST(KvCacheSlidingTest, ReleasedBlocksServeEveryGroup) {
  auto cache = MakeSlidingCache(48);
  const SeqId seq = cache->CreateSequence();
  const std::vector<int32_t> tokens = Iota(100);
  for (int32_t n = 1; n <= 100; ++n) {
    ASSERT_TRUE(cache->AppendSlots(seq, std::span(tokens).subspan(n - 1, 1)).ok()) << "n = " << n;
    ASSERT_TRUE(cache->MarkComputed(seq, n).ok());
  }
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  const KvCacheCounters c = cache->Counters();
  EXPECT_EQ(c.blocks_used, 25 + kSlidingGroups * 5);
  EXPECT_GT(c.evictions, 0);  // released blocks were cached, then taken for new ones
  // Without release the same pool is full after 44 tokens (11 blocks of 4 groups, + the null).
  auto plain = KvLayout::Gqa(4, 1, 8, GgmlType::kF32, 4);
  ASSERT_TRUE(plain.ok());
  auto grouped = plain->WithSlidingGroups(std::vector<uint8_t>{1, 1, 1, 0}, 100000);
  ASSERT_TRUE(grouped.ok());
  auto kept = KvCache::Create(*grouped, KvCacheOptions{.num_blocks = 48});
  ASSERT_TRUE(kept.ok());
  const SeqId other = (*kept)->CreateSequence();
  EXPECT_TRUE((*kept)->AppendSlots(other, Iota(44)).ok());
  const absl::Status full = (*kept)->AppendSlots(other, Iota(1));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
}

// A rewind into the window of released blocks is refused and changes nothing; one inside the
// kept blocks (or the margin) works. Forks share every group's blocks.
TEST(KvCacheSlidingTest, TruncateBelowReleasedIsRefusedAndForkShares) {
  for (int32_t margin : {0, 16}) {
    auto cache = MakeSlidingCache(128, margin);
    const SeqId seq = cache->CreateSequence();
    ASSERT_TRUE(cache->AppendSlots(seq, Iota(60)).ok());
    ASSERT_TRUE(cache->MarkComputed(seq, 60).ok());
    // Next token 60: window from 53, rounded to 48 (32 with the margin of 16): 12 (8) blocks.
    const int32_t released = margin == 0 ? 12 : 8;
    EXPECT_EQ(cache->Counters().sliding_blocks_released, kSlidingGroups * released);
    // The deepest rewind whose window starts at or above the released rows (48, with the margin
    // 32): to 55 (its window from 48) or 40 (from 32); four tokens deeper is refused.
    const int32_t deepest = margin == 0 ? 55 : 40;
    const absl::Status deep = cache->Truncate(seq, deepest - 4);
    EXPECT_EQ(deep.code(), absl::StatusCode::kFailedPrecondition) << deep;
    EXPECT_EQ(*cache->Length(seq), 60);
    EXPECT_TRUE(cache->Truncate(seq, deepest).ok());
    ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
    auto fork = cache->Fork(seq);
    ASSERT_TRUE(fork.ok());
    const int64_t copies = cache->Counters().cow_copies;
    ASSERT_TRUE(cache->AppendSlots(*fork, Iota(3, 7)).ok());
    ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
    // A shared partial last block is copied in every group.
    EXPECT_EQ(cache->Counters().cow_copies, copies + (deepest % 4 != 0 ? 1 + kSlidingGroups : 0));
    for (int32_t g = 0; g <= kSlidingGroups; ++g) {
      EXPECT_NE(cache->BlockTable(*fork, g)->back(), cache->BlockTable(seq, g)->back());
    }
    ASSERT_TRUE(cache->Free(seq).ok());
    ASSERT_TRUE(cache->Free(*fork).ok());
    const KvCacheCounters c = cache->Counters();
    EXPECT_EQ(c.blocks_used, 0);
    EXPECT_EQ(c.sliding_blocks_used, 0);
    ASSERT_TRUE(cache->CheckInvariants().ok());
  }
}

// A prefix hit counts only as far as every group still finds its blocks, the sliding ones their
// window's.
TEST(KvCacheSlidingTest, PrefixHitNeedsTheSlidingWindow) {
  const std::vector<int32_t> tokens = Iota(80);
  {  // Roomy: released sliding blocks stay cached, the whole prefix hits.
    auto cache = MakeSlidingCache(128);
    const SeqId a = cache->CreateSequence();
    ASSERT_TRUE(cache->AppendSlots(a, tokens).ok());
    ASSERT_TRUE(cache->MarkComputed(a, 80).ok());
    EXPECT_EQ(cache->Counters().blocks_cached, kSlidingGroups * 16);
    const SeqId b = cache->CreateSequence();
    EXPECT_EQ(*cache->AttachCachedPrefix(b, std::span(tokens).first(79)), 76);
    // Only the window's blocks are attached: next token 76 reads from 69 -> row 64, block 16.
    for (int32_t g = 1; g <= kSlidingGroups; ++g) {
      auto table = cache->BlockTable(b, g);
      ASSERT_EQ(table->size(), 19u);
      EXPECT_EQ((*table)[15], kNullBlock);
      EXPECT_NE((*table)[16], kNullBlock);
    }
    ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  }
  {  // The released sliding blocks evicted: a hit whose window needed them is gone.
    auto cache = MakeSlidingCache(128);
    const SeqId a = cache->CreateSequence();
    ASSERT_TRUE(cache->AppendSlots(a, tokens).ok());
    ASSERT_TRUE(cache->MarkComputed(a, 80).ok());  // releases blocks 0-15 of groups 1-3
    ASSERT_TRUE(cache->Free(a).ok());
    EXPECT_EQ(cache->Counters().blocks_cached, 80);
    // 47 free blocks, then the LRU: the 48 released sliding blocks, then the global block 19
    // (Free releases the last position first).
    const SeqId filler = cache->CreateSequence();
    ASSERT_TRUE(cache->AppendSlots(filler, Iota(4 * 24, 5000)).ok());
    EXPECT_EQ(cache->Counters().evictions, 49);
    ASSERT_TRUE(cache->Free(filler).ok());
    // 60 tokens' last block needs sliding rows from 48 (block 12): no hit length is usable.
    const SeqId b = cache->CreateSequence();
    EXPECT_EQ(*cache->AttachCachedPrefix(b, std::span(tokens).first(60)), 0);
    // 79 tokens' window (blocks 16-18) was never released: the hit stays whole.
    const SeqId c = cache->CreateSequence();
    EXPECT_EQ(*cache->AttachCachedPrefix(c, std::span(tokens).first(79)), 76);
    ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  }
}

// K/V bytes held at 4,096 tokens in gemma3-270m's layout (18 layers, 1 KV head of 256, f16,
// window 512, every 6th layer global), with and without releasing sliding blocks.
TEST(KvCacheSlidingTest, Gemma3_270mBytesAt4096Tokens) {
  auto plain = KvLayout::Gqa(18, 1, 256, GgmlType::kF16, 16);
  ASSERT_TRUE(plain.ok());
  std::vector<uint8_t> sliding(18, 1);
  for (int l = 5; l < 18; l += 6) sliding[l] = 0;
  auto grouped = plain->WithSlidingGroups(sliding, 512);
  ASSERT_TRUE(grouped.ok());
  EXPECT_EQ(grouped->n_groups(), 6);  // groups of 3 layers: 1 global, 5 sliding
  size_t bytes[2] = {0, 0};
  for (int with_release = 0; with_release < 2; ++with_release) {
    KvCacheOptions options;
    options.num_blocks = with_release ? 640 : 260;
    auto cache = KvCache::Create(with_release ? *grouped : *plain, options);
    ASSERT_TRUE(cache.ok());
    const SeqId seq = (*cache)->CreateSequence();
    const std::vector<int32_t> tokens = Iota(4096);
    for (int32_t at = 0; at < 4096; at += 512) {  // prefill in chunks of 512
      ASSERT_TRUE((*cache)->AppendSlots(seq, std::span(tokens).subspan(at, 512)).ok());
      ASSERT_TRUE((*cache)->MarkComputed(seq, at + 512).ok());
    }
    bytes[with_release] = (*cache)->Counters().kv_bytes_in_use;
  }
  // Without: 18 layers x 4096 rows. With: 3 x 4096 + 15 x 512 (rows from 3584, the window of
  // token 4096 (from 3585) rounded down to 16).
  const size_t row = 2 * 256 * 2;  // K and V of one layer, f16
  EXPECT_EQ(bytes[0], 18 * 4096 * row);
  EXPECT_EQ(bytes[1], (3 * 4096 + 15 * 512) * row);
  std::printf(
      "gemma3-270m layout, 4096 tokens: K/V in use %zu bytes without release, %zu with "
      "(%.2fx less)\n",
      bytes[0], bytes[1], static_cast<double>(bytes[0]) / static_cast<double>(bytes[1]));
}

}  // namespace
}  // namespace kiln
