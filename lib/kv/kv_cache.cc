#include "lib/kv/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace kiln {
namespace {

int32_t CeilDiv(int64_t a, int32_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// Leading blocks no token at position >= next_pos - margin reads in a layer with this window.
int32_t BlocksBelowWindow(int32_t next_pos, int32_t window, int32_t margin, int32_t block_size) {
  const int64_t first = static_cast<int64_t>(next_pos) - window + 1 - margin;
  if (first <= 0) return 0;
  return static_cast<int32_t>(first / KvCache::kSlidingRowAlignment *
                              KvCache::kSlidingRowAlignment / block_size);
}

absl::StatusOr<std::unique_ptr<KvStorage>> NewStorage(const KvCacheOptions& options,
                                                      const KvLayout& layout, int32_t n_blocks) {
  std::unique_ptr<KvStorage> storage;
  if (options.storage) {
    KILN_ASSIGN_OR_RETURN(storage, options.storage(layout, n_blocks));
  } else {
    KILN_ASSIGN_OR_RETURN(storage, NewHostKvStorage(layout, n_blocks));
  }
  if (storage == nullptr) return absl::InternalError("KvCache: the storage factory returned null");
  return storage;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout,
                                                         const KvCacheOptions& options) {
  if ((options.num_blocks != 0) == (options.capacity_bytes != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheOptions: set exactly one of num_blocks (", options.num_blocks,
                     ") and capacity_bytes (", options.capacity_bytes, ")"));
  }
  if (options.sliding_release_margin < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheOptions: sliding_release_margin ",
                                                   options.sliding_release_margin, " < 0"));
  }
  int64_t n_blocks = options.num_blocks;
  if (options.capacity_bytes != 0) {
    n_blocks = static_cast<int64_t>(options.capacity_bytes / layout.block_bytes());
    if (n_blocks > INT32_MAX) n_blocks = INT32_MAX;
    if (n_blocks < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvCacheOptions.capacity_bytes ", options.capacity_bytes, " holds ", n_blocks,
          " blocks of ", layout.block_bytes(), " bytes; need at least 2 (1 + the null block)"));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                        BlockPool::Create(layout, static_cast<int32_t>(n_blocks)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        NewStorage(options, layout, static_cast<int32_t>(n_blocks)));
  return std::unique_ptr<KvCache>(new KvCache(std::move(pool), std::move(storage), options));
}

KvCache::KvCache(std::unique_ptr<BlockPool> pool, std::unique_ptr<KvStorage> storage,
                 const KvCacheOptions& options)
    : pool_(std::move(pool)),
      storage_(std::move(storage)),
      release_margin_(options.sliding_release_margin),
      block_size_(pool_->layout().block_size()),
      prefix_caching_(options.enable_prefix_caching),
      hash_seed_(options.hash_seed),
      fill_scratch_(pool_->num_blocks(), 0),
      sliding_scratch_(pool_->num_blocks(), 0) {}

absl::StatusOr<KvCache::Sequence*> KvCache::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache: unknown sequence id ", seq));
  }
  return &it->second;
}

absl::StatusOr<const KvCache::Sequence*> KvCache::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache: unknown sequence id ", seq));
  }
  return &it->second;
}

SeqId KvCache::CreateSequence(uint64_t extra_key) {
  const SeqId id = next_seq_id_++;
  Sequence& s = seqs_[id];
  s.extra_key = extra_key;
  s.group_tables.resize(static_cast<size_t>(n_groups() - 1));
  return id;
}

BlockHash KvCache::ParentHash(const Sequence& s, size_t block_index) const {
  return block_index == 0 ? RootBlockHash(s.extra_key, hash_seed_) : s.hashes[block_index - 1];
}

BlockHash KvCache::GroupHash(const BlockHash& h, int32_t group) {
  if (group == 0) return h;
  const uint64_t g = static_cast<uint64_t>(group);
  return BlockHash{h.lo ^ (g * 0x9e3779b97f4a7c15ULL), h.hi + g * 0xc2b2ae3d27d4eb4fULL};
}

absl::StatusOr<int32_t> KvCache::AttachCachedPrefix(SeqId seq, std::span<const int32_t> tokens) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  if (!s->tokens.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KvCache::AttachCachedPrefix: sequence ", seq, " already holds ", s->tokens.size(),
        " tokens; a prefix can only be attached to an empty sequence"));
  }
  ++stats_.prefix_lookups;
  stats_.prefix_query_tokens += static_cast<int64_t>(tokens.size());
  if (!prefix_caching_) return 0;
  const size_t full_blocks = tokens.size() / static_cast<size_t>(block_size_);
  BlockHash parent = RootBlockHash(s->extra_key, hash_seed_);
  size_t i = 0;
  for (; i < full_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = ChainBlockHash(parent, s->extra_key, block_tokens);
    const BlockId b = pool_->Lookup(h, parent, s->extra_key, block_tokens);
    if (b == kNullBlock) break;
    pool_->Ref(b);
    s->table.push_back(b);
    s->hashes.push_back(h);
    parent = h;
  }
  if (n_groups() > 1) {
    // The hit counts only as far as every other group finds its blocks under the same hashes:
    // all of them for a global group, the window's for a sliding one.
    auto group_hit = [&](int32_t g, size_t j) {
      const auto block_tokens = tokens.subspan(j * block_size_, block_size_);
      return pool_->Lookup(GroupHash(s->hashes[j], g), GroupHash(ParentHash(*s, j), g),
                           s->extra_key, block_tokens);
    };
    const int32_t first_sliding = layout().first_sliding_group();
    for (int32_t g = 1; g < first_sliding; ++g) {
      size_t j = 0;
      while (j < i && group_hit(g, j) != kNullBlock) ++j;
      i = j;
    }
    size_t low = 0;
    for (;; --i) {  // i == 0 always ends it
      low = static_cast<size_t>(ReleasableSlidingBlocks(static_cast<int32_t>(i) * block_size_));
      bool found = true;
      for (int32_t g = first_sliding; found && g < n_groups(); ++g) {
        for (size_t j = low; found && j < i; ++j) found = group_hit(g, j) != kNullBlock;
      }
      if (found) break;
    }
    for (size_t j = s->table.size(); j > i; --j) pool_->Release(s->table[j - 1]);
    s->table.resize(i);
    s->hashes.resize(i);
    s->sliding_released = static_cast<int32_t>(low);
    for (int32_t g = 1; g < n_groups(); ++g) {
      std::vector<BlockId>& table = Table(*s, g);
      table.assign(i, kNullBlock);
      for (size_t j = layout().group_is_sliding(g) ? low : 0; j < i; ++j) {
        table[j] = group_hit(g, j);
        pool_->Ref(table[j]);
      }
    }
  }
  const int32_t attached = static_cast<int32_t>(i) * block_size_;
  s->tokens.assign(tokens.begin(), tokens.begin() + attached);
  s->n_computed = attached;
  stats_.prefix_hit_tokens += attached;
  return attached;
}

absl::StatusOr<int32_t> KvCache::BlocksNeededToAppend(SeqId seq, int32_t n_tokens) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache::BlocksNeededToAppend: n_tokens ", n_tokens, " < 0"));
  }
  if (n_tokens == 0) return 0;
  const int64_t len = static_cast<int64_t>(s->tokens.size());
  const int64_t fresh =
      CeilDiv(len + n_tokens, block_size_) - static_cast<int64_t>(s->table.size());
  int64_t needed = fresh * n_groups();
  for (int32_t g = 0; g < n_groups(); ++g) needed += NeedsCopyBeforeAppend(*s, g) ? 1 : 0;
  return static_cast<int32_t>(std::min<int64_t>(needed, INT32_MAX));
}

int32_t KvCache::ReleasableSlidingBlocks(int32_t n_computed) const {
  if (!has_sliding()) return 0;
  return BlocksBelowWindow(n_computed, layout().sliding_window(), release_margin_, block_size_);
}

KvSlot KvCache::SlotAt(const Sequence& s, int32_t pos) const {
  const size_t i = static_cast<size_t>(pos / block_size_);
  KvSlot slot{.block = s.table[i], .offset = pos % block_size_};
  for (size_t g = 0; g < s.group_tables.size(); ++g) slot.group_blocks[g] = s.group_tables[g][i];
  return slot;
}

void KvCache::CopyOnWrite(Sequence& s, int32_t group, size_t i) {
  std::vector<BlockId>& table = Table(s, group);
  const BlockId old_block = table[i];
  const BlockId new_block = pool_->Allocate();
  storage_->CopyBlock(old_block, new_block);
  table[i] = new_block;
  pool_->Release(old_block);  // a hashed block with no other holder goes to the LRU, still cached
  ++stats_.cow_copies;
}

absl::Status KvCache::AppendSlots(SeqId seq, std::span<const int32_t> token_ids,
                                  std::span<KvSlot> slots_out) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  const int32_t n = static_cast<int32_t>(token_ids.size());
  if (!slots_out.empty() && slots_out.size() != token_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache::AppendSlots: slots_out has ", slots_out.size(), " entries for ",
                     token_ids.size(), " tokens (pass it empty or equal)"));
  }
  if (token_ids.size() > static_cast<size_t>(INT32_MAX) - s->tokens.size()) {
    return absl::InvalidArgumentError("KvCache::AppendSlots: sequence length would overflow int32");
  }
  if (n == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(const int32_t needed, BlocksNeededToAppend(seq, n));
  const int32_t len = static_cast<int32_t>(s->tokens.size());
  if (needed > pool_->num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: appending ", n, " tokens to sequence ", seq, " (length ", s->tokens.size(),
        ") needs ", needed, " blocks, ", pool_->num_available(), " available (", pool_->num_free(),
        " free, ", pool_->num_cached(), " cached); free or preempt a sequence and retry"));
  }
  // Capacity is guaranteed from here on: mutate.
  for (int32_t g = 0; g < n_groups(); ++g) {
    if (NeedsCopyBeforeAppend(*s, g)) CopyOnWrite(*s, g, s->table.size() - 1);
  }
  const int32_t total_blocks = CeilDiv(static_cast<int64_t>(len) + n, block_size_);
  while (static_cast<int32_t>(s->table.size()) < total_blocks) {
    s->table.push_back(pool_->Allocate());
    for (std::vector<BlockId>& table : s->group_tables) table.push_back(pool_->Allocate());
  }
  s->tokens.insert(s->tokens.end(), token_ids.begin(), token_ids.end());
  if (!slots_out.empty()) {
    for (int32_t j = 0; j < n; ++j) slots_out[j] = SlotAt(*s, len + j);
  }
  return absl::OkStatus();
}

absl::Status KvCache::AppendSlotsForRestore(SeqId seq, std::span<const int32_t> token_ids,
                                            int32_t n_computed) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  if (!s->tokens.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("KvCache::AppendSlotsForRestore: sequence ",
                                                      seq, " already holds ", s->tokens.size(),
                                                      " tokens"));
  }
  if (n_computed < 0 || static_cast<size_t>(n_computed) > token_ids.size() ||
      token_ids.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache::AppendSlotsForRestore: n_computed ",
                                                   n_computed, " of ", token_ids.size(),
                                                   " tokens"));
  }
  const int32_t blocks = CeilDiv(static_cast<int64_t>(token_ids.size()), block_size_);
  const int32_t released = std::min(ReleasableSlidingBlocks(n_computed), blocks);
  const int64_t n_sliding_groups = n_groups() - layout().first_sliding_group();
  const int64_t needed =
      static_cast<int64_t>(blocks) * n_groups() - static_cast<int64_t>(released) * n_sliding_groups;
  if (needed > pool_->num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: restoring ", token_ids.size(), " tokens needs ", needed, " blocks (",
        pool_->num_available(), " available); free or preempt a sequence and retry"));
  }
  for (int32_t i = 0; i < blocks; ++i) {
    s->table.push_back(pool_->Allocate());
    for (int32_t g = 1; g < n_groups(); ++g) {
      const bool skip = layout().group_is_sliding(g) && i < released;
      Table(*s, g).push_back(skip ? kNullBlock : pool_->Allocate());
    }
  }
  if (has_sliding()) s->sliding_released = released;
  s->tokens.assign(token_ids.begin(), token_ids.end());
  return absl::OkStatus();
}

absl::StatusOr<KvSlot> KvCache::PrepareOverwrite(SeqId seq, int32_t pos, int32_t token_id) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  const int32_t len = static_cast<int32_t>(s->tokens.size());
  if (pos < s->n_computed || pos >= len) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache::PrepareOverwrite: position ", pos, " of sequence ", seq,
                     " is outside the writable range [", s->n_computed, ", ", len,
                     ") (computed tokens are immutable)"));
  }
  const size_t i = static_cast<size_t>(pos / block_size_);
  // (pos >= n_computed: its sliding blocks are never released.)
  int32_t copies = 0;
  for (int32_t g = 0; g < n_groups(); ++g) copies += Writable(Table(*s, g)[i]) ? 0 : 1;
  if (copies > pool_->num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: overwriting position ", pos, " of sequence ", seq, " needs copies of ",
        copies, " shared blocks, ", pool_->num_available(), " available"));
  }
  for (int32_t g = 0; g < n_groups(); ++g) {
    if (!Writable(Table(*s, g)[i])) CopyOnWrite(*s, g, i);
  }
  s->tokens[pos] = token_id;
  return SlotAt(*s, pos);
}

absl::Status KvCache::MarkComputed(SeqId seq, int32_t n_computed) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  const int32_t len = static_cast<int32_t>(s->tokens.size());
  if (n_computed < s->n_computed || n_computed > len) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache::MarkComputed: n_computed ", n_computed,
                                                   " of sequence ", seq, " is outside [",
                                                   s->n_computed, ", ", len, "]"));
  }
  s->n_computed = n_computed;
  if (prefix_caching_) RegisterComputedBlocks(*s);
  if (has_sliding()) ReleaseSlidingBlocks(*s);
  return absl::OkStatus();
}

void KvCache::RegisterComputedBlocks(Sequence& s) {
  const size_t full = static_cast<size_t>(s.n_computed / block_size_);
  std::span<const int32_t> tokens(s.tokens);
  while (s.hashes.size() < full) {
    const size_t i = s.hashes.size();
    const BlockHash parent = ParentHash(s, i);
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = ChainBlockHash(parent, s.extra_key, block_tokens);
    s.hashes.push_back(h);
    // Each group's block of these tokens, under the hash salted with its group. An already hashed
    // block (attached, or shared with a fork) keeps its entry; a duplicate of a block that is
    // already cached stays unhashed (the index keeps the first copy); a released one is gone.
    for (int32_t g = 0; g < n_groups(); ++g) {
      const BlockId b = Table(s, g)[i];
      if (b != kNullBlock && !pool_->has_hash(b)) {
        pool_->RegisterHash(b, GroupHash(h, g), GroupHash(parent, g), s.extra_key, block_tokens);
      }
    }
  }
}

void KvCache::ReleaseSlidingBlocks(Sequence& s) {
  const int32_t releasable = ReleasableSlidingBlocks(s.n_computed);
  // Last block first (as ReleaseTail): a released run's later blocks are evicted first.
  for (int32_t i = releasable - 1; i >= s.sliding_released; --i) {
    for (int32_t g = layout().first_sliding_group(); g < n_groups(); ++g) {
      BlockId& b = Table(s, g)[static_cast<size_t>(i)];
      pool_->Release(b);
      b = kNullBlock;
      ++stats_.sliding_blocks_released;
    }
  }
  s.sliding_released = std::max(s.sliding_released, releasable);
}

absl::StatusOr<SeqId> KvCache::Fork(SeqId seq) {
  KILN_ASSIGN_OR_RETURN(const Sequence* src, Find(seq));
  // Built before insertion (the insert may rehash and move *src), with room for the next block
  // so the fork's first append does not reallocate.
  Sequence copy;
  copy.extra_key = src->extra_key;
  copy.n_computed = src->n_computed;
  copy.tokens.reserve(src->tokens.size() + static_cast<size_t>(block_size_));
  copy.tokens.assign(src->tokens.begin(), src->tokens.end());
  copy.hashes = src->hashes;
  copy.sliding_released = src->sliding_released;
  copy.group_tables.resize(src->group_tables.size());
  for (int32_t g = 0; g < n_groups(); ++g) {
    const std::vector<BlockId>& from = Table(*src, g);
    std::vector<BlockId>& to = Table(copy, g);
    to.reserve(from.size() + 1);
    to.assign(from.begin(), from.end());
    for (BlockId b : to) {
      if (b != kNullBlock) pool_->Ref(b);
    }
  }
  const SeqId id = next_seq_id_++;
  seqs_.emplace(id, std::move(copy));
  return id;
}

void KvCache::ReleaseTail(Sequence& s, size_t keep_blocks) {
  // Last block first: the tail of a cached chain enters the LRU before its parents, so it is
  // evicted first.
  while (s.table.size() > keep_blocks) {
    for (int32_t g = 0; g < n_groups(); ++g) {
      std::vector<BlockId>& table = Table(s, g);
      if (table.back() != kNullBlock) pool_->Release(table.back());
      table.pop_back();
    }
  }
  s.sliding_released = std::min(s.sliding_released, static_cast<int32_t>(keep_blocks));
}

absl::Status KvCache::Truncate(SeqId seq, int32_t new_len) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  const int32_t len = static_cast<int32_t>(s->tokens.size());
  if (new_len < 0 || new_len > len) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache::Truncate: new length ", new_len,
                                                   " of sequence ", seq, " is outside [0, ", len,
                                                   "]"));
  }
  if (has_sliding() && new_len > 0 &&
      s->sliding_released > BlocksBelowWindow(std::min(new_len, s->n_computed),
                                              layout().sliding_window(), 0, block_size_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("KvCache::Truncate: the window of position ", new_len, " of sequence ", seq,
                     " needs sliding-window K/V of blocks already released (", s->sliding_released,
                     " blocks); recompute the sequence instead"));
  }
  ReleaseTail(*s, static_cast<size_t>(CeilDiv(new_len, block_size_)));
  s->tokens.resize(new_len);
  s->n_computed = std::min(s->n_computed, new_len);
  s->hashes.resize(std::min(s->hashes.size(), static_cast<size_t>(s->n_computed / block_size_)));
  return absl::OkStatus();
}

absl::Status KvCache::Free(SeqId seq) {
  KILN_ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  ReleaseTail(*s, 0);
  seqs_.erase(seq);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvCache::Length(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return static_cast<int32_t>(s->tokens.size());
}

absl::StatusOr<int32_t> KvCache::NumComputed(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return s->n_computed;
}

absl::StatusOr<std::span<const BlockId>> KvCache::BlockTable(SeqId seq, int32_t group) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  if (group < 0 || group >= n_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache::BlockTable: group ", group,
                                                   " of a layout with ", n_groups(), " groups"));
  }
  return std::span<const BlockId>(Table(*s, group));
}

absl::StatusOr<int32_t> KvCache::SlidingBlocksReleased(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return s->sliding_released;
}

absl::StatusOr<std::span<const int32_t>> KvCache::Tokens(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return std::span<const int32_t>(s->tokens);
}

absl::StatusOr<KvSlot> KvCache::SlotOf(SeqId seq, int32_t pos) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  if (pos < 0 || pos >= static_cast<int32_t>(s->tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache::SlotOf: position ", pos,
                                                   " of sequence ", seq, " is outside [0, ",
                                                   s->tokens.size(), ")"));
  }
  return SlotAt(*s, pos);
}

absl::Status KvCache::BuildTables(std::span<const SeqId> seqs, KvTables* out) const {
  out->indptr.clear();
  out->indices.clear();
  out->last_page_len.clear();
  out->group_indices.resize(static_cast<size_t>(n_groups() - 1));
  for (std::vector<int32_t>& indices : out->group_indices) indices.clear();
  for (size_t j = 0; j < seqs.size(); ++j) {
    if (!seqs_.contains(seqs[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache::BuildTables: seqs[", j, "] = ", seqs[j], " is not a sequence"));
    }
  }
  out->indptr.push_back(0);
  for (SeqId id : seqs) {
    const Sequence& s = seqs_.find(id)->second;
    out->indices.insert(out->indices.end(), s.table.begin(), s.table.end());
    for (size_t g = 0; g < s.group_tables.size(); ++g) {
      out->group_indices[g].insert(out->group_indices[g].end(), s.group_tables[g].begin(),
                                   s.group_tables[g].end());
    }
    out->indptr.push_back(static_cast<int32_t>(out->indices.size()));
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    out->last_page_len.push_back(
        len == 0 ? 0 : len - (static_cast<int32_t>(s.table.size()) - 1) * block_size_);
  }
  return absl::OkStatus();
}

KvCacheCounters KvCache::Counters() const {
  KvCacheCounters c = stats_;
  c.evictions = pool_->evictions();
  c.blocks_total = pool_->num_usable();
  c.blocks_free = pool_->num_free();
  c.blocks_cached = pool_->num_cached();
  c.blocks_used = pool_->num_used();
  c.num_sequences = static_cast<int32_t>(seqs_.size());
  c.bytes_per_token = layout().bytes_per_token();
  c.block_bytes = layout().block_bytes();
  c.kv_bytes_in_use = static_cast<size_t>(c.blocks_used) * c.block_bytes;
  c.sliding_block_bytes = has_sliding() ? c.block_bytes : 0;
  // A shared block counts once, filled up to the furthest slot any holder uses.
  std::fill(fill_scratch_.begin(), fill_scratch_.end(), 0);
  std::fill(sliding_scratch_.begin(), sliding_scratch_.end(), 0);
  for (const auto& [id, s] : seqs_) {
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    for (int32_t g = 0; g < n_groups(); ++g) {
      const std::vector<BlockId>& table = Table(s, g);
      for (size_t i = 0; i < table.size(); ++i) {
        if (table[i] == kNullBlock) continue;
        const int32_t filled = std::min(block_size_, len - static_cast<int32_t>(i) * block_size_);
        int32_t& f = fill_scratch_[table[i]];
        f = std::max(f, filled);
        sliding_scratch_[table[i]] = layout().group_is_sliding(g) ? 1 : 0;
      }
    }
  }
  for (int32_t f : fill_scratch_) c.filled_slots += f;
  for (uint8_t sliding : sliding_scratch_) c.sliding_blocks_used += sliding;
  c.allocated_slots = static_cast<int64_t>(c.blocks_used) * block_size_;
  c.utilization = c.allocated_slots == 0 ? 1.0
                                         : static_cast<double>(c.filled_slots) /
                                               static_cast<double>(c.allocated_slots);
  return c;
}

absl::Status KvCache::CheckInvariants() const {
  KILN_RETURN_IF_ERROR(pool_->CheckInvariants());
  std::vector<int32_t> holders(pool_->num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    const size_t len = s.tokens.size();
    if (s.table.size() != (len + block_size_ - 1) / block_size_) {
      return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " has ", len,
                                              " tokens but ", s.table.size(), " blocks"));
    }
    if (s.n_computed < 0 || static_cast<size_t>(s.n_computed) > len ||
        s.hashes.size() > static_cast<size_t>(s.n_computed / block_size_)) {
      return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " computed ", s.n_computed,
                                              " hashes ", s.hashes.size()));
    }
    KILN_RETURN_IF_ERROR(CheckGroupInvariants(id, s));
    for (int32_t g = 0; g < n_groups(); ++g) {
      for (BlockId b : Table(s, g)) {
        if (b != kNullBlock) ++holders[b];
      }
    }
  }
  for (BlockId b = 1; b < pool_->num_blocks(); ++b) {
    if (holders[b] != pool_->ref_count(b)) {
      return absl::InternalError(absl::StrCat("KvCache: block ", b, " has ref count ",
                                              pool_->ref_count(b), " but ", holders[b],
                                              " holders"));
    }
  }
  return absl::OkStatus();
}

// Every group's table as long as group 0's; only a sliding group's first `sliding_released`
// entries null, and those within what the window allows.
absl::Status KvCache::CheckGroupInvariants(SeqId id, const Sequence& s) const {
  if (s.group_tables.size() != static_cast<size_t>(n_groups() - 1) || s.sliding_released < 0 ||
      static_cast<size_t>(s.sliding_released) > s.table.size() ||
      s.sliding_released >
          (has_sliding()
               ? BlocksBelowWindow(s.n_computed, layout().sliding_window(), 0, block_size_)
               : 0)) {
    return absl::InternalError(
        absl::StrCat("KvCache: sequence ", id, " has ", s.group_tables.size() + 1,
                     " group tables, ", s.sliding_released, " sliding blocks released, for ",
                     s.table.size(), " blocks, ", s.n_computed, " computed"));
  }
  for (int32_t g = 0; g < n_groups(); ++g) {
    const std::vector<BlockId>& table = Table(s, g);
    if (table.size() != s.table.size()) {
      return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " group ", g, " has ",
                                              table.size(), " blocks for ", s.table.size()));
    }
    for (size_t i = 0; i < table.size(); ++i) {
      const bool released =
          layout().group_is_sliding(g) && i < static_cast<size_t>(s.sliding_released);
      const BlockId b = table[i];
      if (released ? b != kNullBlock : (b <= kNullBlock || b >= pool_->num_blocks())) {
        return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " group ", g, " block ",
                                                i, " is ", b, " (released: ", released, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
