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
  const bool sliding = layout.n_groups() == 2;
  if (options.sliding_num_blocks < 0 || options.sliding_release_margin < 0 ||
      (options.sliding_num_blocks != 0 && (!sliding || options.capacity_bytes != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheOptions: sliding_num_blocks ", options.sliding_num_blocks,
        " and sliding_release_margin ", options.sliding_release_margin,
        " must be >= 0; sliding_num_blocks needs a layout with a sliding group and num_blocks"));
  }
  int64_t n_blocks = options.num_blocks;
  if (options.capacity_bytes != 0) {
    const size_t per_block = layout.block_bytes(0) + (sliding ? layout.block_bytes(1) : 0);
    n_blocks = static_cast<int64_t>(options.capacity_bytes / per_block);
    if (n_blocks > INT32_MAX) n_blocks = INT32_MAX;
    if (n_blocks < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvCacheOptions.capacity_bytes ", options.capacity_bytes, " holds ", n_blocks,
          " blocks of ", per_block, " bytes; need at least 2 (1 + the null block)"));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                        BlockPool::Create(layout, static_cast<int32_t>(n_blocks)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<KvStorage> storage,
                        NewStorage(options, layout, static_cast<int32_t>(n_blocks)));
  std::unique_ptr<BlockPool> sliding_pool;
  std::unique_ptr<KvStorage> sliding_storage;
  if (sliding) {
    const int32_t n_sliding = options.sliding_num_blocks != 0 ? options.sliding_num_blocks
                                                              : static_cast<int32_t>(n_blocks);
    const KvLayout group = layout.GroupLayout(1);
    KILN_ASSIGN_OR_RETURN(sliding_pool, BlockPool::Create(group, n_sliding));
    KILN_ASSIGN_OR_RETURN(sliding_storage, NewStorage(options, group, n_sliding));
  }
  return std::unique_ptr<KvCache>(new KvCache(std::move(pool), std::move(storage),
                                              std::move(sliding_pool), std::move(sliding_storage),
                                              options));
}

KvCache::KvCache(std::unique_ptr<BlockPool> pool, std::unique_ptr<KvStorage> storage,
                 std::unique_ptr<BlockPool> sliding_pool,
                 std::unique_ptr<KvStorage> sliding_storage, const KvCacheOptions& options)
    : pool_(std::move(pool)),
      storage_(std::move(storage)),
      sliding_pool_(std::move(sliding_pool)),
      sliding_storage_(std::move(sliding_storage)),
      release_margin_(options.sliding_release_margin),
      block_size_(pool_->layout().block_size()),
      prefix_caching_(options.enable_prefix_caching),
      hash_seed_(options.hash_seed),
      fill_scratch_(pool_->num_blocks(), 0) {}

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
  seqs_[id].extra_key = extra_key;
  return id;
}

BlockHash KvCache::ParentHash(const Sequence& s, size_t block_index) const {
  return block_index == 0 ? RootBlockHash(s.extra_key, hash_seed_) : s.hashes[block_index - 1];
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
  if (has_sliding()) {
    // The hit counts only as far as the sliding group finds its window's blocks (same hashes).
    auto sliding_hit = [&](size_t j) {
      const auto block_tokens = tokens.subspan(j * block_size_, block_size_);
      return sliding_pool_->Lookup(s->hashes[j], ParentHash(*s, j), s->extra_key, block_tokens);
    };
    size_t low = 0;
    for (;; --i) {
      low = static_cast<size_t>(ReleasableSlidingBlocks(static_cast<int32_t>(i) * block_size_));
      size_t j = low;
      while (j < i && sliding_hit(j) != kNullBlock) ++j;
      if (j == i) break;  // i == 0 always ends here
    }
    for (size_t j = s->table.size(); j > i; --j) pool_->Release(s->table[j - 1]);
    s->table.resize(i);
    s->hashes.resize(i);
    s->sliding_table.assign(i, kNullBlock);
    s->sliding_released = static_cast<int32_t>(low);
    for (size_t j = low; j < i; ++j) {
      s->sliding_table[j] = sliding_hit(j);
      sliding_pool_->Ref(s->sliding_table[j]);
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
  const int32_t fresh =
      CeilDiv(len + n_tokens, block_size_) - static_cast<int32_t>(s->table.size());
  const bool cow = len % block_size_ != 0 && !Writable(s->table.back());
  return fresh + (cow ? 1 : 0);
}

int32_t KvCache::ReleasableSlidingBlocks(int32_t n_computed) const {
  if (!has_sliding()) return 0;
  return BlocksBelowWindow(n_computed, layout().sliding_window(), release_margin_, block_size_);
}

KvSlot KvCache::SlotAt(const Sequence& s, int32_t pos) const {
  const size_t i = static_cast<size_t>(pos / block_size_);
  return KvSlot{s.table[i], pos % block_size_, has_sliding() ? s.sliding_table[i] : kNullBlock};
}

void KvCache::CopyOnWrite(Sequence& s, size_t i) {
  const BlockId old_block = s.table[i];
  const BlockId new_block = pool_->Allocate();
  storage_->CopyBlock(old_block, new_block);
  s.table[i] = new_block;
  pool_->Release(old_block);  // a hashed block with no other holder goes to the LRU, still cached
  ++stats_.cow_copies;
}

void KvCache::CopySlidingOnWrite(Sequence& s, size_t i) {
  const BlockId old_block = s.sliding_table[i];
  const BlockId new_block = sliding_pool_->Allocate();
  sliding_storage_->CopyBlock(old_block, new_block);
  s.sliding_table[i] = new_block;
  sliding_pool_->Release(old_block);
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
  // The sliding group takes the same fresh blocks, and its own copy of a shared last block.
  const bool sliding_cow =
      has_sliding() && len % block_size_ != 0 && !SlidingWritable(s->sliding_table.back());
  const int32_t sliding_needed =
      !has_sliding() ? 0
                     : CeilDiv(static_cast<int64_t>(len) + n, block_size_) -
                           static_cast<int32_t>(s->table.size()) + (sliding_cow ? 1 : 0);
  if (has_sliding() && sliding_needed > sliding_pool_->num_available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: appending ", n, " tokens to sequence ", seq, " (length ", len, ") needs ",
        sliding_needed, " sliding-window blocks, ", sliding_pool_->num_available(),
        " available; free or preempt a sequence and retry"));
  }
  if (needed > pool_->num_available()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: appending ", n, " tokens to sequence ", seq, " (length ",
                     s->tokens.size(), ") needs ", needed, " blocks, ", pool_->num_available(),
                     " available (", pool_->num_free(), " free, ", pool_->num_cached(),
                     " cached); free or preempt a sequence"
                     " and retry"));
  }
  // Capacity is guaranteed from here on: mutate.
  if (len % block_size_ != 0 && !Writable(s->table.back())) CopyOnWrite(*s, s->table.size() - 1);
  if (sliding_cow) CopySlidingOnWrite(*s, s->sliding_table.size() - 1);
  const int32_t total_blocks = CeilDiv(static_cast<int64_t>(len) + n, block_size_);
  while (static_cast<int32_t>(s->table.size()) < total_blocks) {
    s->table.push_back(pool_->Allocate());
    if (has_sliding()) s->sliding_table.push_back(sliding_pool_->Allocate());
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
  if (blocks > pool_->num_available() ||
      (has_sliding() && blocks - released > sliding_pool_->num_available())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: restoring ", token_ids.size(), " tokens needs ", blocks, " blocks (",
        pool_->num_available(), " available)",
        has_sliding() ? absl::StrCat(" and ", blocks - released, " sliding-window blocks (",
                                     sliding_pool_->num_available(), " available)")
                      : std::string(),
        "; free or preempt a sequence and retry"));
  }
  for (int32_t i = 0; i < blocks; ++i) {
    s->table.push_back(pool_->Allocate());
    if (has_sliding()) {
      s->sliding_table.push_back(i < released ? kNullBlock : sliding_pool_->Allocate());
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
  const bool cow = !Writable(s->table[i]);
  // (pos >= n_computed: its sliding block is never released.)
  const bool sliding_cow = has_sliding() && !SlidingWritable(s->sliding_table[i]);
  if ((cow && pool_->num_available() < 1) || (sliding_cow && sliding_pool_->num_available() < 1)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: overwriting position ", pos, " of sequence ", seq,
                     " needs a copy of shared block ", s->table[i], ", no block available"));
  }
  if (cow) CopyOnWrite(*s, i);
  if (sliding_cow) CopySlidingOnWrite(*s, i);
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
    const BlockId b = s.table[i];
    // An already hashed block (attached, or shared with a fork) keeps its entry; a duplicate of a
    // block that is already cached stays unhashed (the index keeps the first copy).
    if (!pool_->has_hash(b)) {
      pool_->RegisterHash(b, h, parent, s.extra_key, block_tokens);
    }
    // The sliding group's block of the same tokens, under the same hash in its own pool.
    if (has_sliding() && s.sliding_table[i] != kNullBlock &&
        !sliding_pool_->has_hash(s.sliding_table[i])) {
      sliding_pool_->RegisterHash(s.sliding_table[i], h, parent, s.extra_key, block_tokens);
    }
  }
}

void KvCache::ReleaseSlidingBlocks(Sequence& s) {
  const int32_t releasable = ReleasableSlidingBlocks(s.n_computed);
  // Last block first (as ReleaseTail): a released run's later blocks are evicted first.
  for (int32_t i = releasable - 1; i >= s.sliding_released; --i) {
    sliding_pool_->Release(s.sliding_table[static_cast<size_t>(i)]);
    s.sliding_table[static_cast<size_t>(i)] = kNullBlock;
    ++stats_.sliding_blocks_released;
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
  copy.table.reserve(src->table.size() + 1);
  copy.table.assign(src->table.begin(), src->table.end());
  copy.hashes = src->hashes;
  copy.sliding_table = src->sliding_table;
  copy.sliding_released = src->sliding_released;
  for (BlockId b : copy.table) pool_->Ref(b);
  for (BlockId b : copy.sliding_table) {
    if (b != kNullBlock) sliding_pool_->Ref(b);
  }
  const SeqId id = next_seq_id_++;
  seqs_.emplace(id, std::move(copy));
  return id;
}

void KvCache::ReleaseTail(Sequence& s, size_t keep_blocks) {
  // Last block first: the tail of a cached chain enters the LRU before its parents, so it is
  // evicted first.
  while (s.table.size() > keep_blocks) {
    pool_->Release(s.table.back());
    s.table.pop_back();
    if (!has_sliding()) continue;
    if (s.sliding_table.back() != kNullBlock) sliding_pool_->Release(s.sliding_table.back());
    s.sliding_table.pop_back();
  }
  if (has_sliding()) {
    s.sliding_released = std::min(s.sliding_released, static_cast<int32_t>(keep_blocks));
  }
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

absl::StatusOr<std::span<const BlockId>> KvCache::BlockTable(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return std::span<const BlockId>(s->table);
}

absl::StatusOr<std::span<const BlockId>> KvCache::SlidingBlockTable(SeqId seq) const {
  KILN_ASSIGN_OR_RETURN(const Sequence* s, Find(seq));
  return std::span<const BlockId>(s->sliding_table);
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
  out->sliding_indices.clear();
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
    out->sliding_indices.insert(out->sliding_indices.end(), s.sliding_table.begin(),
                                s.sliding_table.end());
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
  if (has_sliding()) {
    c.sliding_blocks_total = sliding_pool_->num_usable();
    c.sliding_blocks_free = sliding_pool_->num_free();
    c.sliding_blocks_cached = sliding_pool_->num_cached();
    c.sliding_blocks_used = sliding_pool_->num_used();
    c.sliding_block_bytes = layout().block_bytes(1);
    c.kv_bytes_in_use += static_cast<size_t>(c.sliding_blocks_used) * c.sliding_block_bytes;
  }
  // A shared block counts once, filled up to the furthest slot any holder uses.
  std::fill(fill_scratch_.begin(), fill_scratch_.end(), 0);
  for (const auto& [id, s] : seqs_) {
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    for (size_t i = 0; i < s.table.size(); ++i) {
      const int32_t filled = std::min(block_size_, len - static_cast<int32_t>(i) * block_size_);
      int32_t& f = fill_scratch_[s.table[i]];
      f = std::max(f, filled);
    }
  }
  for (int32_t f : fill_scratch_) c.filled_slots += f;
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
    for (BlockId b : s.table) {
      if (b <= kNullBlock || b >= pool_->num_blocks()) {
        return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " points at block ", b));
      }
      ++holders[b];
    }
  }
  for (BlockId b = 1; b < pool_->num_blocks(); ++b) {
    if (holders[b] != pool_->ref_count(b)) {
      return absl::InternalError(absl::StrCat("KvCache: block ", b, " has ref count ",
                                              pool_->ref_count(b), " but ", holders[b],
                                              " holders"));
    }
  }
  return has_sliding() ? CheckSlidingInvariants() : absl::OkStatus();
}

absl::Status KvCache::CheckSlidingInvariants() const {
  KILN_RETURN_IF_ERROR(sliding_pool_->CheckInvariants());
  std::vector<int32_t> holders(sliding_pool_->num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    if (s.sliding_table.size() != s.table.size() || s.sliding_released < 0 ||
        static_cast<size_t>(s.sliding_released) > s.table.size() ||
        s.sliding_released >
            BlocksBelowWindow(s.n_computed, layout().sliding_window(), 0, block_size_)) {
      return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " has ",
                                              s.sliding_table.size(), " sliding blocks (",
                                              s.sliding_released, " released) for ", s.table.size(),
                                              " blocks, ", s.n_computed, " computed"));
    }
    for (size_t i = 0; i < s.sliding_table.size(); ++i) {
      const BlockId b = s.sliding_table[i];
      const bool released = i < static_cast<size_t>(s.sliding_released);
      if (released ? b != kNullBlock : (b <= kNullBlock || b >= sliding_pool_->num_blocks())) {
        return absl::InternalError(absl::StrCat("KvCache: sequence ", id, " sliding block ", i,
                                                " is ", b, " (released: ", released, ")"));
      }
      if (!released) ++holders[b];
    }
  }
  for (BlockId b = 1; b < sliding_pool_->num_blocks(); ++b) {
    if (holders[b] != sliding_pool_->ref_count(b)) {
      return absl::InternalError(absl::StrCat("KvCache: sliding block ", b, " has ref count ",
                                              sliding_pool_->ref_count(b), " but ", holders[b],
                                              " holders"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
