// Randomized model-based test of KvCache against a plain reference: each reference sequence is a
// vector of tokens and of the per-token K/V "seed" that was written. Random operations (create
// with prefix reuse, append with data, fork, overwrite into possibly shared blocks, mark
// computed, truncate, free, preempt-and-retry on cache full) run on both; after every operation
// every sequence must read back exactly its data through its block table, every block's ref
// count must equal its number of holders, and no block may leak.
//
// K/V values are a pure function of (extra key, token prefix, element index), as real K/V are a
// function of the prefix, so a prefix-cache hit is correct exactly when the attached blocks
// read back the values the reference expects.
//
// A fourth case splits the layers into a sliding-window group (KvLayout::WithSlidingGroup):
// there the released sliding blocks are skipped when reading back, released only below every
// window, and a truncate is refused exactly when its window needs a released block.
//
// Operation count: $KILN_KV_RANDOM_OPS (default 100000) for the main GQA case; the f16, MLA and
// sliding cases run 30% of it. Release: ~1-3 s; ASan/UBSan: well under a minute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "lib/kv/kv_cache.h"

namespace kiln {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return x;
}

uint64_t RootSeed(uint64_t extra_key) { return Mix(extra_key + 0x1234567ULL); }
uint64_t NextSeed(uint64_t prev, int32_t token) {
  return Mix(prev ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9E3779B97F4A7C15ULL));
}

int64_t OpsFromEnv() {
  const char* env = std::getenv("KILN_KV_RANDOM_OPS");
  if (env == nullptr || *env == '\0') return 100000;
  return std::max<int64_t>(1, std::atoll(env));
}

struct Config {
  std::string name;
  bool mla;
  GgmlType type;
  int32_t block_size;
  int32_t num_blocks;  // including the null block
  double ops_fraction;
  int32_t window = 0;  // > 0: the layers `sliding` marks attend to this window only
  std::vector<uint8_t> sliding = {1, 0};  // with a window: each layer's flag (KvLayout groups)
};

struct RefSeq {
  SeqId id = 0;
  uint64_t extra_key = 0;
  int prompt = 0;               // index of the prompt it follows
  std::vector<int32_t> tokens;  // [length]
  std::vector<uint64_t> seeds;  // [length] seed of the K/V written at each position
  int32_t computed = 0;
};

class KvRandomTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& cfg = GetParam();
    const int32_t n_layers = cfg.window > 0 ? static_cast<int32_t>(cfg.sliding.size()) : 2;
    auto layout = cfg.mla ? KvLayout::Mla(n_layers, 3, 2, cfg.type, cfg.block_size)
                          : KvLayout::Gqa(n_layers, 2, 3, cfg.type, cfg.block_size);
    ASSERT_TRUE(layout.ok()) << layout.status();
    if (cfg.window > 0) {
      layout = layout->WithSlidingGroups(cfg.sliding, cfg.window);
      ASSERT_TRUE(layout.ok()) << layout.status();
    }
    auto cache = KvCache::Create(*layout, {.num_blocks = cfg.num_blocks, .hash_seed = 17});
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    bs_ = cfg.block_size;
    tiles_ = layout->tiles_per_layer();
    row_elems_ = layout->row_elems();
    // Values must be exact in the element type: integers < 2048 (f16), < 256 (bf16).
    mask_ = cfg.type == GgmlType::kBF16 ? 255 : 1023;
    std::mt19937_64 prompt_rng(99);
    for (int p = 0; p < 6; ++p) {
      std::vector<int32_t> prompt(8 + prompt_rng() % 32);
      for (int32_t& t : prompt) t = static_cast<int32_t>(prompt_rng() % 3);
      // Prompts 3..5 share a long prefix with prompts 0..2.
      if (p >= 3) {
        const auto& base = prompts_[p - 3];
        std::copy(base.begin(), base.begin() + std::min(base.size(), prompt.size()) / 2,
                  prompt.begin());
      }
      prompts_.push_back(std::move(prompt));
    }
  }

  float Expected(uint64_t seed, int64_t elem) const {
    return static_cast<float>(Mix(seed + static_cast<uint64_t>(elem)) & mask_);
  }

  std::byte* Row(KvSlot slot, int32_t layer, int32_t tile) {
    if (GetParam().mla) return cache_->LatentRow(slot, layer);
    const int32_t heads = tiles_ / 2;
    return tile < heads ? cache_->KeyRow(slot, layer, tile)
                        : cache_->ValueRow(slot, layer, tile - heads);
  }

  void WriteToken(KvSlot slot, uint64_t seed) {
    const GgmlType type = cache_->layout().elem_type();
    for (int32_t l = 0; l < cache_->layout().n_layers(); ++l) {
      EXPECT_NE(slot.group_block(cache_->layout().layer_group(l)), kNullBlock);
      for (int32_t t = 0; t < tiles_; ++t) {
        std::byte* row = Row(slot, l, t);
        for (int32_t d = 0; d < row_elems_; ++d) {
          StoreKvElement(type, row, d, Expected(seed, (l * tiles_ + t) * row_elems_ + d));
        }
      }
    }
  }

  // Empty string when the token at `slot` holds the K/V of `seed` (in the layers of the sliding
  // group only while its block is not released).
  std::string CheckToken(KvSlot slot, uint64_t seed) {
    const GgmlType type = cache_->layout().elem_type();
    for (int32_t l = 0; l < cache_->layout().n_layers(); ++l) {
      const int32_t group = cache_->layout().layer_group(l);
      if (cache_->layout().group_is_sliding(group) && slot.group_block(group) == kNullBlock) {
        continue;
      }
      for (int32_t t = 0; t < tiles_; ++t) {
        const std::byte* row = Row(slot, l, t);
        for (int32_t d = 0; d < row_elems_; ++d) {
          const float want = Expected(seed, (l * tiles_ + t) * row_elems_ + d);
          const float got = LoadKvElement(type, row, d);
          if (got != want) {
            return absl::StrCat("block ", slot.block, " offset ", slot.offset, " layer ", l,
                                " tile ", t, " elem ", d, ": got ", got, " want ", want);
          }
        }
      }
    }
    return "";
  }

  // Leading released (null) entries of a sequence's first sliding group's table.
  int32_t ReleasedBlocks(SeqId id) const {
    if (GetParam().window == 0) return 0;
    const auto table = *cache_->BlockTable(id, cache_->layout().first_sliding_group());
    return static_cast<int32_t>(
        std::find_if(table.begin(), table.end(), [](BlockId b) { return b != kNullBlock; }) -
        table.begin());
  }

  // The first sliding-layer row a token at position `next` (or later) reads: its window's first
  // row rounded down to the attention kernels' 16 rows. (0 without a window.)
  int32_t FirstRead(int32_t next) const {
    if (GetParam().window == 0) return INT32_MAX;
    return std::max(0, next - GetParam().window + 1) / 16 * 16;
  }

  uint64_t PrefixSeed(const RefSeq& s, size_t upto_inclusive) const {
    uint64_t seed = RootSeed(s.extra_key);
    for (size_t q = 0; q <= upto_inclusive; ++q) seed = NextSeed(seed, s.tokens[q]);
    return seed;
  }

  // Full comparison of the cache with the reference. Returns "" or the first difference.
  std::string CheckAll() {
    std::vector<int32_t> holders(GetParam().num_blocks, 0);
    for (const RefSeq& s : seqs_) {
      auto len = cache_->Length(s.id);
      if (!len.ok()) return absl::StrCat("seq ", s.id, ": ", len.status().ToString());
      if (*len != static_cast<int32_t>(s.tokens.size())) {
        return absl::StrCat("seq ", s.id, " length ", *len, " want ", s.tokens.size());
      }
      if (*cache_->NumComputed(s.id) != s.computed) return absl::StrCat("seq ", s.id, " computed");
      auto tokens = *cache_->Tokens(s.id);
      if (!std::equal(tokens.begin(), tokens.end(), s.tokens.begin(), s.tokens.end())) {
        return absl::StrCat("seq ", s.id, " tokens differ");
      }
      const KvLayout& layout = cache_->layout();
      auto table = *cache_->BlockTable(s.id);
      const int32_t released = ReleasedBlocks(s.id);
      if (released * bs_ > FirstRead(s.computed) ||
          *cache_->SlidingBlocksReleased(s.id) != released) {
        return absl::StrCat("seq ", s.id, " has ", released, " sliding blocks released, computed ",
                            s.computed);
      }
      if (table.size() != (s.tokens.size() + bs_ - 1) / bs_) {
        return absl::StrCat("seq ", s.id, " has ", table.size(), " blocks for ", s.tokens.size(),
                            " tokens");
      }
      // Every group's table: as long as group 0's, null exactly at a sliding group's released
      // entries.
      std::vector<std::span<const BlockId>> tables;
      for (int32_t g = 0; g < layout.n_groups(); ++g) {
        tables.push_back(*cache_->BlockTable(s.id, g));
        if (tables[g].size() != table.size()) {
          return absl::StrCat("seq ", s.id, " group ", g, " table of ", tables[g].size());
        }
        for (size_t i = 0; i < table.size(); ++i) {
          const BlockId b = tables[g][i];
          if (layout.group_is_sliding(g) && i < static_cast<size_t>(released)) {
            if (b != kNullBlock) return absl::StrCat("seq ", s.id, " released block ", b);
            continue;
          }
          if (b <= kNullBlock || b >= GetParam().num_blocks) return absl::StrCat("bad block ", b);
          ++holders[b];
        }
      }
      // Read back every token through the table (not through stored slots).
      uint64_t prefix = RootSeed(s.extra_key);
      for (size_t q = 0; q < s.tokens.size(); ++q) {
        prefix = NextSeed(prefix, s.tokens[q]);
        if (s.seeds[q] != prefix) return absl::StrCat("reference broke its own invariant at ", q);
        KvSlot slot{.block = table[q / bs_], .offset = static_cast<int32_t>(q % bs_)};
        for (size_t g = 1; g < tables.size(); ++g) slot.group_blocks[g - 1] = tables[g][q / bs_];
        std::string err = CheckToken(slot, s.seeds[q]);
        if (!err.empty()) return absl::StrCat("seq ", s.id, " pos ", q, ": ", err);
      }
    }
    int32_t used = 0;
    for (BlockId b = 1; b < GetParam().num_blocks; ++b) {
      if (cache_->RefCount(b) != holders[b]) {
        return absl::StrCat("block ", b, " ref ", cache_->RefCount(b), " holders ", holders[b]);
      }
      used += holders[b] > 0 ? 1 : 0;
    }
    const KvCacheCounters c = cache_->Counters();
    if (c.blocks_used != used) return absl::StrCat("used ", c.blocks_used, " want ", used);
    if (c.blocks_used + c.blocks_free + c.blocks_cached != c.blocks_total) {
      return absl::StrCat("leak: used ", c.blocks_used, " free ", c.blocks_free, " cached ",
                          c.blocks_cached, " total ", c.blocks_total);
    }
    if (c.num_sequences != static_cast<int32_t>(seqs_.size())) return "sequence count differs";
    absl::Status inv = cache_->CheckInvariants();
    if (!inv.ok()) return inv.ToString();
    return "";
  }

  // Appends `tokens` to seq `i` with data; false on cache full (reference untouched).
  bool Append(RefSeq& s, const std::vector<int32_t>& tokens) {
    slots_.resize(tokens.size());
    absl::Status st = cache_->AppendSlots(s.id, tokens, slots_);
    if (absl::IsResourceExhausted(st)) {
      ++exhausted_;
      return false;
    }
    EXPECT_TRUE(st.ok()) << st;
    uint64_t seed = s.seeds.empty() ? RootSeed(s.extra_key) : s.seeds.back();
    for (size_t j = 0; j < tokens.size(); ++j) {
      seed = NextSeed(seed, tokens[j]);
      WriteToken(slots_[j], seed);
      s.tokens.push_back(tokens[j]);
      s.seeds.push_back(seed);
    }
    return true;
  }

  void FreeAt(size_t i) {
    ASSERT_TRUE(cache_->Free(seqs_[i].id).ok());
    seqs_.erase(seqs_.begin() + static_cast<ptrdiff_t>(i));
  }

  std::unique_ptr<KvCache> cache_;
  int32_t bs_ = 0;
  int32_t tiles_ = 0;
  int32_t row_elems_ = 0;
  uint64_t mask_ = 0;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<RefSeq> seqs_;
  std::vector<KvSlot> slots_;
  int64_t exhausted_ = 0;
  int64_t refused_truncates_ = 0;
};

TEST_P(KvRandomTest, MatchesReferenceAfterEveryOperation) {
  const int64_t n_ops =
      std::max<int64_t>(1, static_cast<int64_t>(OpsFromEnv() * GetParam().ops_fraction));
  constexpr size_t kMaxSeqs = 10;
  constexpr int32_t kMaxLen = 40;
  std::mt19937_64 rng(1234);
  auto uniform = [&](int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int64_t counts[8] = {};
  for (int64_t op_index = 0; op_index < n_ops; ++op_index) {
    int op = static_cast<int>(uniform(0, 99));
    if (seqs_.empty()) op = 0;
    std::string what;
    if (op < 10) {  // create, attach a cached prefix of a prompt
      if (seqs_.size() >= kMaxSeqs) {
        FreeAt(uniform(0, seqs_.size() - 1));
        what = "free (make room)";
      } else {
        RefSeq s;
        s.extra_key = static_cast<uint64_t>(uniform(0, 1));
        s.id = cache_->CreateSequence(s.extra_key);
        s.prompt = static_cast<int>(uniform(0, prompts_.size() - 1));
        const auto& prompt = prompts_[s.prompt];
        const auto query = std::span(prompt).first(uniform(0, prompt.size()));
        auto n = cache_->AttachCachedPrefix(s.id, query);
        ASSERT_TRUE(n.ok()) << n.status();
        ASSERT_EQ(*n % bs_, 0);
        ASSERT_LE(*n, static_cast<int32_t>(query.size()));
        uint64_t seed = RootSeed(s.extra_key);
        for (int32_t q = 0; q < *n; ++q) {
          seed = NextSeed(seed, prompt[q]);
          s.tokens.push_back(prompt[q]);
          s.seeds.push_back(seed);
        }
        s.computed = *n;
        seqs_.push_back(std::move(s));
        what = absl::StrCat("create+attach ", *n);
        ++counts[0];
      }
    } else if (op < 42) {  // append 1..6 tokens (prompt continuation or random)
      const size_t i = uniform(0, seqs_.size() - 1);
      RefSeq& s = seqs_[i];
      const int32_t k = static_cast<int32_t>(uniform(1, 6));
      if (static_cast<int32_t>(s.tokens.size()) + k > kMaxLen) {
        const absl::Status st = cache_->Truncate(s.id, 0);
        if (st.ok()) {
          s.tokens.clear();
          s.seeds.clear();
          s.computed = 0;
          what = "truncate to 0 (length cap)";
        } else {  // sliding blocks released: the engine would recompute; here, start over
          ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
          FreeAt(i);
          what = "free (length cap, window released)";
        }
      } else {
        std::vector<int32_t> tokens(k);
        const auto& prompt = prompts_[s.prompt];
        const bool follow = uniform(0, 9) < 7;
        for (int32_t j = 0; j < k; ++j) {
          const size_t pos = s.tokens.size() + j;
          tokens[j] =
              follow && pos < prompt.size() ? prompt[pos] : static_cast<int32_t>(uniform(0, 2));
        }
        if (!Append(s, tokens)) {
          // Preempt another sequence half of the time and retry once.
          if (seqs_.size() > 1 && uniform(0, 1) == 0) {
            size_t victim = uniform(0, seqs_.size() - 2);
            if (victim >= i) ++victim;
            const SeqId keep = s.id;
            FreeAt(victim);
            auto it = std::find_if(seqs_.begin(), seqs_.end(),
                                   [&](const RefSeq& r) { return r.id == keep; });
            Append(*it, tokens);
            what = "append after preempt";
          } else {
            what = "append (cache full)";
          }
        } else {
          what = "append";
        }
        ++counts[1];
      }
    } else if (op < 50) {  // fork
      const size_t i = uniform(0, seqs_.size() - 1);
      if (seqs_.size() < kMaxSeqs) {
        auto id = cache_->Fork(seqs_[i].id);
        ASSERT_TRUE(id.ok());
        RefSeq copy = seqs_[i];
        copy.id = *id;
        seqs_.push_back(std::move(copy));
        ++counts[2];
      }
      what = "fork";
    } else if (op < 60) {  // overwrite from pos to the end (possibly shared blocks)
      const size_t i = uniform(0, seqs_.size() - 1);
      RefSeq& s = seqs_[i];
      const int32_t len = static_cast<int32_t>(s.tokens.size());
      if (s.computed < len) {
        const int32_t pos = static_cast<int32_t>(uniform(s.computed, len - 1));
        s.tokens[pos] = static_cast<int32_t>(uniform(0, 2));
        uint64_t seed = pos == 0 ? RootSeed(s.extra_key) : s.seeds[pos - 1];
        for (int32_t q = pos; q < len; ++q) {
          auto slot = cache_->PrepareOverwrite(s.id, q, s.tokens[q]);
          if (absl::IsResourceExhausted(slot.status())) {
            // Roll back what could not be rewritten, as an engine would.
            ++exhausted_;
            ASSERT_TRUE(cache_->Truncate(s.id, q).ok());
            s.tokens.resize(q);
            s.seeds.resize(q);
            break;
          }
          ASSERT_TRUE(slot.ok()) << slot.status();
          seed = NextSeed(seed, s.tokens[q]);
          WriteToken(*slot, seed);
          s.seeds[q] = seed;
        }
        ++counts[3];
      }
      what = "overwrite";
    } else if (op < 75) {  // mark computed
      RefSeq& s = seqs_[uniform(0, seqs_.size() - 1)];
      const int32_t n = static_cast<int32_t>(uniform(s.computed, s.tokens.size()));
      ASSERT_TRUE(cache_->MarkComputed(s.id, n).ok());
      s.computed = n;
      what = "mark computed";
      ++counts[4];
    } else if (op < 90) {  // truncate (speculative rollback)
      RefSeq& s = seqs_[uniform(0, seqs_.size() - 1)];
      const int32_t len = static_cast<int32_t>(s.tokens.size());
      const int32_t n = static_cast<int32_t>(uniform(std::max(0, len - 8), len));
      // Refused (nothing changed) exactly when the new length's window needs a released block.
      const bool needs_released = ReleasedBlocks(s.id) * bs_ > FirstRead(std::min(n, s.computed));
      const absl::Status st = cache_->Truncate(s.id, n);
      ASSERT_EQ(st.ok(), !needs_released) << st << ": truncate to " << n << " of " << len;
      if (!st.ok()) {
        ASSERT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
        ++refused_truncates_;
        what = "truncate (refused)";
        ASSERT_EQ(CheckAll(), "");
        continue;
      }
      s.tokens.resize(n);
      s.seeds.resize(n);
      s.computed = std::min(s.computed, n);
      what = "truncate";
      ++counts[5];
    } else {  // free
      FreeAt(uniform(0, seqs_.size() - 1));
      what = "free";
      ++counts[6];
    }
    const std::string err = CheckAll();
    ASSERT_EQ(err, "") << "after op " << op_index << " (" << what << ")";
  }
  const KvCacheCounters c = cache_->Counters();
  // The run must have exercised every mechanism it claims to test.
  EXPECT_GT(c.prefix_hit_tokens, 0);
  EXPECT_GT(c.evictions, 0);
  EXPECT_GT(c.cow_copies, 0);
  EXPECT_GT(exhausted_, 0);
  if (GetParam().window > 0) {
    EXPECT_GT(c.sliding_blocks_released, 0);
    EXPECT_GT(refused_truncates_, 0);
    std::printf("%s: %lld sliding blocks released, %lld truncates refused\n",
                GetParam().name.c_str(), static_cast<long long>(c.sliding_blocks_released),
                static_cast<long long>(refused_truncates_));
  }
  std::printf(
      "%s: %lld ops (create %lld, append %lld, fork %lld, overwrite %lld, computed %lld, "
      "truncate %lld, free %lld); prefix hit tokens %lld of %lld queried, evictions %lld, "
      "cow copies %lld, cache-full failures %lld\n",
      GetParam().name.c_str(), static_cast<long long>(n_ops), static_cast<long long>(counts[0]),
      static_cast<long long>(counts[1]), static_cast<long long>(counts[2]),
      static_cast<long long>(counts[3]), static_cast<long long>(counts[4]),
      static_cast<long long>(counts[5]), static_cast<long long>(counts[6]),
      static_cast<long long>(c.prefix_hit_tokens), static_cast<long long>(c.prefix_query_tokens),
      static_cast<long long>(c.evictions), static_cast<long long>(c.cow_copies),
      static_cast<long long>(exhausted_));
  for (const RefSeq& s : seqs_) ASSERT_TRUE(cache_->Free(s.id).ok());
  seqs_.clear();
  const KvCacheCounters end = cache_->Counters();
  EXPECT_EQ(end.blocks_used, 0);
  EXPECT_EQ(end.blocks_free + end.blocks_cached, end.blocks_total);
  EXPECT_EQ(end.sliding_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KvRandomTest,
    ::testing::Values(
        Config{"GqaF32Bs4", false, GgmlType::kF32, 4, 29, 1.0},
        Config{"GqaF16Bs16", false, GgmlType::kF16, 16, 12, 0.3},
        Config{"MlaBf16Bs3", true, GgmlType::kBF16, 3, 37, 0.3},
        Config{"GqaSlidingF32Bs4", false, GgmlType::kF32, 4, 29, 0.3, 5},
        // Two global groups and a sliding one (layers 0 and 2 global).
        Config{"GqaSlidingThreeGroupsF16Bs4", false, GgmlType::kF16, 4, 41, 0.3, 5, {0, 1, 0}}),
    [](const ::testing::TestParamInfo<Config>& info) { return info.param.name; });

}  // namespace
}  // namespace kiln
