// KvCache: the paged KV cache shared by all sessions of a model (the manager facade over
// BlockPool, see block_pool.h for block states and kv_layout.h for the bytes inside a block).
//
// Terms
//   sequence   one token stream (a session's conversation, a fork of it, a draft branch). It owns
//              a block table: logical block i -> physical block table[i], token slots
//              [i*bs, (i+1)*bs). Its length is the number of token slots it holds.
//   slot       (physical block, offset in block) where one token's K/V rows live.
//   computed   the first n_computed tokens of a sequence whose K/V the engine has written
//              (MarkComputed). Only full, computed blocks are hashed into the prefix cache;
//              computed positions are never rewritten.
//
// Lifecycle for the engine, per step:
//   seq = CreateSequence(extra_key);                   // once per request
//   n  = AttachCachedPrefix(seq, prompt[0 : len - 1]); // shares cached blocks, n % bs == 0
//   AppendSlots(seq, new_tokens, slots)                // room for the chunk; slots tell the
//                                                      // kernel where to write each token's K/V
//   BuildTables(batch_seqs, &tables)                   // flat CSR tables for attention
//   ... forward pass writes K/V into `slots`, reads through `tables` ...
//   MarkComputed(seq, n_done)                          // full blocks become cacheable
//   Truncate(seq, accepted_len)                        // speculative rollback
//   Free(seq)
//
// Copy-on-write: a block is written in place only when exactly one sequence holds it and it
// carries no prefix hash. Otherwise AppendSlots / PrepareOverwrite first copy it to a fresh block
// (one memcpy of block_bytes) and the sequence's table points at the copy.
//
// Layer groups (a layout made by KvLayout::WithSlidingGroups): each group's layers live in blocks
// of their own, all from the one pool, and a sequence has one block table per group, all of the
// same length. A copy-on-write, a prefix hash or a release acts on each group's block (the
// prefix index keys a group's blocks by the chained hash salted with the group). MarkComputed
// releases the sliding groups' blocks that every present and future token's window has left
// (ReleasableSlidingBlocks): their table entries become kNullBlock and the blocks go back to the
// pool, hashed ones as evictable cached blocks, for any group to reuse. A prefix-cache hit counts
// only as far as every group still finds its blocks (the sliding groups: their window's); a
// Truncate below what is released fails (FailedPrecondition: recompute the sequence).
//
// Failure: cache full is ResourceExhausted (the C API maps it to KILN_ERR_CACHE_FULL); the
// capacity is checked before anything is mutated, so a failing call leaves every sequence and
// every block exactly as it was; the caller may Free/Truncate (preempt) another sequence and
// retry. Unknown sequence ids and out-of-range positions are InvalidArgument.
//
// Thread-safety: not thread-safe. The engine's scheduler calls every method from one thread
// (many sessions share one cache through the engine). Kernels running on worker threads may read
// and write block memory through KeyPtr/ValuePtr/LatentPtr between calls, never during a
// mutating call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "lib/common/status.h"
#include "lib/kv/block_hash.h"
#include "lib/kv/block_pool.h"
#include "lib/kv/kv_layout.h"
#include "lib/kv/kv_storage.h"

namespace kiln {

using SeqId = int64_t;

// Where one token's K/V live. flat() = block * block_size + offset is the "slot mapping" index
// (a row index into the pool viewed as [n_blocks * block_size] token slots per tile).
struct KvSlot {
  BlockId block = kNullBlock;  // group 0's
  int32_t offset = 0;
  // With layer groups: the slot's block in groups 1, 2, ... (same offset); else kNullBlock.
  std::array<BlockId, KvLayout::kMaxGroups - 1> group_blocks{};
  BlockId group_block(int32_t group) const {
    return group == 0 ? block : group_blocks[static_cast<size_t>(group - 1)];
  }
  friend bool operator==(const KvSlot&, const KvSlot&) = default;
};

// Page tables for a batch of sequences, CSR style (FlashInfer's paged-KV format):
//   sequence j uses physical blocks indices[indptr[j] .. indptr[j+1]) in logical order;
//   last_page_len[j] = tokens in its last block, in [1, block_size] (0 for an empty sequence).
// The vectors are caller-owned and reused: BuildTables only clears and refills them, so a step
// allocates nothing once their capacity suffices.
struct KvTables {
  std::vector<int32_t> indptr;         // [n_seqs + 1]
  std::vector<int32_t> indices;        // [sum of blocks]
  std::vector<int32_t> last_page_len;  // [n_seqs]
  // With layer groups: groups 1, 2, ...'s blocks, same indptr (kNullBlock where released); else
  // empty.
  std::vector<std::vector<int32_t>> group_indices;  // [n_groups - 1][sum of blocks]
  const std::vector<int32_t>& indices_of(int32_t group) const {
    return group == 0 ? indices : group_indices[static_cast<size_t>(group - 1)];
  }
};

struct KvCacheOptions {
  // Pool size: exactly one of these is non-zero. num_blocks includes the reserved null block;
  // capacity_bytes is rounded down to whole blocks.
  int32_t num_blocks = 0;
  size_t capacity_bytes = 0;
  bool enable_prefix_caching = true;
  uint64_t hash_seed = 0;  // seeds the chained block hashes (block_hash.h)
  // Layouts with sliding groups: the rewind (tokens) that sliding blocks are kept for past the
  // window.
  int32_t sliding_release_margin = 0;
  // Where the blocks' bytes live (a backend's Backend::NewKvStorage); empty: host memory
  // (NewHostKvStorage).
  std::function<absl::StatusOr<std::unique_ptr<KvStorage>>(const KvLayout&, int32_t n_blocks)>
      storage = {};
};

struct KvCacheCounters {
  // Prefix cache, cumulative.
  int64_t prefix_lookups = 0;       // AttachCachedPrefix calls
  int64_t prefix_query_tokens = 0;  // tokens offered to AttachCachedPrefix
  int64_t prefix_hit_tokens = 0;    // tokens attached from the cache
  int64_t evictions = 0;            // cached blocks evicted to make room
  int64_t cow_copies = 0;           // blocks copied before a write (of every group)
  // Current state.
  int32_t blocks_total = 0;   // usable blocks (excluding the null block)
  int32_t blocks_free = 0;    // ref 0, no hash
  int32_t blocks_used = 0;    // held by at least one sequence
  int32_t blocks_cached = 0;  // ref 0, still in the prefix index (evictable)
  int32_t num_sequences = 0;
  int64_t filled_slots = 0;     // token slots of used blocks that some holder has filled
  int64_t allocated_slots = 0;  // blocks_used * block_size
  double utilization = 0.0;     // filled_slots / allocated_slots (1.0 when nothing is used)
  size_t bytes_per_token = 0;   // every layer's (what a token costs while nothing is released)
  size_t block_bytes = 0;       // every group's
  // The sliding groups (zero without them): the blocks they hold now (part of blocks_used) and
  // those released so far (cumulative) because every window had left them.
  int32_t sliding_blocks_used = 0;
  int64_t sliding_blocks_released = 0;
  size_t sliding_block_bytes = 0;  // block_bytes with sliding groups
  // K/V bytes held by sequences: blocks_used * block_bytes.
  size_t kv_bytes_in_use = 0;
};

class KvCache {
 public:
  // The llama.cpp order's attention scores a sliding window's rows from its first row rounded
  // down to a multiple of this (attention.cc), so those rows must stay readable too.
  static constexpr int32_t kSlidingRowAlignment = 16;

  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout,
                                                         const KvCacheOptions& options);

  const KvLayout& layout() const { return pool_->layout(); }
  int32_t block_size() const { return block_size_; }

  // --- Sequences -------------------------------------------------------------------------------
  // A new empty sequence. `extra_key` separates prefix caches that must not share K/V (model,
  // LoRA adapter, multimodal salt); forks inherit it.
  SeqId CreateSequence(uint64_t extra_key = 0);

  // On an empty sequence: attaches by reference the longest run of cached full blocks that
  // matches the start of `tokens` (each hit verified against stored token ids), and returns the
  // number of tokens attached (a multiple of block_size, <= tokens.size()). Those tokens count as
  // computed. Pass prompt[0 : len-1] when the last prompt token's logits are needed.
  // Errors: InvalidArgument (unknown seq), FailedPrecondition (sequence not empty).
  absl::StatusOr<int32_t> AttachCachedPrefix(SeqId seq, std::span<const int32_t> tokens);

  // Makes room for token_ids.size() new tokens at the end of `seq` (copy-on-write of a shared or
  // hashed last block, then fresh blocks) and records their ids. When `slots_out` is non-empty it
  // must have token_ids.size() entries and receives each new token's slot.
  // Errors: ResourceExhausted (cache full; nothing changed), InvalidArgument.
  absl::Status AppendSlots(SeqId seq, std::span<const int32_t> token_ids,
                           std::span<KvSlot> slots_out = {});

  // On an empty sequence: room for `token_ids` whose first n_computed tokens' K/V the caller
  // writes next (restoring a saved session), then MarkComputed(seq, n_computed). Like
  // AppendSlots, except that the sliding groups' leading blocks that n_computed computed tokens
  // would already have released are not allocated (their entries are kNullBlock).
  // Errors: ResourceExhausted (nothing changed), InvalidArgument, FailedPrecondition (not empty).
  absl::Status AppendSlotsForRestore(SeqId seq, std::span<const int32_t> token_ids,
                                     int32_t n_computed);

  // Prepares position `pos` (n_computed <= pos < length) for a new write of token `token_id`
  // (e.g. compacting accepted tree nodes): copies its block first when it is shared or hashed,
  // replaces the recorded token id, and returns the slot to write.
  // Errors: ResourceExhausted (copy needed, cache full; nothing changed), InvalidArgument.
  absl::StatusOr<KvSlot> PrepareOverwrite(SeqId seq, int32_t pos, int32_t token_id);

  // Declares that the K/V of the first `n_computed` tokens are written (n_computed in
  // [NumComputed, Length]); every full block inside becomes a prefix-cache entry (unless an
  // identical block is already cached).
  absl::Status MarkComputed(SeqId seq, int32_t n_computed);

  // A new sequence sharing every block of `seq` by reference (same tokens, length, computed
  // count, extra key). Never allocates blocks.
  absl::StatusOr<SeqId> Fork(SeqId seq);

  // Shrinks `seq` to new_len (0 <= new_len <= Length) and releases the blocks past it, last
  // block first (speculative rollback). Cached blocks released stay in the prefix cache.
  // FailedPrecondition (nothing changed) when new_len (> 0) needs sliding blocks already
  // released for its window: the caller truncates to 0 and recomputes the sequence instead.
  absl::Status Truncate(SeqId seq, int32_t new_len);

  // Releases every block of `seq` (last block first) and forgets the id.
  absl::Status Free(SeqId seq);

  absl::StatusOr<int32_t> Length(SeqId seq) const;
  absl::StatusOr<int32_t> NumComputed(SeqId seq) const;
  // Group 0's table, and any group's (kNullBlock where released); valid until the next call.
  absl::StatusOr<std::span<const BlockId>> BlockTable(SeqId seq, int32_t group = 0) const;
  // Leading blocks whose sliding-group entries are released (0 without sliding groups).
  absl::StatusOr<int32_t> SlidingBlocksReleased(SeqId seq) const;
  absl::StatusOr<std::span<const int32_t>> Tokens(SeqId seq) const;  // valid until next call
  absl::StatusOr<KvSlot> SlotOf(SeqId seq, int32_t pos) const;
  bool Contains(SeqId seq) const { return seqs_.contains(seq); }

  // Blocks AppendSlots(seq, n tokens) would take from the pool (every group's, including
  // copies-on-write).
  absl::StatusOr<int32_t> BlocksNeededToAppend(SeqId seq, int32_t n_tokens) const;
  int32_t NumAvailableBlocks() const { return pool_->num_available(); }
  int32_t NumBlocks() const { return pool_->num_blocks(); }  // including the null block
  // Leading blocks of a sequence with n_computed computed tokens whose sliding-layer K/V no
  // present or future token reads (its window, the margin, and kSlidingRowAlignment); 0 without
  // sliding groups.
  int32_t ReleasableSlidingBlocks(int32_t n_computed) const;

  // Fills `out` with the CSR tables of `seqs` in order (see KvTables). Validates every id first;
  // on error `out` is left empty.
  absl::Status BuildTables(std::span<const SeqId> seqs, KvTables* out) const;

  // --- Block memory ----------------------------------------------------------------------------
  // Start of [block_size, head_dim] tiles (kv_layout.h), where the storage's placement puts them.
  // Preconditions (assert only): valid physical block, GQA layout for Key/Value, MLA layout for
  // Latent, indices in range. False when the blocks are in device memory
  // (KvStorage::host_addressable): the tile and row pointers below are then device addresses.
  bool host_addressable() const { return storage_->host_addressable(); }
  const KvPlacement& placement() const { return storage_->placement(); }
  KvStorage& storage() { return *storage_; }
  // Key/Value: `b` is a block of the layer's group, KvSlot picks the right one (KvLayout).
  std::byte* KeyPtr(BlockId b, int32_t layer, int32_t kv_head) {
    return placement().Tile(b, layout().KeyTileIndex(layer, kv_head));
  }
  std::byte* ValuePtr(BlockId b, int32_t layer, int32_t kv_head) {
    return placement().Tile(b, layout().ValueTileIndex(layer, kv_head));
  }
  std::byte* LatentPtr(BlockId b, int32_t layer) {
    return placement().Tile(b, layout().LatentTileIndex(layer));
  }
  const std::byte* KeyPtr(BlockId b, int32_t layer, int32_t kv_head) const {
    return placement().Tile(b, layout().KeyTileIndex(layer, kv_head));
  }
  const std::byte* ValuePtr(BlockId b, int32_t layer, int32_t kv_head) const {
    return placement().Tile(b, layout().ValueTileIndex(layer, kv_head));
  }
  const std::byte* LatentPtr(BlockId b, int32_t layer) const {
    return placement().Tile(b, layout().LatentTileIndex(layer));
  }
  // Row of one token slot inside those tiles: [head_dim] (or [kv_lora_rank + rope_dim]).
  std::byte* KeyRow(KvSlot s, int32_t layer, int32_t kv_head) {
    return KeyPtr(LayerBlock(s, layer), layer, kv_head) + RowOffset(s);
  }
  std::byte* ValueRow(KvSlot s, int32_t layer, int32_t kv_head) {
    return ValuePtr(LayerBlock(s, layer), layer, kv_head) + RowOffset(s);
  }
  std::byte* LatentRow(KvSlot s, int32_t layer) { return LatentPtr(s.block, layer) + RowOffset(s); }
  const std::byte* KeyRow(KvSlot s, int32_t layer, int32_t kv_head) const {
    return KeyPtr(LayerBlock(s, layer), layer, kv_head) + RowOffset(s);
  }
  const std::byte* ValueRow(KvSlot s, int32_t layer, int32_t kv_head) const {
    return ValuePtr(LayerBlock(s, layer), layer, kv_head) + RowOffset(s);
  }
  const std::byte* LatentRow(KvSlot s, int32_t layer) const {
    return LatentPtr(s.block, layer) + RowOffset(s);
  }

  // --- Accounting and checks -------------------------------------------------------------------
  KvCacheCounters Counters() const;
  int32_t RefCount(BlockId b) const { return pool_->ref_count(b); }
  bool BlockHasHash(BlockId b) const { return pool_->has_hash(b); }
  std::vector<BlockId> CachedBlocksLruOrder() const { return pool_->LruOrder(); }
  // Pool invariants plus: every block's ref count equals the number of table entries pointing at
  // it, and no block is leaked (held by nobody yet not free or cached).
  absl::Status CheckInvariants() const;

 private:
  struct Sequence {
    uint64_t extra_key = 0;
    int32_t n_computed = 0;
    std::vector<int32_t> tokens;    // [length]
    std::vector<BlockId> table;     // [ceil(length / bs)] group 0's blocks
    std::vector<BlockHash> hashes;  // chained hashes of the first full computed blocks
    // With layer groups: [n_groups - 1][table.size()] groups 1, 2, ...'s blocks; the sliding
    // groups' first `sliding_released` are kNullBlock (released).
    std::vector<std::vector<BlockId>> group_tables;
    int32_t sliding_released = 0;
  };

  KvCache(std::unique_ptr<BlockPool> pool, std::unique_ptr<KvStorage> storage,
          const KvCacheOptions& options);
  int32_t n_groups() const { return layout().n_groups(); }
  bool has_sliding() const { return layout().sliding_window() > 0; }
  static std::vector<BlockId>& Table(Sequence& s, int32_t group) {
    return group == 0 ? s.table : s.group_tables[static_cast<size_t>(group - 1)];
  }
  static const std::vector<BlockId>& Table(const Sequence& s, int32_t group) {
    return group == 0 ? s.table : s.group_tables[static_cast<size_t>(group - 1)];
  }
  BlockId LayerBlock(KvSlot s, int32_t layer) const {
    return s.group_block(layout().layer_group(layer));
  }
  // A group's prefix-index key: the chained hash salted with the group (group 0: unchanged).
  static BlockHash GroupHash(const BlockHash& h, int32_t group);
  KvSlot SlotAt(const Sequence& s, int32_t pos) const;
  // Hashes the full computed blocks not yet hashed into the prefix index (every group).
  void RegisterComputedBlocks(Sequence& s);
  // Releases the sliding blocks ReleasableSlidingBlocks(n_computed) allows.
  void ReleaseSlidingBlocks(Sequence& s);
  absl::Status CheckGroupInvariants(SeqId id, const Sequence& s) const;
  absl::StatusOr<Sequence*> Find(SeqId seq);
  absl::StatusOr<const Sequence*> Find(SeqId seq) const;
  size_t RowOffset(KvSlot s) const { return static_cast<size_t>(s.offset) * layout().row_bytes(); }
  bool Writable(BlockId b) const { return pool_->ref_count(b) == 1 && !pool_->has_hash(b); }
  // Whether appending to `s` must first copy group `group`'s (partly filled) last block.
  bool NeedsCopyBeforeAppend(const Sequence& s, int32_t group) const {
    return s.tokens.size() % static_cast<size_t>(block_size_) != 0 &&
           !Writable(Table(s, group).back());
  }
  // Replaces group `group`'s table[i] with a private copy of its block. Precondition: a block is
  // available.
  void CopyOnWrite(Sequence& s, int32_t group, size_t i);
  void ReleaseTail(Sequence& s, size_t keep_blocks);
  BlockHash ParentHash(const Sequence& s, size_t block_index) const;

  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvStorage> storage_;
  int32_t release_margin_;
  int32_t block_size_;
  bool prefix_caching_;
  uint64_t hash_seed_;
  SeqId next_seq_id_ = 1;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  KvCacheCounters stats_;                         // the cumulative fields
  mutable std::vector<int32_t> fill_scratch_;     // [n_blocks], used by Counters()
  mutable std::vector<uint8_t> sliding_scratch_;  // [n_blocks], used by Counters()
};

}  // namespace kiln
