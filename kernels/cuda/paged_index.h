// Index arithmetic shared by the CUDA paged-attention kernels and their host-side tests: which
// cache positions a token sees, where a position lives in the block pool, and how a token's
// visible rows are cut into split-K ranges. Plain C++ so that the same code runs in the kernels
// (nvcc) and in tests on a machine without a device (tests/unit/cuda_paged_index_test.cc).
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ inline
#else
#define KILN_HOST_DEVICE inline
#endif

namespace kiln::cuda {

// The attention mask in kiln's flat (CSR) form (lib/backend/attention_mask.h): token t of
// sequence seq[t] sees the positions [first_visible[t], n_visible[t]) and then
// extra_positions[extra_indptr[t] .. extra_indptr[t + 1]). Null first_visible: 0; null
// extra_indptr: no extras. Positions are numbered in that order (the prefix, then the extras).
struct VisibleRows {
  const int32_t* seq;              // [n_tokens]
  const int32_t* n_visible;        // [n_tokens]
  const int32_t* first_visible;    // [n_tokens] or null
  const int32_t* extra_indptr;     // [n_tokens + 1] or null
  const int32_t* extra_positions;  // [extra_indptr[n_tokens]]
};

// Number of rows token t sees (0 when its ranges are empty or inverted).
KILN_HOST_DEVICE int32_t VisibleCount(const VisibleRows& v, int32_t t) {
  const int32_t first = v.first_visible ? v.first_visible[t] : 0;
  const int32_t prefix = v.n_visible[t] > first ? v.n_visible[t] - first : 0;
  const int32_t extra = v.extra_indptr ? v.extra_indptr[t + 1] - v.extra_indptr[t] : 0;
  return prefix + (extra > 0 ? extra : 0);
}

// The logical position of token t's i-th visible row, 0 <= i < VisibleCount(v, t).
KILN_HOST_DEVICE int32_t VisiblePosition(const VisibleRows& v, int32_t t, int32_t i) {
  const int32_t first = v.first_visible ? v.first_visible[t] : 0;
  const int32_t prefix = v.n_visible[t] > first ? v.n_visible[t] - first : 0;
  return i < prefix ? first + i : v.extra_positions[v.extra_indptr[t] + (i - prefix)];
}

// The block tables (KvTables): sequence s owns the physical blocks
// indices[indptr[s] .. indptr[s + 1]), block_size token slots each.
struct BlockTables {
  const int32_t* indptr;   // [n_seqs + 1]
  const int32_t* indices;  // [indptr[n_seqs]]
  int32_t block_size;
  int32_t n_blocks;  // blocks in the pool (valid ids are [0, n_blocks))
};

// Physical block and slot of position `pos` of sequence `seq`; false when the position lies past
// the sequence's table or the table names a block outside the pool.
KILN_HOST_DEVICE bool LocatePosition(const BlockTables& bt, int32_t seq, int32_t pos,
                                     int32_t* block, int32_t* offset) {
  if (pos < 0 || bt.block_size <= 0) return false;
  const int32_t logical_block = pos / bt.block_size;
  if (logical_block >= bt.indptr[seq + 1] - bt.indptr[seq]) return false;
  const int32_t b = bt.indices[bt.indptr[seq] + logical_block];
  if (b < 0 || b >= bt.n_blocks) return false;
  *block = b;
  *offset = pos % bt.block_size;
  return true;
}

// Byte offset, from the pool's start, of the row of (block, slot) in the tile at tile_offset of
// every block: block * block_stride + tile_offset + slot * row_bytes (kv_layout.h).
KILN_HOST_DEVICE size_t RowByteOffset(int32_t block, int32_t slot, size_t block_stride,
                                      size_t tile_offset, size_t row_bytes) {
  return static_cast<size_t>(block) * block_stride + tile_offset +
         static_cast<size_t>(slot) * row_bytes;
}

// Split `split` of `n_splits` of n rows: [*begin, *end), contiguous, in order, sizes differing by
// at most one, together exactly [0, n). A split past the rows gets an empty range.
KILN_HOST_DEVICE void SplitRange(int32_t n, int32_t n_splits, int32_t split, int32_t* begin,
                                 int32_t* end) {
  const int32_t base = n / n_splits, rem = n % n_splits;
  *begin = split * base + (split < rem ? split : rem);
  *end = *begin + base + (split < rem ? 1 : 0);
}

// Floats of split-K workspace the attention kernel needs: per (token, head, split) the running
// max, the sum of exponentials and the unnormalized output [head_dim].
KILN_HOST_DEVICE size_t AttentionWorkspaceFloats(int64_t n_tokens, int32_t n_heads,
                                                 int32_t n_splits, int32_t head_dim) {
  return static_cast<size_t>(n_tokens) * static_cast<size_t>(n_heads) *
         static_cast<size_t>(n_splits) * (static_cast<size_t>(head_dim) + 2);
}

}  // namespace kiln::cuda
