// CPU paged attention (GQA causal, tree and sliding-window masks) and MLA attention (absorbed
// and decompressed) against their plain references (ops_ref.h), plus the batch-invariance
// guarantees and bad-input errors. Tolerances are stated next to each comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/ops.h"
#include "lib/backend/cpu/ops_ref.h"
#include "lib/common/half.h"
#include "lib/quant/activation.h"
#include "tests/common/cpu_test_util.h"

namespace kiln::cpu {
namespace {

using kiln::testing::Levels;
using kiln::testing::RandomVector;

// ---- The llama.cpp order's kernels --------------------------------------------------------

// Whether a and b hold the same floats, bit for bit.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// n_rows rows of d random elements of `elem`, as the cache stores them (q8_0: whole blocks).
std::vector<uint8_t> RandomKvRows(KvElem elem, int64_t n_rows, int64_t d, std::mt19937& rng) {
  const std::vector<float> x = RandomVector(n_rows * d, rng, -2.0f, 2.0f);
  std::vector<uint8_t> out;
  auto put16 = [&](uint16_t h) { out.insert(out.end(), {uint8_t(h & 0xFF), uint8_t(h >> 8)}); };
  if (elem == KvElem::kF32) {
    out.resize(x.size() * 4);
    std::memcpy(out.data(), x.data(), out.size());
  } else if (elem == KvElem::kQ8_0) {
    std::uniform_int_distribution<int> q(-127, 127);
    for (int64_t b = 0; b < n_rows * d / 32; ++b) {
      put16(Fp32ToFp16(x[b] / 64));
      for (int i = 0; i < 32; ++i) out.push_back(static_cast<uint8_t>(q(rng)));
    }
  } else {
    for (float f : x) put16(elem == KvElem::kF16 ? Fp32ToFp16(f) : Fp32ToBf16(f));
  }
  return out;
}

// Every level's kv_scores_rows and kv_accumulate_rows (kiln's batch-invariant order) give the
// scalar definitions' bits: each element type, head counts up to 12 (both AVX-512 scores paths),
// row counts around the SIMD runs, column tails (accumulate; the SIMD scores take d % 16 == 0, as
// their callers guarantee), heads wider than the widened-row buffers (d 288), and chains that
// continue from a non-zero out.
TEST(BatchInvariantKernelsTest, SameBitsAtEveryLevel) {
  std::mt19937 rng(37);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  for (KvElem elem : {KvElem::kF32, KvElem::kF16, KvElem::kBf16, KvElem::kQ8_0}) {
    for (int64_t d :
         {int64_t{16}, int64_t{40}, int64_t{64}, int64_t{80}, int64_t{128}, int64_t{288}}) {
      if (elem == KvElem::kQ8_0 && d % 32 != 0) continue;
      for (int64_t n_q : {1, 2, 3, 4, 5, 7, 9, 12}) {
        for (int64_t n_rows : {1, 3, 4, 5, 17, 34}) {
          SCOPED_TRACE(::testing::Message() << "elem " << static_cast<int>(elem) << " d " << d
                                            << " n_q " << n_q << " rows " << n_rows);
          const std::vector<uint8_t> rows = RandomKvRows(elem, n_rows, d, rng);
          const int64_t row_bytes = static_cast<int64_t>(rows.size()) / n_rows;
          std::vector<const void*> row_ptrs;  // reversed: rows need not be contiguous or ordered
          for (int64_t r = n_rows - 1; r >= 0; --r) row_ptrs.push_back(rows.data() + r * row_bytes);
          const std::vector<float> q = RandomVector(n_q * d, rng, -2.0f, 2.0f);
          const int64_t stride = n_rows + 3;
          const std::vector<float> p = RandomVector(n_q * stride, rng, 0.0f, 1.0f);
          const std::vector<float> out0 = RandomVector(n_q * d, rng, -1.0f, 1.0f);
          const bool scores = d % 16 == 0;
          std::vector<float> scores_want(n_q * stride), out_want = out0;
          if (scores) {
            scalar.kv_scores_rows(q.data(), n_q, row_ptrs.data(), n_rows, elem, d,
                                  scores_want.data(), stride);
          }
          scalar.kv_accumulate_rows(out_want.data(), p.data(), stride, n_q, row_ptrs.data(), n_rows,
                                    elem, d);
          for (CpuLevel level : Levels()) {
            SCOPED_TRACE(CpuLevelName(level));
            const OpKernels& k = GetOpKernels(level);
            if (scores) {
              std::vector<float> s(n_q * stride);
              k.kv_scores_rows(q.data(), n_q, row_ptrs.data(), n_rows, elem, d, s.data(), stride);
              EXPECT_TRUE(SameBits(s, scores_want)) << "kv_scores_rows";
            }
            std::vector<float> out = out0;
            k.kv_accumulate_rows(out.data(), p.data(), stride, n_q, row_ptrs.data(), n_rows, elem,
                                 d);
            EXPECT_TRUE(SameBits(out, out_want)) << "kv_accumulate_rows";
          }
        }
      }
    }
  }
}

// Every level's kv_scores_rows_q8_0 gives the scalar definition's bits: head counts and row
// counts around the 16-row passes, odd block counts (d 96, 288), and the int8 extremes (K rows of
// -128 and of 127, query blocks of -127 and 127) where unsigned-times-signed tricks overflow.
TEST(BatchInvariantKernelsTest, Q8_0ScoresSameBitsAtEveryLevel) {
  std::mt19937 rng(41);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  for (int64_t d : {int64_t{32}, int64_t{64}, int64_t{96}, int64_t{128}, int64_t{288}}) {
    for (int64_t n_q : {1, 3, 4, 9, 24}) {
      for (int64_t n_rows : {1, 5, 16, 17, 40}) {
        SCOPED_TRACE(::testing::Message() << "d " << d << " n_q " << n_q << " rows " << n_rows);
        std::vector<uint8_t> rows = RandomKvRows(KvElem::kQ8_0, n_rows, d, rng);
        const int64_t row_bytes = d / 32 * 34;
        for (int64_t b = 0; b < d / 32; ++b) {  // rows 0 and 1: every int8 at an extreme
          std::memset(rows.data() + b * 34 + 2, 0x80, 32);
          if (n_rows > 1) std::memset(rows.data() + row_bytes + b * 34 + 2, 0x7F, 32);
        }
        std::vector<const void*> row_ptrs;
        for (int64_t r = n_rows - 1; r >= 0; --r) row_ptrs.push_back(rows.data() + r * row_bytes);
        std::vector<float> q = RandomVector(n_q * d, rng, -2.0f, 2.0f);
        for (int64_t i = 0; i < d; ++i) q[i] = i < 32 ? -1.5f : 1.5f;  // head 0: q of -127, 127
        std::vector<uint8_t> q8(n_q * row_bytes);
        ActivationQuantizer(GgmlType::kQ8_0, CpuLevel::kScalar)(q.data(), q8.data(), n_q * d);
        const int64_t stride = n_rows + 2;
        std::vector<float> want(n_q * stride, -3.0f);
        scalar.kv_scores_rows_q8_0(q8.data(), n_q, row_ptrs.data(), n_rows, d, want.data(), stride);
        for (CpuLevel level : Levels()) {
          SCOPED_TRACE(CpuLevelName(level));
          std::vector<float> got(n_q * stride, -3.0f);
          GetOpKernels(level).kv_scores_rows_q8_0(q8.data(), n_q, row_ptrs.data(), n_rows, d,
                                                  got.data(), stride);
          EXPECT_TRUE(SameBits(got, want));
        }
      }
    }
  }
}

// Every level's kv_scores, kv_accumulate, kv_accumulate_groups, reduce_lanes and round_f16 give
// the scalar definitions' bits: each element type, both lane counts, column tails, lane offsets
// that wrap, and (round_f16) ties, subnormals, overflow and NaN.
TEST(LlamaOrderKernelsTest, SameBitsAtEveryLevel) {
  std::mt19937 rng(31);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  for (KvElem elem : {KvElem::kF32, KvElem::kF16, KvElem::kBf16, KvElem::kQ8_0}) {
    for (int64_t n_lanes : {kAttnLanes, kAttnLanesTinyBlas}) {
      for (int64_t d : {int64_t{8}, int64_t{36}, int64_t{64}, int64_t{80}, int64_t{192}}) {
        if (elem == KvElem::kQ8_0 && d % 32 != 0) continue;
        SCOPED_TRACE(::testing::Message()
                     << "elem " << static_cast<int>(elem) << " lanes " << n_lanes << " d " << d);
        const int64_t n_rows = 96, n_q = 3;
        const std::vector<uint8_t> rows = RandomKvRows(elem, n_rows, d, rng);
        const int64_t row_bytes = static_cast<int64_t>(rows.size()) / n_rows;
        const std::vector<float> q = RandomVector(n_q * d, rng, -2.0f, 2.0f);
        const std::vector<float> p = RandomVector(n_rows, rng, 0.0f, 1.0f);
        const std::vector<float> acc0 = RandomVector(kAttnLanes * d, rng, -1.0f, 1.0f);
        std::vector<const void*> groups;  // runs of 16 rows in index order
        for (int64_t r = 0; r < n_rows / 16; ++r)
          groups.push_back(rows.data() + 16 * r * row_bytes);
        // The callers pass kv_scores whole lane steps only (attention.cc, matmul_llama_cpp.cc).
        const bool scores = d % (n_lanes == kAttnLanes ? 64 : 16) == 0;
        std::vector<float> scores_want(n_q * n_rows), acc_want = acc0, groups_want = acc0,
                                                      reduced_want(d);
        if (scores) {
          scalar.kv_scores(q.data(), n_q, rows.data(), n_rows, elem, d, n_lanes, scores_want.data(),
                           n_rows);
        }
        scalar.kv_accumulate(acc_want.data(), p.data(), rows.data(), n_rows, 13, n_lanes, elem, d);
        scalar.kv_accumulate_groups(groups_want.data(), p.data(), groups.data(),
                                    static_cast<int64_t>(groups.size()), n_lanes, elem, d);
        scalar.reduce_lanes(acc_want.data(), n_lanes, d, reduced_want.data());
        for (CpuLevel level : Levels()) {
          SCOPED_TRACE(CpuLevelName(level));
          const OpKernels& k = GetOpKernels(level);
          if (scores) {
            std::vector<float> s(n_q * n_rows);
            k.kv_scores(q.data(), n_q, rows.data(), n_rows, elem, d, n_lanes, s.data(), n_rows);
            EXPECT_TRUE(SameBits(s, scores_want)) << "kv_scores";
          }
          std::vector<float> acc = acc0, grouped = acc0, reduced(d);
          k.kv_accumulate(acc.data(), p.data(), rows.data(), n_rows, 13, n_lanes, elem, d);
          EXPECT_TRUE(SameBits(acc, acc_want)) << "kv_accumulate";
          k.kv_accumulate_groups(grouped.data(), p.data(), groups.data(),
                                 static_cast<int64_t>(groups.size()), n_lanes, elem, d);
          EXPECT_TRUE(SameBits(grouped, groups_want)) << "kv_accumulate_groups";
          k.reduce_lanes(acc_want.data(), n_lanes, d, reduced.data());
          EXPECT_TRUE(SameBits(reduced, reduced_want)) << "reduce_lanes";
        }
      }
    }
  }
  // round_f16: a NaN becomes the quiet NaN with its sign at every level.
  std::vector<float> x = RandomVector(37, rng, -70000.0f, 70000.0f);
  for (float v : {65504.0f, 65520.0f, 65519.996f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 6e-8f,
                  2.9e-8f, 3e-8f, -0.0f, std::numeric_limits<float>::infinity()}) {
    x.push_back(v);
  }
  std::vector<float> with_nan = x;
  with_nan[3] = std::numeric_limits<float>::quiet_NaN();
  with_nan[20] = -std::numeric_limits<float>::signaling_NaN();
  for (const std::vector<float>& in : {x, with_nan}) {
    std::vector<float> want = in;
    scalar.round_f16(want.data(), static_cast<int64_t>(want.size()));
    for (CpuLevel level : Levels()) {
      std::vector<float> got = in;
      GetOpKernels(level).round_f16(got.data(), static_cast<int64_t>(got.size()));
      EXPECT_TRUE(SameBits(got, want)) << "round_f16 " << CpuLevelName(level);
    }
  }
}

// ---- Paged attention ----------------------------------------------------------------------

// A paged cache with 2 layers; attention reads layer 1. Per physical block region: for each
// layer, the K tiles of all kv heads then the V tiles, each tile [block_size, head_dim] plus
// `pad` bytes, so every stride differs from the packed size.
struct TestCache {
  int32_t n_kv_heads, head_dim, block_size, n_blocks;
  GgmlType type;
  size_t row_bytes, tile, region;
  std::vector<uint8_t> bytes;

  TestCache(int32_t kvh, int32_t d, int32_t bs, int32_t nb, GgmlType t)
      : n_kv_heads(kvh), head_dim(d), block_size(bs), n_blocks(nb), type(t) {
    row_bytes = t == GgmlType::kQ8_0 ? d / 32 * 34 : d * (t == GgmlType::kF32 ? 4 : 2);
    tile = bs * row_bytes + 32;
    region = 2 * (2 * kvh * tile) + 64;
    bytes.assign(region * nb, 0xFF);  // NaN garbage wherever nothing was written
  }
  uint8_t* Row(bool is_v, int32_t block, int32_t h, int32_t row) {
    return bytes.data() + block * region + 1 * (2 * n_kv_heads * tile) +
           (is_v ? n_kv_heads * tile : 0) + h * tile + row * row_bytes;
  }
  // Stores x[0 .. head_dim) as the cache type (q8_0 as the backend's WriteKv rounds it) and
  // writes the stored values, widened to f32, to rounded[].
  void PutRow(uint8_t* row, const float* x, float* rounded) {
    if (type == GgmlType::kQ8_0) {
      ActivationQuantizer(GgmlType::kQ8_0, CpuLevel::kScalar)(x, row, head_dim);
      GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar)->dequantize(row, rounded, head_dim);
      return;
    }
    for (int32_t i = 0; i < head_dim; ++i) {
      if (type == GgmlType::kF32) {
        std::memcpy(row + 4 * i, &x[i], 4);
        rounded[i] = x[i];
        continue;
      }
      const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
      std::memcpy(row + 2 * i, &h, 2);
      rounded[i] = type == GgmlType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
  PagedKvView View() const {
    PagedKvView kv;
    const uint8_t* layer1 = bytes.data() + 2 * n_kv_heads * tile;
    kv.k = {layer1, type, static_cast<int64_t>(region), static_cast<int64_t>(tile)};
    kv.v = {layer1 + n_kv_heads * tile, type, static_cast<int64_t>(region),
            static_cast<int64_t>(tile)};
    kv.block_size = block_size;
    kv.n_kv_heads = n_kv_heads;
    kv.head_dim = head_dim;
    kv.n_blocks = n_blocks;
    return kv;
  }
};

// One sequence's logical K/V, kept contiguous as f32 ([len, n_kv_heads, d]) for the reference.
struct SeqKv {
  std::vector<float> k, v;
  std::vector<int32_t> blocks;
};

// Block ids 0 .. n - 1 in a random order: WriteSequence takes its blocks from the back.
std::vector<int32_t> ShuffledBlockIds(int32_t n, std::mt19937& rng) {
  std::vector<int32_t> ids(n);
  for (int32_t i = 0; i < n; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// Writes `len` random positions of a new sequence into free blocks taken from `free_blocks`.
SeqKv WriteSequence(TestCache& cache, int32_t len, std::vector<int32_t>& free_blocks,
                    std::mt19937& rng) {
  SeqKv s;
  const int32_t n_blocks = (len + cache.block_size - 1) / cache.block_size;
  for (int32_t b = 0; b < n_blocks; ++b) {
    s.blocks.push_back(free_blocks.back());
    free_blocks.pop_back();
  }
  const int32_t kvh = cache.n_kv_heads, d = cache.head_dim;
  s.k.resize(static_cast<size_t>(len) * kvh * d);
  s.v.resize(s.k.size());
  for (int32_t p = 0; p < len; ++p) {
    const int32_t block = s.blocks[p / cache.block_size], row = p % cache.block_size;
    for (int32_t h = 0; h < kvh; ++h) {
      const std::vector<float> k = RandomVector(d, rng), v = RandomVector(d, rng);
      cache.PutRow(cache.Row(false, block, h, row), k.data(), s.k.data() + (p * kvh + h) * d);
      cache.PutRow(cache.Row(true, block, h, row), v.data(), s.v.data() + (p * kvh + h) * d);
    }
  }
  return s;
}

struct AttnShape {
  int32_t n_heads, n_kv_heads, head_dim, block_size;
};

// What kiln's batch-invariant order multiplies K by: q as it is, or for a q8_0 cache q on the
// Q8_0 grid (head_dim % 32 == 0, so no block spans two heads).
std::vector<float> QueryAsScored(const float* q, int64_t n, GgmlType cache_type) {
  if (cache_type == GgmlType::kQ8_0) return testing::OnQ8_0Grid(q, n);
  return std::vector<float>(q, q + n);
}

TEST(PagedAttentionTest, CausalMatchesContiguousReferenceAndIsBatchInvariant) {
  std::mt19937 rng(8);
  ThreadPool pool1(1), pool2(2);
  Scratch scratch;
  const AttnShape shapes[] = {
      {4, 4, 64, 16},  {9, 3, 64, 16},  {8, 1, 32, 5}, {6, 2, 80, 7},
      {12, 1, 64, 16}, {4, 2, 320, 16}, {6, 3, 72, 8}};  // 320: wider than the widening buffer
  for (const AttnShape& sh : shapes) {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
      // q8_0 rows are whole blocks of 32 (the reference reads the rows widened to f32, which
      // the kernels reproduce exactly: scale x int8 is exact in f32).
      if (type == GgmlType::kQ8_0 && sh.head_dim % 32 != 0) continue;
      SCOPED_TRACE(::testing::Message()
                   << "heads " << sh.n_heads << "/" << sh.n_kv_heads << " d " << sh.head_dim
                   << " bs " << sh.block_size << " " << GgmlTypeName(static_cast<uint32_t>(type)));
      TestCache cache(sh.n_kv_heads, sh.head_dim, sh.block_size, 64, type);
      std::vector<int32_t> free_blocks = ShuffledBlockIds(64, rng);
      // Three sequences; the batch holds a prefill chunk of seq 0, one decode token of seq 1
      // and two of seq 2 (positions chosen to cross block boundaries).
      const int32_t lens[] = {37, 1, 50};
      std::vector<SeqKv> seqs;
      std::vector<int32_t> indptr = {0}, indices;
      for (int32_t len : lens) {
        seqs.push_back(WriteSequence(cache, len, free_blocks, rng));
        indices.insert(indices.end(), seqs.back().blocks.begin(), seqs.back().blocks.end());
        indptr.push_back(static_cast<int32_t>(indices.size()));
      }
      std::vector<int32_t> seq_of, pos;
      for (int32_t p = 30; p < 37; ++p) seq_of.push_back(0), pos.push_back(p);
      seq_of.push_back(1), pos.push_back(0);
      seq_of.push_back(2), pos.push_back(15);
      seq_of.push_back(2), pos.push_back(49);
      std::vector<int32_t> n_visible;
      for (int32_t p : pos) n_visible.push_back(p + 1);
      const int32_t n_tokens = static_cast<int32_t>(seq_of.size());
      const int64_t qsize = static_cast<int64_t>(sh.n_heads) * sh.head_dim;
      const std::vector<float> q = RandomVector(n_tokens * qsize, rng, -2.0f, 2.0f);
      AttentionBatch batch{seq_of, indptr, indices, n_visible, {}, {}};
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));

      std::vector<float> out2(n_tokens * qsize), out1(out2.size());
      ASSERT_TRUE(
          PagedAttention(pool2, cache.View(), batch, q.data(), sh.n_heads, out2.data(), 0, scratch)
              .ok());
      ASSERT_TRUE(
          PagedAttention(pool1, cache.View(), batch, q.data(), sh.n_heads, out1.data(), 0, scratch)
              .ok());
      EXPECT_EQ(0, std::memcmp(out1.data(), out2.data(), out1.size() * 4)) << "1 vs 2 threads";

      for (int32_t t = 0; t < n_tokens; ++t) {
        // Reference over the contiguous copy: |diff| <= 2e-5 (f32 online softmax vs double). The
        // default (batch-invariant) order keeps q and the softmax weights in f32, also with an
        // f16 cache (no rounding to f16 on either side); a q8_0 cache's K meets q in Q8_0 blocks.
        std::vector<int32_t> visible(n_visible[t]);
        for (int32_t j = 0; j < n_visible[t]; ++j) visible[j] = j;
        std::vector<float> expect(qsize);
        const SeqKv& s = seqs[seq_of[t]];
        ref::Attention(QueryAsScored(q.data() + t * qsize, qsize, type).data(), sh.n_heads,
                       sh.n_kv_heads, sh.head_dim, s.k.data(), s.v.data(), visible, scale,
                       expect.data(), /*round_to_f16=*/false);
        for (int64_t i = 0; i < qsize; ++i) {
          ASSERT_NEAR(out2[t * qsize + i], expect[i], 2e-5f) << "token " << t << " i " << i;
        }
        // The token alone in a batch gives the same bits.
        const std::vector<int32_t> one_seq = {seq_of[t]}, one_nv = {n_visible[t]};
        AttentionBatch single{one_seq, indptr, indices, one_nv, {}, {}};
        std::vector<float> alone(qsize);
        ASSERT_TRUE(PagedAttention(pool2, cache.View(), single, q.data() + t * qsize, sh.n_heads,
                                   alone.data(), 0, scratch)
                        .ok());
        EXPECT_EQ(0, std::memcmp(alone.data(), out2.data() + t * qsize, qsize * 4))
            << "token " << t << " alone vs in the batch";
      }
      // Every SIMD level computes the same bits, in every order.
      for (AttentionOrder order : {AttentionOrder::kBatchInvariant, AttentionOrder::kLlamaCppDecode,
                                   AttentionOrder::kLlamaCppPrompt}) {
        std::vector<float> want(out2.size());
        ASSERT_TRUE(PagedAttention(pool2, cache.View(), batch, q.data(), sh.n_heads, want.data(), 0,
                                   scratch, order, CpuLevel::kScalar)
                        .ok());
        for (CpuLevel level : Levels()) {
          std::vector<float> out_l(out2.size());
          ASSERT_TRUE(PagedAttention(pool2, cache.View(), batch, q.data(), sh.n_heads, out_l.data(),
                                     0, scratch, order, level)
                          .ok());
          EXPECT_EQ(0, std::memcmp(out_l.data(), want.data(), want.size() * 4))
              << CpuLevelName(level) << " order " << static_cast<int>(order);
        }
        if (order == AttentionOrder::kBatchInvariant) {
          EXPECT_EQ(0, std::memcmp(want.data(), out2.data(), want.size() * 4));
        }
      }
    }
  }
}

TEST(PagedAttentionTest, TreeMaskEqualsEachRootToNodePath) {
  std::mt19937 rng(9);
  ThreadPool pool(2);
  Scratch scratch;
  const int32_t n_heads = 6, n_kv = 2, d = 64, bs = 4, prefix = 10;
  // Tree of 8 nodes over the committed prefix:   0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5}, 5 -> {7};
  // node 6 is a second root.
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 1, 2, -1, 5};
  const int32_t n_nodes = static_cast<int32_t>(parent.size());
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    TestCache cache(n_kv, d, bs, 64, type);
    std::vector<int32_t> free_blocks(64);
    for (int32_t i = 0; i < 64; ++i) free_blocks[i] = 63 - i;
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    // The sequence: prefix positions [0, 10), tree node i at slot 10 + i.
    const SeqKv seq = WriteSequence(cache, prefix + n_nodes, free_blocks, rng);
    std::vector<int32_t> slot(n_nodes);
    for (int32_t i = 0; i < n_nodes; ++i) slot[i] = prefix + i;
    std::vector<int32_t> extra_indptr, extra_pos;
    ASSERT_TRUE(BuildTreeVisibility(parent, slot, extra_indptr, extra_pos).ok());
    ASSERT_EQ(extra_indptr.size(), static_cast<size_t>(n_nodes + 1));
    // Node 7's list: slots of 0, 2, 5, 7.
    EXPECT_EQ(std::vector<int32_t>(extra_pos.begin() + extra_indptr[7], extra_pos.end()),
              (std::vector<int32_t>{10, 12, 15, 17}));

    const std::vector<int32_t> indptr = {0, static_cast<int32_t>(seq.blocks.size())};
    const std::vector<int32_t> seq_of(n_nodes, 0), n_visible(n_nodes, prefix);
    const int64_t qsize = n_heads * d;
    const std::vector<float> q = RandomVector(n_nodes * qsize, rng, -2.0f, 2.0f);
    AttentionBatch batch{seq_of, indptr, seq.blocks, n_visible, extra_indptr, extra_pos};
    std::vector<float> out(n_nodes * qsize);
    ASSERT_TRUE(
        PagedAttention(pool, cache.View(), batch, q.data(), n_heads, out.data(), 0, scratch).ok());

    for (int32_t node = 0; node < n_nodes; ++node) {
      SCOPED_TRACE(::testing::Message() << "node " << node);
      // Path root -> node.
      std::vector<int32_t> path;
      for (int32_t n = node; n >= 0; n = parent[n]) path.insert(path.begin(), n);
      // A separate sequence holding prefix + path contiguously, attended causally.
      TestCache solo(n_kv, d, bs, 16, type);
      std::vector<int32_t> solo_free(16);
      for (int32_t i = 0; i < 16; ++i) solo_free[i] = i;
      const int32_t len = prefix + static_cast<int32_t>(path.size());
      SeqKv solo_seq = WriteSequence(solo, len, solo_free, rng);  // then overwrite with the data
      std::vector<int32_t> src_pos;
      for (int32_t p = 0; p < prefix; ++p) src_pos.push_back(p);
      for (int32_t n : path) src_pos.push_back(slot[n]);
      // The rows' bytes copied as they are (the stored values, whatever the type).
      for (int32_t p = 0; p < len; ++p) {
        const int32_t block = solo_seq.blocks[p / bs], row = p % bs;
        const int32_t src_block = seq.blocks[src_pos[p] / bs], src_row = src_pos[p] % bs;
        for (int32_t h = 0; h < n_kv; ++h) {
          for (bool is_v : {false, true}) {
            std::memcpy(solo.Row(is_v, block, h, row), cache.Row(is_v, src_block, h, src_row),
                        cache.row_bytes);
          }
        }
      }
      const std::vector<int32_t> s_indptr = {0, static_cast<int32_t>(solo_seq.blocks.size())};
      const std::vector<int32_t> s_seq = {0}, s_nv = {len};
      AttentionBatch causal{s_seq, s_indptr, solo_seq.blocks, s_nv, {}, {}};
      std::vector<float> expect(qsize);
      ASSERT_TRUE(PagedAttention(pool, solo.View(), causal, q.data() + node * qsize, n_heads,
                                 expect.data(), 0, scratch)
                      .ok());
      for (int64_t i = 0; i < qsize; ++i) {
        // Same math, different run boundaries of the online softmax: |diff| <= 1e-5.
        ASSERT_NEAR(out[node * qsize + i], expect[i], 1e-5f) << "i " << i;
      }
      // And the double-precision reference over the visible slots (the default order keeps q
      // and the softmax weights in f32; q8_0 K meets q in Q8_0 blocks).
      std::vector<float> ref_out(qsize);
      ref::Attention(QueryAsScored(q.data() + node * qsize, qsize, type).data(), n_heads, n_kv, d,
                     seq.k.data(), seq.v.data(), src_pos, 1.0f / 8.0f, ref_out.data(),
                     /*round_to_f16=*/false);
      for (int64_t i = 0; i < qsize; ++i) ASSERT_NEAR(out[node * qsize + i], ref_out[i], 2e-5f);
    }
  }
}

// Sliding windows (first_visible): each token sees [first_visible, n_visible) of its sequence.
// Every order against the contiguous reference over exactly those rows (f32 cache: 2e-5), the
// batch-invariant order equal to the token alone, and every SIMD level equal to scalar.
TEST(PagedAttentionTest, SlidingWindowSeesOnlyItsWindow) {
  std::mt19937 rng(10);
  ThreadPool pool(2);
  Scratch scratch;
  for (const AttnShape& sh : {AttnShape{4, 1, 64, 16}, AttnShape{6, 2, 32, 5}}) {
    SCOPED_TRACE(::testing::Message() << "bs " << sh.block_size);
    TestCache cache(sh.n_kv_heads, sh.head_dim, sh.block_size, 64, GgmlType::kF32);
    std::vector<int32_t> free_blocks = ShuffledBlockIds(64, rng);
    const SeqKv s = WriteSequence(cache, 90, free_blocks, rng);
    const std::vector<int32_t> indptr = {0, static_cast<int32_t>(s.blocks.size())};
    const int32_t window = 12;
    // A prompt chunk that crosses the window's start, and a late decode token.
    std::vector<int32_t> seq_of, n_visible, first;
    for (int32_t p : {3, 10, 11, 12, 13, 30, 31, 32, 33, 34, 35, 36, 37, 89}) {
      seq_of.push_back(0);
      n_visible.push_back(p + 1);
      first.push_back(std::max(0, p + 1 - window));
    }
    const int32_t n_tokens = static_cast<int32_t>(seq_of.size());
    const int64_t qsize = static_cast<int64_t>(sh.n_heads) * sh.head_dim;
    const std::vector<float> q = RandomVector(n_tokens * qsize, rng, -2.0f, 2.0f);
    AttentionBatch batch{seq_of, indptr, s.blocks, n_visible, {}, {}, first};
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
    for (AttentionOrder order : {AttentionOrder::kBatchInvariant, AttentionOrder::kLlamaCppDecode,
                                 AttentionOrder::kLlamaCppPrompt}) {
      SCOPED_TRACE(static_cast<int>(order));
      std::vector<float> out(n_tokens * qsize), want(out.size());
      ASSERT_TRUE(PagedAttention(pool, cache.View(), batch, q.data(), sh.n_heads, out.data(), 0,
                                 scratch, order)
                      .ok());
      ASSERT_TRUE(PagedAttention(pool, cache.View(), batch, q.data(), sh.n_heads, want.data(), 0,
                                 scratch, order, CpuLevel::kScalar)
                      .ok());
      EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 4)) << "level vs scalar";
      for (int32_t t = 0; t < n_tokens; ++t) {
        std::vector<int32_t> visible;
        for (int32_t j = first[t]; j < n_visible[t]; ++j) visible.push_back(j);
        std::vector<float> expect(qsize);
        ref::Attention(q.data() + t * qsize, sh.n_heads, sh.n_kv_heads, sh.head_dim, s.k.data(),
                       s.v.data(), visible, scale, expect.data());
        for (int64_t i = 0; i < qsize; ++i) {
          ASSERT_NEAR(out[t * qsize + i], expect[i], 2e-5f) << "token " << t << " i " << i;
        }
        if (order != AttentionOrder::kBatchInvariant) continue;
        const std::vector<int32_t> one_seq = {0}, one_nv = {n_visible[t]}, one_first = {first[t]};
        AttentionBatch single{one_seq, indptr, s.blocks, one_nv, {}, {}, one_first};
        std::vector<float> alone(qsize);
        ASSERT_TRUE(PagedAttention(pool, cache.View(), single, q.data() + t * qsize, sh.n_heads,
                                   alone.data(), 0, scratch)
                        .ok());
        EXPECT_EQ(0, std::memcmp(alone.data(), out.data() + t * qsize, qsize * 4))
            << "token " << t << " alone vs in the batch";
      }
    }
  }
  // A window start past the visible end, and a short first_visible, are errors.
  TestCache cache(1, 32, 4, 4, GgmlType::kF32);
  const std::vector<float> q(32, 0.1f);
  std::vector<float> out(32);
  const std::vector<int32_t> seq = {0}, indptr = {0, 2}, indices = {1, 3}, nv = {8}, bad = {9};
  absl::Status st = PagedAttention(pool, cache.View(), {seq, indptr, indices, nv, {}, {}, bad},
                                   q.data(), 1, out.data(), 0, scratch);
  EXPECT_NE(st.message().find("first_visible[0] = 9"), std::string::npos) << st;
  const std::vector<int32_t> two = {0, 0};
  st = PagedAttention(pool, cache.View(), {seq, indptr, indices, nv, {}, {}, two}, q.data(), 1,
                      out.data(), 0, scratch);
  EXPECT_NE(st.message().find("first_visible has 2 entries"), std::string::npos) << st;
}

// A decode token with long context and kv heads that do not divide among the threads is split
// by rows (scores) and by columns (V . P) over the threads; one thread never splits. The bits
// must be the same at every thread count and level, with windows and tree extras, and near the
// contiguous reference.
TEST(PagedAttentionTest, DecodeSplitOverThreadsGivesTheSameBits) {
  std::mt19937 rng(11);
  ThreadPool pool1(1), pool2(2), pool3(3), pool4(4);
  Scratch scratch;
  // (9, 3, 64): the default model (split on 2 and 4 threads, whole heads on 3); (4, 1, 256):
  // Gemma 3 270M (on 2, 3 and 4); d 72: no column split; 2 kv heads split on 3 and 4 threads.
  const AttnShape shapes[] = {{9, 3, 64, 16}, {4, 1, 256, 16}, {6, 3, 72, 8}, {8, 2, 32, 16}};
  for (const AttnShape& sh : shapes) {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
      if (type == GgmlType::kQ8_0 && sh.head_dim % 32 != 0) continue;
      SCOPED_TRACE(::testing::Message()
                   << "heads " << sh.n_heads << "/" << sh.n_kv_heads << " d " << sh.head_dim << " "
                   << GgmlTypeName(static_cast<uint32_t>(type)));
      const int32_t len = 700, n_blocks = (len + sh.block_size - 1) / sh.block_size;
      TestCache cache(sh.n_kv_heads, sh.head_dim, sh.block_size, n_blocks, type);
      std::vector<int32_t> free_blocks = ShuffledBlockIds(n_blocks, rng);
      const SeqKv s = WriteSequence(cache, len, free_blocks, rng);
      const std::vector<int32_t> one_seq = {0}, indptr = {0, n_blocks};
      const int64_t qsize = static_cast<int64_t>(sh.n_heads) * sh.head_dim;
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
      struct Case {
        int32_t n_visible, first;
        std::vector<int32_t> extras;
      };
      // Causal at 32 (the split's threshold), 33, 256 and 700; a 300-row window; a tree node
      // after a 600-token prefix.
      const Case cases[] = {{32, 0, {}},  {33, 0, {}},    {256, 0, {}},
                            {700, 0, {}}, {650, 350, {}}, {600, 0, {610, 650, 699}}};
      for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message() << "n_visible " << c.n_visible << " first " << c.first
                                          << " extras " << c.extras.size());
        const std::vector<int32_t> nv = {c.n_visible}, first = {c.first};
        const std::vector<int32_t> extra_indptr = {0, static_cast<int32_t>(c.extras.size())};
        AttentionBatch batch{one_seq, indptr, s.blocks, nv, {}, {}, first};
        if (!c.extras.empty()) {
          batch.extra_indptr = extra_indptr;
          batch.extra_positions = c.extras;
        }
        const std::vector<float> q = RandomVector(qsize, rng, -2.0f, 2.0f);
        std::vector<float> want(qsize);
        ASSERT_TRUE(PagedAttention(pool1, cache.View(), batch, q.data(), sh.n_heads, want.data(), 0,
                                   scratch)
                        .ok());
        std::vector<int32_t> visible;
        for (int32_t j = c.first; j < c.n_visible; ++j) visible.push_back(j);
        visible.insert(visible.end(), c.extras.begin(), c.extras.end());
        std::vector<float> expect(qsize);
        ref::Attention(QueryAsScored(q.data(), qsize, type).data(), sh.n_heads, sh.n_kv_heads,
                       sh.head_dim, s.k.data(), s.v.data(), visible, scale, expect.data(),
                       /*round_to_f16=*/false);
        for (int64_t i = 0; i < qsize; ++i) ASSERT_NEAR(want[i], expect[i], 2e-5f) << "i " << i;
        for (ThreadPool* pool : {&pool2, &pool3, &pool4}) {
          for (CpuLevel level : Levels()) {
            std::vector<float> got(qsize);
            ASSERT_TRUE(PagedAttention(*pool, cache.View(), batch, q.data(), sh.n_heads, got.data(),
                                       0, scratch, AttentionOrder::kBatchInvariant, level)
                            .ok());
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), qsize * 4))
                << pool->n_threads() << " threads, " << CpuLevelName(level);
          }
        }
      }
    }
  }
}

TEST(PagedAttentionTest, RejectsBadTables) {
  ThreadPool pool(1);
  Scratch scratch;
  TestCache cache(2, 32, 4, 4, GgmlType::kF32);
  const std::vector<float> q(4 * 32, 0.1f);
  std::vector<float> out(4 * 32);
  const std::vector<int32_t> seq = {0}, indptr = {0, 2}, indices = {1, 3}, nv = {8};
  auto run = [&](const AttentionBatch& b, int32_t n_heads = 4) {
    return PagedAttention(pool, cache.View(), b, q.data(), n_heads, out.data(), 0, scratch);
  };
  EXPECT_TRUE(run({seq, indptr, indices, nv, {}, {}}).ok());
  const std::vector<int32_t> bad_indices = {1, 4};
  absl::Status s = run({seq, indptr, bad_indices, nv, {}, {}});
  EXPECT_NE(s.message().find("kv_indices[1] = 4"), std::string::npos) << s;
  const std::vector<int32_t> too_many = {9};
  s = run({seq, indptr, indices, too_many, {}, {}});
  EXPECT_NE(s.message().find("n_visible[0] = 9"), std::string::npos) << s;
  const std::vector<int32_t> bad_seq = {1};
  s = run({bad_seq, indptr, indices, nv, {}, {}});
  EXPECT_NE(s.message().find("seq[0] = 1"), std::string::npos) << s;
  const std::vector<int32_t> nv5 = {5}, e_indptr = {0, 2}, e_pos = {6, 6};
  s = run({seq, indptr, indices, nv5, e_indptr, e_pos});
  EXPECT_NE(s.message().find("extra_positions[1] = 6"), std::string::npos) << s;
  const std::vector<int32_t> zero = {0};
  s = run({seq, indptr, indices, zero, {}, {}});
  EXPECT_NE(s.message().find("sees no context"), std::string::npos) << s;
  s = run({seq, indptr, indices, nv, {}, {}}, 3);
  EXPECT_NE(s.message().find("n_heads 3"), std::string::npos) << s;
  // A q8_0 cache stores whole blocks of 32: other head sizes are refused.
  TestCache q8_cache(1, 48, 4, 4, GgmlType::kQ8_0);
  s = PagedAttention(pool, q8_cache.View(), {seq, indptr, indices, nv, {}, {}}, q.data(), 1,
                     out.data(), 0, scratch);
  EXPECT_NE(s.message().find("q8_0 K/V cache needs head_dim a multiple of 32, got 48"),
            std::string::npos)
      << s;
  const std::vector<int32_t> bad_parent = {-1, 1};
  std::vector<int32_t> ip, pos;
  s = BuildTreeVisibility(bad_parent, std::vector<int32_t>{4, 5}, ip, pos);
  EXPECT_NE(s.message().find("parent[1] = 1"), std::string::npos) << s;
}

// ---- MLA attention over a latent cache ----------------------------------------------------------

struct MlaShape {
  int32_t n_heads, kv_lora_rank, rope_dim, nope_dim, v_head_dim, block_size;
};

// The latent rows live in TestCache's K tiles (one kv head, head_dim = kv_lora_rank + rope_dim);
// the op reads them as both K and V.
PagedKvView LatentView(const TestCache& cache) {
  PagedKvView kv = cache.View();
  kv.v = kv.k;
  return kv;
}

// Writes `len` random latent rows of a new sequence as KvLayout lays out a q8_0 latent cache (c as
// block_q8_0, then the RoPE part in f16) into TestCache's K tiles (made with f32 rows, so each
// tile has room); the widened stored values go to the returned SeqKv's k.
SeqKv WriteQ8LatentSequence(TestCache& cache, int32_t kvl, int32_t rd, int32_t len,
                            std::vector<int32_t>& free_blocks, std::mt19937& rng) {
  SeqKv s;
  for (int32_t b = 0; b < (len + cache.block_size - 1) / cache.block_size; ++b) {
    s.blocks.push_back(free_blocks.back());
    free_blocks.pop_back();
  }
  const size_t row_bytes = static_cast<size_t>(kvl) / 32 * 34 + 2 * static_cast<size_t>(rd);
  s.k.resize(static_cast<size_t>(len) * (kvl + rd));
  for (int32_t p = 0; p < len; ++p) {
    uint8_t* dst =
        cache.Row(false, s.blocks[p / cache.block_size], 0, 0) + (p % cache.block_size) * row_bytes;
    const std::vector<float> x = RandomVector(kvl + rd, rng);
    float* stored = s.k.data() + static_cast<size_t>(p) * (kvl + rd);
    ActivationQuantizer(GgmlType::kQ8_0, CpuLevel::kScalar)(x.data(), dst, kvl);
    GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar)->dequantize(dst, stored, kvl);
    for (int32_t i = 0; i < rd; ++i) {
      const uint16_t h = Fp32ToFp16(x[kvl + i]);
      std::memcpy(dst + kvl / 32 * 34 + 2 * i, &h, 2);
      stored[kvl + i] = Fp16ToFp32(h);
    }
  }
  return s;
}

TEST(MlaAttentionTest, MatchesDecompressedReferenceAndIsBatchInvariant) {
  std::mt19937 rng(21);
  ThreadPool pool1(1), pool2(2);
  Scratch scratch;
  // The tiny deepseek2 shape; a latent not a multiple of 16 (the scalar dot kernels); wider heads.
  const MlaShape shapes[] = {
      {4, 64, 16, 32, 32, 16}, {3, 40, 8, 24, 16, 5}, {8, 128, 32, 48, 40, 16}};
  for (const MlaShape& sh : shapes) {
    const int32_t row = sh.kv_lora_rank + sh.rope_dim, qk = sh.nope_dim + sh.rope_dim;
    // Weights scaled as a trained layer's would be (unit-sized keys and values).
    const float wscale = 1.0f / std::sqrt(static_cast<float>(sh.kv_lora_rank));
    const std::vector<float> w_uk =
        RandomVector(sh.n_heads * sh.nope_dim * sh.kv_lora_rank, rng, -wscale, wscale);
    const std::vector<float> w_uv =
        RandomVector(sh.n_heads * sh.v_head_dim * sh.kv_lora_rank, rng, -wscale, wscale);
    const MlaAttentionWeights w = {w_uk.data(), w_uv.data(), sh.kv_lora_rank, sh.nope_dim,
                                   sh.v_head_dim};
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
      const bool q8 = type == GgmlType::kQ8_0;
      if (q8 && sh.kv_lora_rank % 32 != 0) continue;
      SCOPED_TRACE(::testing::Message()
                   << "heads " << sh.n_heads << " latent " << sh.kv_lora_rank << "+" << sh.rope_dim
                   << " bs " << sh.block_size << " " << GgmlTypeName(static_cast<uint32_t>(type)));
      TestCache cache(1, row, sh.block_size, 64, q8 ? GgmlType::kF32 : type);
      std::vector<int32_t> free_blocks = ShuffledBlockIds(64, rng);
      const int32_t lens[] = {37, 1, 50};
      std::vector<SeqKv> seqs;
      std::vector<int32_t> indptr = {0}, indices;
      for (int32_t len : lens) {
        seqs.push_back(
            q8 ? WriteQ8LatentSequence(cache, sh.kv_lora_rank, sh.rope_dim, len, free_blocks, rng)
               : WriteSequence(cache, len, free_blocks, rng));
        indices.insert(indices.end(), seqs.back().blocks.begin(), seqs.back().blocks.end());
        indptr.push_back(static_cast<int32_t>(indices.size()));
      }
      PagedKvView view = LatentView(cache);
      view.k.type = view.v.type = type;
      // A prefill chunk of seq 0, a decode token of seq 1, a causal token and a tree node of seq 2
      // (the node sees the first 40 positions, then its ancestors at 44 and 47 and itself at 49).
      std::vector<int32_t> seq_of, n_visible;
      for (int32_t p = 30; p < 37; ++p) seq_of.push_back(0), n_visible.push_back(p + 1);
      seq_of.push_back(1), n_visible.push_back(1);
      seq_of.push_back(2), n_visible.push_back(16);
      seq_of.push_back(2), n_visible.push_back(40);
      const int32_t n_tokens = static_cast<int32_t>(seq_of.size());
      std::vector<int32_t> extra_indptr(n_tokens + 1, 0), extra_positions = {44, 47, 49};
      extra_indptr[n_tokens] = 3;
      const std::vector<float> q = RandomVector(n_tokens * sh.n_heads * qk, rng, -2.0f, 2.0f);
      const AttentionBatch batch{seq_of, indptr, indices, n_visible, extra_indptr, extra_positions};
      const int64_t qsize = int64_t{sh.n_heads} * qk, osize = int64_t{sh.n_heads} * sh.v_head_dim;
      const float scale = 1.0f / std::sqrt(static_cast<float>(qk));

      std::vector<float> out2(n_tokens * osize), out1(out2.size());
      ASSERT_TRUE(
          MlaPagedAttention(pool2, view, batch, w, q.data(), sh.n_heads, out2.data(), 0, scratch)
              .ok());
      ASSERT_TRUE(
          MlaPagedAttention(pool1, view, batch, w, q.data(), sh.n_heads, out1.data(), 0, scratch)
              .ok());
      EXPECT_EQ(0, std::memcmp(out1.data(), out2.data(), out1.size() * 4)) << "1 vs 2 threads";
      double max_diff = 0;
      for (int32_t t = 0; t < n_tokens; ++t) {
        std::vector<int32_t> visible(n_visible[t]);
        for (int32_t j = 0; j < n_visible[t]; ++j) visible[j] = j;
        for (int32_t i = extra_indptr[t]; i < extra_indptr[t + 1]; ++i) {
          visible.push_back(extra_positions[i]);
        }
        // The decompressed float64 reference over the stored (widened) latent rows: the absorbed
        // f32 chains stay within 2e-6 (measured 1.2e-7, x86-64 AVX2; |out| < 1).
        std::vector<float> expect(osize);
        ref::MlaAttention(q.data() + t * qsize, sh.n_heads, w, sh.rope_dim,
                          seqs[seq_of[t]].k.data(), visible, scale, expect.data());
        for (int64_t i = 0; i < osize; ++i) {
          ASSERT_NEAR(out2[t * osize + i], expect[i], 2e-6f) << "token " << t << " i " << i;
          max_diff = std::max<double>(max_diff, std::abs(out2[t * osize + i] - expect[i]));
        }
        // The token alone gives the same bits (a tree node with its own extras).
        const std::vector<int32_t> one_seq = {seq_of[t]}, one_nv = {n_visible[t]};
        const std::vector<int32_t> one_indptr = {0, extra_indptr[t + 1] - extra_indptr[t]};
        const std::span<const int32_t> one_extra(extra_positions.data() + extra_indptr[t],
                                                 one_indptr[1]);
        const AttentionBatch single{one_seq, indptr, indices, one_nv, one_indptr, one_extra};
        std::vector<float> alone(osize);
        ASSERT_TRUE(MlaPagedAttention(pool2, view, single, w, q.data() + t * qsize, sh.n_heads,
                                      alone.data(), 0, scratch)
                        .ok());
        EXPECT_EQ(0, std::memcmp(alone.data(), out2.data() + t * osize, osize * 4))
            << "token " << t << " alone vs in the batch";
      }
      std::printf("MLA %d heads, latent %d+%d, %s: max |op - float64 reference| %.2e\n", sh.n_heads,
                  sh.kv_lora_rank, sh.rope_dim, GgmlTypeName(static_cast<uint32_t>(type)).c_str(),
                  max_diff);
      // Every SIMD level computes the same bits.
      std::vector<float> want(out2.size());
      ASSERT_TRUE(MlaPagedAttention(pool2, view, batch, w, q.data(), sh.n_heads, want.data(), 0,
                                    scratch, CpuLevel::kScalar)
                      .ok());
      for (CpuLevel level : Levels()) {
        std::vector<float> out_l(out2.size());
        ASSERT_TRUE(MlaPagedAttention(pool2, view, batch, w, q.data(), sh.n_heads, out_l.data(), 0,
                                      scratch, level)
                        .ok());
        EXPECT_EQ(0, std::memcmp(out_l.data(), want.data(), want.size() * 4))
            << CpuLevelName(level);
      }
    }
  }
}

// MLA in the llama.cpp orders (llama.cpp's absorbed graph: the latent rows as one K head whose
// first kv_lora_rank elements are V) is PagedAttention's llama.cpp order over the whole rows,
// restricted to the first kv_lora_rank output columns (each output element is its own lane chain):
// the same bits, for prompt and decode batches, tree extras, every cache type it takes and every
// level.
TEST(MlaLatentAttentionTest, EqualsPagedAttentionsLatentColumns) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  Scratch scratch;
  struct Shape {
    int32_t n_heads, kv_lora_rank, rope_dim, block_size;
  };
  for (const Shape& sh : {Shape{4, 64, 16, 16}, Shape{3, 40, 8, 5}}) {
    const int32_t row = sh.kv_lora_rank + sh.rope_dim;
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << sh.n_heads << " latent " << sh.kv_lora_rank << "+" << sh.rope_dim
                   << " bs " << sh.block_size << " " << GgmlTypeName(static_cast<uint32_t>(type)));
      TestCache cache(1, row, sh.block_size, 64, type);
      std::vector<int32_t> free_blocks = ShuffledBlockIds(64, rng);
      std::vector<int32_t> indptr = {0}, indices;
      for (int32_t len : {37, 1, 50}) {
        const SeqKv s = WriteSequence(cache, len, free_blocks, rng);
        indices.insert(indices.end(), s.blocks.begin(), s.blocks.end());
        indptr.push_back(static_cast<int32_t>(indices.size()));
      }
      const PagedKvView view = LatentView(cache);
      // Prompt: a chunk of seq 0, a token of seq 2 and a tree node of seq 2 (ancestors at 44 and
      // 47, itself at 49). Decode: the last position of seq 1.
      const std::vector<int32_t> seq_of = {0, 0, 0, 2, 2}, n_visible = {35, 36, 37, 16, 40};
      const std::vector<int32_t> extra_indptr = {0, 0, 0, 0, 0, 3}, extra_positions = {44, 47, 49};
      const AttentionBatch prompt{seq_of,    indptr,       indices,
                                  n_visible, extra_indptr, extra_positions};
      const std::vector<int32_t> one_seq = {1}, one_nv = {1};
      const AttentionBatch decode{one_seq, indptr, indices, one_nv, {}, {}};
      const float scale = 0.125f;
      for (const auto& [batch, order] : {std::pair{prompt, AttentionOrder::kLlamaCppPrompt},
                                         std::pair{decode, AttentionOrder::kLlamaCppDecode}}) {
        const int64_t n = static_cast<int64_t>(batch.seq.size());
        const std::vector<float> q = RandomVector(n * sh.n_heads * row, rng, -2.0f, 2.0f);
        std::vector<float> full(n * sh.n_heads * row), latent(n * sh.n_heads * sh.kv_lora_rank);
        ASSERT_TRUE(PagedAttention(pool, view, batch, q.data(), sh.n_heads, full.data(), scale,
                                   scratch, order)
                        .ok());
        for (CpuLevel level : Levels()) {
          ASSERT_TRUE(MlaLatentAttentionLlamaCpp(pool, view, batch, q.data(), sh.n_heads,
                                                 sh.kv_lora_rank, latent.data(), scale, scratch,
                                                 order, level)
                          .ok());
          for (int64_t th = 0; th < n * sh.n_heads; ++th) {
            ASSERT_EQ(0, std::memcmp(latent.data() + th * sh.kv_lora_rank, full.data() + th * row,
                                     sh.kv_lora_rank * sizeof(float)))
                << "(token, head) " << th << ", " << CpuLevelName(level)
                << (order == AttentionOrder::kLlamaCppPrompt ? ", prompt" : ", decode");
          }
        }
      }
      // What it refuses, naming the op.
      std::vector<float> q(sh.n_heads * row), out(sh.n_heads * row);
      auto status = [&](const PagedKvView& v, int32_t kvl, AttentionOrder order) {
        return MlaLatentAttentionLlamaCpp(pool, v, decode, q.data(), sh.n_heads, kvl, out.data(),
                                          scale, scratch, order);
      };
      EXPECT_EQ(status(view, sh.kv_lora_rank, AttentionOrder::kBatchInvariant).code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(status(view, row + 1, AttentionOrder::kLlamaCppDecode).code(),
                absl::StatusCode::kInvalidArgument);
      PagedKvView q8 = view;
      q8.k.type = q8.v.type = GgmlType::kQ8_0;
      if (row % 32 == 0) {
        const absl::Status s = status(q8, sh.kv_lora_rank, AttentionOrder::kLlamaCppDecode);
        EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
        EXPECT_NE(s.message().find("MlaLatentAttention"), std::string::npos) << s;
      }
    }
  }
}

// MLA's decompressed attention against a float64 evaluation of its formula (rope_dim 16 and 0,
// nope_dim 32 (SIMD scores) and 20 (the definition)); every token's output is bitwise the same
// alone, in a batch with others, and on one or two threads.
TEST(MlaDecompressedAttentionTest, MatchesFloat64AndIsBatchInvariant) {
  struct Shape {
    int32_t heads, nope, rope, vd, ctx;
  };
  for (const Shape sh : {Shape{3, 32, 16, 24, 37}, Shape{2, 20, 0, 16, 19}}) {
    SCOPED_TRACE(sh.nope * 100 + sh.rope);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](size_t n) {
      std::vector<float> v(n);
      for (float& x : v) x = nd(rng);
      return v;
    };
    const int64_t qk = sh.nope + sh.rope, n_tokens = 11;
    const std::vector<float> q = fill(n_tokens * sh.heads * qk);
    const std::vector<float> k_nope = fill(sh.ctx * sh.heads * sh.nope);
    const std::vector<float> k_rope = fill(sh.ctx * std::max(sh.rope, 1));
    const std::vector<float> v = fill(sh.ctx * sh.heads * sh.vd);
    std::vector<int32_t> n_visible;
    for (int64_t t = 0; t < n_tokens; ++t) n_visible.push_back(sh.ctx - 10 + t);
    MlaDecompressedKv kv{k_nope.data(), k_rope.data(), v.data(), sh.ctx,
                         sh.heads,      sh.nope,       sh.rope,  sh.vd};
    const float scale = 0.2f;
    std::vector<float> all(n_tokens * sh.heads * sh.vd);
    ThreadPool pool2(2), pool1(1);
    Scratch scratch;
    ASSERT_TRUE(
        MlaDecompressedAttention(pool2, kv, q.data(), n_visible, all.data(), scale, scratch).ok());
    double max_err = 0;
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t h = 0; h < sh.heads; ++h) {
        const float* qh = q.data() + (t * sh.heads + h) * qk;
        std::vector<double> s(n_visible[t]);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n_visible[t]; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < sh.nope; ++e) {
            dot += double{qh[e]} * k_nope[(j * sh.heads + h) * sh.nope + e];
          }
          for (int64_t e = 0; e < sh.rope; ++e)
            dot += double{qh[sh.nope + e]} * k_rope[j * sh.rope + e];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < sh.vd; ++e) {
          double o = 0;
          for (int64_t j = 0; j < n_visible[t]; ++j) {
            o += s[j] / sum * v[(j * sh.heads + h) * sh.vd + e];
          }
          max_err = std::max(max_err, std::abs(o - all[(t * sh.heads + h) * sh.vd + e]));
        }
      }
    }
    EXPECT_LT(max_err, 1e-5);
    // One token alone on one thread: the same bits as in the batch.
    for (int64_t t : {0, 5, 10}) {
      std::vector<float> one(sh.heads * sh.vd);
      ASSERT_TRUE(MlaDecompressedAttention(pool1, kv, q.data() + t * sh.heads * qk,
                                           std::span(&n_visible[t], 1), one.data(), scale, scratch)
                      .ok());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * sh.heads * sh.vd))
          << "token " << t;
    }
  }
}

TEST(MlaDecompressedAttentionTest, RejectsBadInputNamingIt) {
  ThreadPool pool(1);
  Scratch scratch;
  const std::vector<float> k(4 * 2 * 16, 0.1f), r(4 * 16, 0.1f), v(4 * 2 * 16, 0.1f);
  const std::vector<float> q(2 * 32, 0.1f);
  std::vector<float> out(2 * 16);
  MlaDecompressedKv kv{k.data(), r.data(), v.data(), 4, 2, 16, 16, 16};
  const std::vector<int32_t> ok = {4}, zero = {0}, past = {5};
  EXPECT_TRUE(MlaDecompressedAttention(pool, kv, q.data(), ok, out.data(), 0, scratch).ok());
  absl::Status s = MlaDecompressedAttention(pool, kv, q.data(), zero, out.data(), 0, scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("n_visible[0] = 0 is outside [1, 4]"), std::string::npos) << s;
  s = MlaDecompressedAttention(pool, kv, q.data(), past, out.data(), 0, scratch);
  EXPECT_NE(s.message().find("n_visible[0] = 5"), std::string::npos) << s;
  MlaDecompressedKv no_v = kv;
  no_v.v = nullptr;
  s = MlaDecompressedAttention(pool, no_v, q.data(), ok, out.data(), 0, scratch);
  EXPECT_NE(s.message().find("is null"), std::string::npos) << s;
  MlaDecompressedKv no_heads = kv;
  no_heads.n_heads = 0;
  s = MlaDecompressedAttention(pool, no_heads, q.data(), ok, out.data(), 0, scratch);
  EXPECT_NE(s.message().find("n_heads 0"), std::string::npos) << s;
}

// `x` (n floats) as a row of `type` (F32, F16, BF16, Q8_0), and that row widened back to f32.
std::vector<uint8_t> EncodeRow(GgmlType type, const float* x, int64_t n) {
  std::vector<uint8_t> row;
  if (type == GgmlType::kQ8_0) {
    row.resize(static_cast<size_t>(n / 32 * 34));
    GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar)->quantize(x, row.data(), n);
  } else if (type == GgmlType::kF32) {
    row.resize(static_cast<size_t>(n * 4));
    std::memcpy(row.data(), x, row.size());
  } else {
    row.resize(static_cast<size_t>(n * 2));
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
      std::memcpy(row.data() + 2 * i, &h, 2);
    }
  }
  return row;
}
void WidenRow(GgmlType type, const uint8_t* row, int64_t n, float* out) {
  if (type == GgmlType::kQ8_0) {
    GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar)->dequantize(row, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (type == GgmlType::kF32) {
      std::memcpy(out + i, row + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, row + 2 * i, 2);
      out[i] = type == GgmlType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
}

// The absorbed attention reading the file's rows (MlaAttentionWeights::uk_rows, uv_rows), as a
// combined attn_kv_b or split attn_k_b/attn_v_b hold them, in each type they may have: the rows
// widen to exactly the f32 weights, so W_UK_h's rows (attn_kv_b) give the f32 arrays' bits, and
// W_UK_hᵀ's rows (attn_k_b: a dot per latent element instead of an FMA chain over nope_dim) stay
// within 4e-6 of them (|out| < 1); every level computes the same bits.
TEST(MlaAttentionTest, FileRowsGiveTheF32WeightsResult) {
  std::mt19937 rng(41);
  ThreadPool pool(2);
  Scratch scratch;
  const int32_t n_heads = 4, kvl = 64, rd = 16, nope = 32, vd = 32, qk = nope + rd;
  TestCache cache(1, kvl + rd, 16, 8, GgmlType::kF32);
  std::vector<int32_t> free_blocks = ShuffledBlockIds(8, rng);
  const SeqKv seq = WriteSequence(cache, 37, free_blocks, rng);
  const std::vector<int32_t> indptr = {0, static_cast<int32_t>(seq.blocks.size())};
  // A prompt chunk of three tokens and a decode token of the same sequence.
  const std::vector<int32_t> seq_of = {0, 0, 0, 0}, n_visible = {30, 31, 32, 37};
  const AttentionBatch batch{seq_of, indptr, seq.blocks, n_visible, {}, {}};
  const std::vector<float> q = RandomVector(4 * n_heads * qk, rng, -2.0f, 2.0f);
  const float wscale = 1.0f / std::sqrt(static_cast<float>(kvl));
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(transposed ? "attn_k_b rows" : "attn_kv_b rows");
      // The file's rows, and the f32 weights they widen to.
      std::vector<std::vector<uint8_t>> uk_file, uv_file;
      std::vector<float> w_uk(n_heads * nope * kvl), w_uv(n_heads * vd * kvl);
      const int64_t uk_row_len = transposed ? nope : kvl;
      for (int64_t r = 0; r < n_heads * (transposed ? kvl : nope); ++r) {
        const std::vector<float> x = RandomVector(uk_row_len, rng, -wscale, wscale);
        uk_file.push_back(EncodeRow(type, x.data(), uk_row_len));
        std::vector<float> widened(uk_row_len);
        WidenRow(type, uk_file.back().data(), uk_row_len, widened.data());
        for (int64_t i = 0; i < uk_row_len; ++i) {
          if (transposed) {  // row (h, latent l) holds W_UK_h[:, l]
            const int64_t h = r / kvl, l = r % kvl;
            w_uk[(h * nope + i) * kvl + l] = widened[i];
          } else {
            w_uk[r * kvl + i] = widened[i];
          }
        }
      }
      for (int64_t r = 0; r < n_heads * vd; ++r) {
        const std::vector<float> x = RandomVector(kvl, rng, -wscale, wscale);
        uv_file.push_back(EncodeRow(type, x.data(), kvl));
        WidenRow(type, uv_file.back().data(), kvl, w_uv.data() + r * kvl);
      }
      std::vector<const void*> uk_rows, uv_rows;
      for (const auto& row : uk_file) uk_rows.push_back(row.data());
      for (const auto& row : uv_file) uv_rows.push_back(row.data());
      const MlaAttentionWeights f32 = {w_uk.data(), w_uv.data(), kvl, nope, vd};
      MlaAttentionWeights rows = {nullptr, nullptr, kvl, nope, vd};
      rows.rows_type = type;
      rows.uk_rows = uk_rows.data();
      rows.uk_transposed = transposed;
      rows.uv_rows = uv_rows.data();

      std::vector<float> want(4 * n_heads * vd), got(want.size());
      ASSERT_TRUE(MlaPagedAttention(pool, LatentView(cache), batch, f32, q.data(), n_heads,
                                    want.data(), 0, scratch)
                      .ok());
      ASSERT_TRUE(MlaPagedAttention(pool, LatentView(cache), batch, rows, q.data(), n_heads,
                                    got.data(), 0, scratch)
                      .ok());
      if (!transposed) {
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
      } else {
        for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 4e-6f) << i;
      }
      std::vector<float> scalar(want.size());
      ASSERT_TRUE(MlaPagedAttention(pool, LatentView(cache), batch, rows, q.data(), n_heads,
                                    scalar.data(), 0, scratch, CpuLevel::kScalar)
                      .ok());
      for (CpuLevel level : Levels()) {
        std::vector<float> out_l(want.size());
        ASSERT_TRUE(MlaPagedAttention(pool, LatentView(cache), batch, rows, q.data(), n_heads,
                                      out_l.data(), 0, scratch, level)
                        .ok());
        EXPECT_EQ(0, std::memcmp(out_l.data(), scalar.data(), scalar.size() * 4))
            << CpuLevelName(level);
      }
    }
  }
  // A type that does not widen exactly is refused, naming it.
  const std::vector<uint8_t> dummy(64);
  const std::vector<const void*> any(n_heads * kvl, dummy.data());
  MlaAttentionWeights q4 = {nullptr, nullptr, kvl, nope, vd};
  q4.rows_type = GgmlType::kQ4_0;
  q4.uk_rows = q4.uv_rows = any.data();
  std::vector<float> out(4 * n_heads * vd);
  const absl::Status s = MlaPagedAttention(pool, LatentView(cache), batch, q4, q.data(), n_heads,
                                           out.data(), 0, scratch);
  EXPECT_NE(s.message().find("weight rows of type q4_0"), std::string::npos) << s;
}

TEST(MlaAttentionTest, RejectsBadInputNamingIt) {
  ThreadPool pool(1);
  Scratch scratch;
  TestCache cache(1, 80, 4, 4, GgmlType::kF32);
  const std::vector<float> w_uk(4 * 32 * 64, 0.01f), w_uv(4 * 32 * 64, 0.01f);
  const std::vector<float> q(4 * 48, 0.1f);
  std::vector<float> out(4 * 32);
  const std::vector<int32_t> seq = {0}, indptr = {0, 2}, indices = {1, 3}, nv = {8};
  const AttentionBatch batch{seq, indptr, indices, nv, {}, {}};
  MlaAttentionWeights w = {w_uk.data(), w_uv.data(), 64, 32, 32};
  auto run = [&](const PagedKvView& kv, const AttentionBatch& b, const MlaAttentionWeights& mw) {
    return MlaPagedAttention(pool, kv, b, mw, q.data(), 4, out.data(), 0, scratch);
  };
  EXPECT_TRUE(run(LatentView(cache), batch, w).ok());
  absl::Status s = run(cache.View(), batch, w);  // k and v different rows
  EXPECT_NE(s.message().find("one kv head"), std::string::npos) << s;
  const std::vector<int32_t> bad_indices = {1, 4};
  s = run(LatentView(cache), {seq, indptr, bad_indices, nv, {}, {}}, w);
  EXPECT_NE(s.message().find("MlaAttention: PagedAttention: kv_indices[1] = 4"), std::string::npos)
      << s;
  MlaAttentionWeights no_uv = w;
  no_uv.w_uv = nullptr;
  s = run(LatentView(cache), batch, no_uv);
  EXPECT_NE(s.message().find("w_uv null"), std::string::npos) << s;
  MlaAttentionWeights half_rows = {nullptr, nullptr, 64, 32, 32};
  const void* const row_list[1] = {w_uk.data()};
  half_rows.uk_rows = row_list;  // uv_rows missing
  s = run(LatentView(cache), batch, half_rows);
  EXPECT_NE(s.message().find("uv_rows null"), std::string::npos) << s;
  MlaAttentionWeights too_wide = w;
  too_wide.kv_lora_rank = 96;
  s = run(LatentView(cache), batch, too_wide);
  EXPECT_NE(s.message().find("kv_lora_rank 96 (row 80)"), std::string::npos) << s;
  PagedKvView q8 = LatentView(cache);
  q8.k.type = q8.v.type = GgmlType::kQ8_0;
  s = run(q8, batch, {w_uk.data(), w_uv.data(), 48, 32, 32});
  EXPECT_NE(s.message().find("kv_lora_rank a multiple of 32, got 48"), std::string::npos) << s;
}

}  // namespace
}  // namespace kiln::cpu
