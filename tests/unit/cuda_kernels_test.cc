// The CUDA compute kernels (kernels/cuda/gemv.cu, gemm.cu, paged_attention.cu) against the CPU
// backend on the same inputs.
//
// Two kinds of test live here. CudaPagedIndex.* run everywhere: they check the index arithmetic
// the attention kernel shares with the host (kernels/cuda/paged_index.h) against the KV cache,
// and replay the kernel's algorithm (split-K ranges, 4 warps' online softmax, the two merges) on
// the host against CpuBackend::Attention. CudaKernels.* run the kernels on a device and skip,
// with the reason, when there is none.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/gemv_units.h"
#include "kernels/cuda/paged_index.h"
#include "kernels/cuda/sample_chain.h"
#include "lib/backend/attention_mask.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cuda/cuda_plan.h"
#include "lib/backend/cuda_loader.h"
#include "lib/backend/mla_attention.h"
#include "lib/common/half.h"
#include "lib/kv/kv_cache.h"
#include "lib/quant/quant.h"
#include "lib/sample/sampler.h"
#include "tests/common/cpu_test_util.h"
#include "tests/common/cuda_test_util.h"

namespace kiln {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> Iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

// A batch over three sequences of one paged cache that exercises every part of the mask:
//   seq 0 (37 tokens): a causal prefill chunk, positions 30..36 (crosses a block boundary);
//   seq 1 (50 tokens): one decode token at 49 with a sliding window from position 20;
//   seq 2 (20 committed + 5 tree nodes at 20..24, parents {-1, 0, 0, 1, -1}): tree verification,
//     each node seeing the prefix and its ancestors (BuildTreeVisibility).
// The cache has two layers with different contents; the batch reads layer kLayer.
struct AttentionCase {
  static constexpr int32_t kLayer = 1;
  int32_t n_heads = 0;
  std::unique_ptr<KvCache> cache;
  std::vector<SeqId> ids;  // the cache's ids of sequences 0, 1, 2
  KvTables tables;
  std::vector<int32_t> seq, n_visible, first_visible, extra_indptr, extra_positions;
  std::vector<float> q;        // [n_tokens, n_heads, head_dim]
  std::vector<float> cpu_out;  // CpuBackend::Attention of the batch

  int32_t n_tokens() const { return static_cast<int32_t>(seq.size()); }
  AttentionMask Mask() const {
    AttentionMask m;
    m.seq = seq;
    m.tables = &tables;
    m.n_visible = n_visible;
    m.extra_indptr = extra_indptr;
    m.extra_positions = extra_positions;
    m.first_visible = first_visible;
    return m;
  }
  cuda::VisibleRows Rows() const {
    return {seq.data(), n_visible.data(), first_visible.data(), extra_indptr.data(),
            extra_positions.data()};
  }
  cuda::BlockTables Tables() const {
    return {tables.indptr.data(), tables.indices.data(), cache->layout().block_size(),
            cache->NumBlocks()};
  }
};

// A GQA cache (CpuBackend::Attention's output in cpu_out) or, for an MLA layout, a latent cache
// (cpu_out left empty: the MLA test computes it with its weights).
AttentionCase MakeAttentionCase(const absl::StatusOr<KvLayout>& layout, int32_t n_heads,
                                uint32_t seed) {
  std::mt19937 rng(seed);
  AttentionCase c;
  c.n_heads = n_heads;
  EXPECT_TRUE(layout.ok()) << layout.status();
  auto cache = KvCache::Create(*layout, {.num_blocks = 64, .enable_prefix_caching = false});
  EXPECT_TRUE(cache.ok()) << cache.status();
  c.cache = std::move(*cache);
  cpu::CpuBackend cpu(1);
  const int32_t lens[] = {37, 50, 25};
  for (int32_t len : lens) {
    const SeqId s = c.cache->CreateSequence();
    c.ids.push_back(s);
    std::vector<KvSlot> slots(len);
    EXPECT_TRUE(
        c.cache->AppendSlots(s, Iota(len, 1000 * static_cast<int32_t>(c.ids.size())), slots).ok());
    for (int32_t layer = 0; layer < 2; ++layer) {
      if (layout->kind() == KvAttentionKind::kMla) {
        const std::vector<float> latent = RandomVector(size_t(len) * layout->row_elems(), rng);
        EXPECT_TRUE(cpu.WriteLatent(*c.cache, layer, slots, latent.data()).ok());
        continue;
      }
      const std::vector<float> k =
          RandomVector(size_t(len) * layout->n_kv_heads() * layout->head_dim(), rng);
      const std::vector<float> v = RandomVector(k.size(), rng);
      EXPECT_TRUE(cpu.WriteKv(*c.cache, layer, slots, k.data(), v.data()).ok());
    }
  }
  EXPECT_TRUE(c.cache->BuildTables(c.ids, &c.tables).ok());
  for (int32_t p = 30; p < 37; ++p) {
    c.seq.push_back(0), c.n_visible.push_back(p + 1), c.first_visible.push_back(0);
  }
  c.seq.push_back(1), c.n_visible.push_back(50), c.first_visible.push_back(20);
  c.extra_indptr.assign(c.seq.size() + 1, 0);  // the causal tokens see no extras
  const std::vector<int32_t> parent = {-1, 0, 0, 1, -1};
  for (size_t i = 0; i < parent.size(); ++i) {
    c.seq.push_back(2), c.n_visible.push_back(20), c.first_visible.push_back(0);
  }
  EXPECT_TRUE(BuildTreeVisibility(parent, Iota(5, 20), c.extra_indptr, c.extra_positions).ok());
  if (layout->kind() == KvAttentionKind::kMla) return c;
  c.q = RandomVector(size_t(c.n_tokens()) * n_heads * layout->head_dim(), rng, -2.0f, 2.0f);
  if (layout->elem_type() == GgmlType::kQ8_0) {
    // On the Q8_0 grid: the CPU's default order scores a q8_0 K against q rounded to Q8_0 blocks
    // (kv_scores_rows_q8_0), the device kernel against q in f32; for a q already on the grid
    // the rounding changes nothing, so both compute the same products.
    c.q = testing::OnQ8_0Grid(c.q.data(), c.q.size());
  }
  c.cpu_out.resize(c.q.size());
  EXPECT_TRUE(cpu.Attention(*c.cache, AttentionCase::kLayer, c.Mask(), c.q.data(), n_heads,
                            c.cpu_out.data(), 0.0f)
                  .ok());
  return c;
}

AttentionCase MakeAttentionCase(GgmlType type, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, int32_t block_size, uint32_t seed) {
  return MakeAttentionCase(KvLayout::Gqa(2, n_kv_heads, head_dim, type, block_size), n_heads, seed);
}

// The attention kernels' algorithm on the host, step for step: per (token, head, split) four
// "warps" take the split's rows in turn with an online softmax, the warps merge, then the splits.
// read_row(block, slot, kv_head, value, out) decodes one K (value false) or V row of hd floats.
//   q, out: [n_tokens, n_heads, hd]
template <typename ReadRow>
std::vector<float> ReplaySplitAttention(const AttentionCase& c, const float* q, int32_t n_heads,
                                        int32_t n_kv_heads, int32_t hd, float scale,
                                        int32_t n_splits, ReadRow read_row) {
  constexpr int kWarps = 4;
  const int32_t group = n_heads / n_kv_heads;
  const cuda::VisibleRows rows = c.Rows();
  const cuda::BlockTables tables = c.Tables();
  const float kNegInf = -std::numeric_limits<float>::infinity();
  struct State {
    float m, l;
    std::vector<float> acc;
  };
  // Merges states with weights exp(m_i - max m); a state without rows (m = -inf) weighs 0.
  auto merge = [&](const std::vector<State>& parts) {
    State out{kNegInf, 0.0f, std::vector<float>(hd, 0.0f)};
    for (const State& s : parts) out.m = std::max(out.m, s.m);
    for (const State& s : parts) {
      if (s.m == kNegInf) continue;
      const float w = std::exp(s.m - out.m);
      out.l += s.l * w;
      for (int32_t d = 0; d < hd; ++d) out.acc[d] += s.acc[d] * w;
    }
    return out;
  };
  std::vector<float> out(size_t(c.n_tokens()) * n_heads * hd);
  std::vector<float> k(hd), v(hd);
  for (int32_t t = 0; t < c.n_tokens(); ++t) {
    for (int32_t h = 0; h < n_heads; ++h) {
      const float* q_th = q + (size_t(t) * n_heads + h) * hd;
      std::vector<State> splits;
      for (int32_t split = 0; split < n_splits; ++split) {
        int32_t begin = 0, end = 0;
        cuda::SplitRange(cuda::VisibleCount(rows, t), n_splits, split, &begin, &end);
        std::vector<State> warps;
        for (int w = 0; w < kWarps; ++w) {
          State s{kNegInf, 0.0f, std::vector<float>(hd, 0.0f)};
          for (int32_t i = begin + w; i < end; i += kWarps) {
            int32_t block = -1, slot = -1;
            const int32_t pos = cuda::VisiblePosition(rows, t, i);
            EXPECT_TRUE(cuda::LocatePosition(tables, c.seq[t], pos, &block, &slot));
            read_row(block, slot, h / group, false, k.data());
            read_row(block, slot, h / group, true, v.data());
            float dot = 0.0f;
            for (int32_t d = 0; d < hd; ++d) dot += q_th[d] * k[d];
            const float score = dot * scale, m_new = std::max(s.m, score);
            const float correction = std::exp(s.m - m_new), p = std::exp(score - m_new);
            s.l = s.l * correction + p;
            for (int32_t d = 0; d < hd; ++d) s.acc[d] = s.acc[d] * correction + p * v[d];
            s.m = m_new;
          }
          warps.push_back(std::move(s));
        }
        splits.push_back(merge(warps));
      }
      const State total = merge(splits);
      for (int32_t d = 0; d < hd; ++d) {
        out[(size_t(t) * n_heads + h) * hd + d] = total.l > 0 ? total.acc[d] / total.l : 0.0f;
      }
    }
  }
  return out;
}

// The GQA kernel on the host: rows addressed as the kernel does (layer tile + kv_head * tile).
std::vector<float> ReplayAttentionKernel(const AttentionCase& c, int32_t n_splits) {
  const KvLayout& layout = c.cache->layout();
  const int32_t hd = layout.head_dim();
  const QuantKernels* decode = GetQuantKernels(layout.elem_type(), CpuLevel::kScalar);
  EXPECT_TRUE(decode != nullptr && decode->dequantize != nullptr);
  const KvPlacement& placement = c.cache->placement();
  const auto* pool = reinterpret_cast<const uint8_t*>(placement.base);
  const size_t k_tile = layout.KeyTileIndex(AttentionCase::kLayer, 0);
  const size_t v_tile = layout.ValueTileIndex(AttentionCase::kLayer, 0);
  auto read_row = [&](int32_t block, int32_t slot, int32_t kv_head, bool value, float* out) {
    const size_t tile = ((value ? v_tile : k_tile) + size_t(kv_head)) * placement.tile_stride;
    decode->dequantize(
        pool + cuda::RowByteOffset(block, slot, placement.block_stride, tile, layout.row_bytes()),
        out, hd);
  };
  return ReplaySplitAttention(c, c.q.data(), c.n_heads, layout.n_kv_heads(), hd,
                              1.0f / std::sqrt(static_cast<float>(hd)), n_splits, read_row);
}

// |got - want| <= tol * max(1, |want|) everywhere; reports the first miss.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * std::max(1.0f, std::fabs(want[i])))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

TEST(CudaPagedIndex, LocatePositionMatchesTheCacheSlots) {
  AttentionCase c = MakeAttentionCase(GgmlType::kF16, 4, 2, 32, 8, 1);
  const cuda::BlockTables tables = c.Tables();
  const int32_t lens[] = {37, 50, 25};
  for (int32_t s = 0; s < 3; ++s) {
    const SeqId id = c.ids[s];
    for (int32_t pos = 0; pos < lens[s]; ++pos) {
      auto want = c.cache->SlotOf(id, pos);
      ASSERT_TRUE(want.ok()) << want.status();
      int32_t block = -1, slot = -1;
      ASSERT_TRUE(cuda::LocatePosition(tables, s, pos, &block, &slot)) << s << " " << pos;
      EXPECT_EQ(block, want->block) << "seq " << s << " pos " << pos;
      EXPECT_EQ(slot, want->offset) << "seq " << s << " pos " << pos;
      // The row address the kernel forms is the one the cache hands the CPU.
      const KvLayout& layout = c.cache->layout();
      const KvPlacement& placement = c.cache->placement();
      EXPECT_EQ(
          placement.base + cuda::RowByteOffset(block, slot, placement.block_stride,
                                               layout.KeyTileIndex(1, 1) * placement.tile_stride,
                                               layout.row_bytes()),
          c.cache->KeyRow(*want, 1, 1));
    }
    int32_t block = -1, slot = -1;
    // Past the table (the last block's unused slots are still inside it), and negative.
    const int32_t past = (c.tables.indptr[s + 1] - c.tables.indptr[s]) * 8;
    EXPECT_FALSE(cuda::LocatePosition(tables, s, past, &block, &slot));
    EXPECT_FALSE(cuda::LocatePosition(tables, s, -1, &block, &slot));
  }
  // A table naming a block outside the pool is refused, not read.
  std::vector<int32_t> indices = c.tables.indices;
  indices[0] = c.cache->NumBlocks();
  cuda::BlockTables bad = tables;
  bad.indices = indices.data();
  int32_t block = -1, slot = -1;
  EXPECT_FALSE(cuda::LocatePosition(bad, 0, 0, &block, &slot));
}

TEST(CudaPagedIndex, VisibleRowsFollowTheMask) {
  AttentionCase c = MakeAttentionCase(GgmlType::kF16, 4, 2, 32, 8, 2);
  const cuda::VisibleRows rows = c.Rows();
  // Prefill token at position 30 sees 0..30; the windowed decode token 20..49.
  EXPECT_EQ(cuda::VisibleCount(rows, 0), 31);
  EXPECT_EQ(cuda::VisiblePosition(rows, 0, 30), 30);
  EXPECT_EQ(cuda::VisibleCount(rows, 7), 30);
  EXPECT_EQ(cuda::VisiblePosition(rows, 7, 0), 20);
  EXPECT_EQ(cuda::VisiblePosition(rows, 7, 29), 49);
  // Tree node 3 (parent 1, grandparent 0): the prefix 0..19, then slots 20, 21, 23.
  const int32_t node3 = 8 + 3;
  ASSERT_EQ(cuda::VisibleCount(rows, node3), 23);
  EXPECT_EQ(cuda::VisiblePosition(rows, node3, 19), 19);
  EXPECT_EQ(cuda::VisiblePosition(rows, node3, 20), 20);
  EXPECT_EQ(cuda::VisiblePosition(rows, node3, 21), 21);
  EXPECT_EQ(cuda::VisiblePosition(rows, node3, 22), 23);
  // Node 4 (a root): the prefix and itself.
  EXPECT_EQ(cuda::VisibleCount(rows, node3 + 1), 21);
  EXPECT_EQ(cuda::VisiblePosition(rows, node3 + 1, 20), 24);
  // Without first_visible and extras: [0, n_visible).
  const int32_t seq0 = 0, n_vis = 5;
  const cuda::VisibleRows plain{&seq0, &n_vis, nullptr, nullptr, nullptr};
  EXPECT_EQ(cuda::VisibleCount(plain, 0), 5);
  EXPECT_EQ(cuda::VisiblePosition(plain, 0, 4), 4);
}

TEST(CudaPagedIndex, SplitRangesPartitionTheRowsInOrder) {
  for (int32_t n = 0; n <= 70; ++n) {
    for (int32_t n_splits = 1; n_splits <= 64; ++n_splits) {
      int32_t expected_begin = 0, smallest = n + 1, largest = -1;
      for (int32_t s = 0; s < n_splits; ++s) {
        int32_t begin = 0, end = 0;
        cuda::SplitRange(n, n_splits, s, &begin, &end);
        ASSERT_EQ(begin, expected_begin) << n << " rows, split " << s << "/" << n_splits;
        ASSERT_LE(begin, end);
        smallest = std::min(smallest, end - begin);
        largest = std::max(largest, end - begin);
        expected_begin = end;
      }
      ASSERT_EQ(expected_begin, n) << n << " rows in " << n_splits << " splits";
      ASSERT_LE(largest - smallest, 1);
    }
  }
  EXPECT_EQ(cuda::AttentionWorkspaceFloats(3, 4, 5, 64), size_t(3 * 4 * 5 * 66));
}

// The split-K algorithm agrees with the CPU within f32 rounding (different summation orders) for
// each K/V element type, GQA grouping, and split counts from one to more splits than rows.
TEST(CudaPagedIndex, KernelAlgorithmReplayMatchesCpuAttention) {
  struct Shape {
    GgmlType type;
    int32_t n_heads, n_kv_heads, head_dim, block_size;
  };
  const Shape shapes[] = {{GgmlType::kF32, 4, 4, 40, 16},
                          {GgmlType::kF16, 6, 2, 64, 7},
                          {GgmlType::kBF16, 3, 1, 32, 16},
                          {GgmlType::kQ8_0, 8, 2, 64, 5}};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(sh.type) << " heads "
                                      << sh.n_heads << "/" << sh.n_kv_heads);
    const AttentionCase c =
        MakeAttentionCase(sh.type, sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.block_size, 3);
    for (int32_t n_splits : {1, 3, 64}) {
      SCOPED_TRACE(::testing::Message() << n_splits << " splits");
      ExpectClose(ReplayAttentionKernel(c, n_splits), c.cpu_out, 2e-5f);
    }
  }
}

// MLA's weights and query for an MLA AttentionCase, and CpuBackend::MlaAttention's output.
struct MlaInputs {
  static constexpr int32_t kKvl = 64, kRope = 16, kNope = 24, kVDim = 20;
  std::vector<float> q, w_uk, w_uv, cpu_out;
  MlaAttentionWeights Weights() const {
    MlaAttentionWeights w;
    w.w_uk = w_uk.data();
    w.w_uv = w_uv.data();
    w.kv_lora_rank = kKvl;
    w.nope_dim = kNope;
    w.v_head_dim = kVDim;
    return w;
  }
};

MlaInputs MakeMlaInputs(const AttentionCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  MlaInputs in;
  const int32_t h = c.n_heads;
  in.q = RandomVector(size_t(c.n_tokens()) * h * (in.kNope + in.kRope), rng, -2.0f, 2.0f);
  in.w_uk = RandomVector(size_t(h) * in.kNope * in.kKvl, rng, -0.3f, 0.3f);
  in.w_uv = RandomVector(size_t(h) * in.kVDim * in.kKvl, rng, -0.3f, 0.3f);
  in.cpu_out.resize(size_t(c.n_tokens()) * h * in.kVDim);
  cpu::CpuBackend cpu(1);
  EXPECT_TRUE(cpu.MlaAttention(*c.cache, AttentionCase::kLayer, c.Mask(), in.q.data(), h,
                               in.Weights(), in.cpu_out.data(), 0.0f)
                  .ok());
  return in;
}

// The MLA kernels on the host: absorb q, the split attention over the latent rows as one head
// (a q8_0 row's RoPE part read as f16 at rope_offset_bytes, as tail_start/tail_offset_bytes
// tell the kernel), un-absorb; against CpuBackend::MlaAttention within 5e-5.
TEST(CudaPagedIndex, MlaAlgorithmReplayMatchesCpu) {
  using In = MlaInputs;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kF32}) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type));
    const AttentionCase c = MakeAttentionCase(KvLayout::Mla(2, In::kKvl, In::kRope, type, 8), 4, 7);
    const MlaInputs in = MakeMlaInputs(c, 8);
    const KvLayout& layout = c.cache->layout();
    const int32_t row = layout.row_elems(), h_n = c.n_heads;
    std::vector<float> q_abs(size_t(c.n_tokens()) * h_n * row);
    for (int32_t t = 0; t < c.n_tokens(); ++t) {
      for (int32_t h = 0; h < h_n; ++h) {
        const float* q = in.q.data() + (size_t(t) * h_n + h) * (In::kNope + In::kRope);
        float* qa = q_abs.data() + (size_t(t) * h_n + h) * row;
        for (int32_t j = 0; j < row; ++j) {
          float v = 0.0f;
          if (j < In::kKvl) {
            for (int32_t n = 0; n < In::kNope; ++n) {
              v += in.w_uk[(size_t(h) * In::kNope + n) * In::kKvl + j] * q[n];
            }
          } else {
            v = q[In::kNope + j - In::kKvl];
          }
          qa[j] = v;
        }
      }
    }
    const QuantKernels* c_decode = GetQuantKernels(layout.elem_type(), CpuLevel::kScalar);
    const QuantKernels* r_decode = GetQuantKernels(layout.rope_elem_type(), CpuLevel::kScalar);
    const KvPlacement& placement = c.cache->placement();
    const auto* pool = reinterpret_cast<const uint8_t*>(placement.base);
    auto read_row = [&](int32_t block, int32_t slot, int32_t, bool, float* out) {
      const uint8_t* r = pool + cuda::RowByteOffset(block, slot, placement.block_stride,
                                                    layout.LatentTileIndex(AttentionCase::kLayer) *
                                                        placement.tile_stride,
                                                    layout.row_bytes());
      c_decode->dequantize(r, out, In::kKvl);
      r_decode->dequantize(r + layout.rope_offset_bytes(), out + In::kKvl, In::kRope);
    };
    const float scale = 1.0f / std::sqrt(static_cast<float>(In::kNope + In::kRope));
    const std::vector<float> o_lat =
        ReplaySplitAttention(c, q_abs.data(), h_n, 1, row, scale, 3, read_row);
    std::vector<float> out(in.cpu_out.size());
    for (int32_t th = 0; th < c.n_tokens() * h_n; ++th) {
      for (int32_t v = 0; v < In::kVDim; ++v) {
        float sum = 0.0f;
        for (int32_t j = 0; j < In::kKvl; ++j) {
          sum += in.w_uv[(size_t(th % h_n) * In::kVDim + v) * In::kKvl + j] * o_lat[th * row + j];
        }
        out[size_t(th) * In::kVDim + v] = sum;
      }
    }
    ExpectClose(out, in.cpu_out, 5e-5f);
  }
}

// Logits with ties (multiples of 1/4) and a few banned (-inf) tokens.
std::vector<float> SamplingLogits(int32_t vocab, std::mt19937& rng) {
  std::vector<float> logits(vocab);
  std::uniform_int_distribution<int> level(-40, 12);
  for (float& l : logits) l = 0.25f * static_cast<float>(level(rng));
  for (int i = 0; i < vocab / 50; ++i) logits[rng() % vocab] = -INFINITY;
  return logits;
}

// The device sampler's steps on the host: the top-k candidates in RanksBefore order (the kernel's
// k arg-max passes select exactly these), then SampleSortedCandidates.
int32_t ReplayDeviceSampler(const std::vector<float>& logits, const KilnCudaSamplingParams& p,
                            double u) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > -INFINITY) ids.push_back(i);
  }
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return cuda::RanksBefore(logits[a], a, logits[b], b); });
  const size_t k = p.temperature <= 0.0f ? 1 : static_cast<size_t>(p.top_k);
  ids.resize(std::min(ids.size(), k));
  std::vector<float> cand_logits;
  for (int32_t id : ids) cand_logits.push_back(logits[id]);
  std::vector<double> scratch(ids.size());
  return cuda::SampleSortedCandidates(cand_logits.data(), ids.data(),
                                      static_cast<int32_t>(ids.size()), p.top_p, p.min_p,
                                      p.temperature, u, scratch.data());
}

std::vector<KilnCudaSamplingParams> SamplingParamSets() {
  return {{40, 0.95f, 0.05f, 0.8f},  // kiln's defaults
          {1, 1.0f, 0.0f, 1.0f},    {5, 1.0f, 0.0f, 1.0f},  {100, 0.5f, 0.0f, 1.3f},
          {100, 1.0f, 0.2f, 0.7f},  {40, 0.0f, 0.0f, 1.0f}, {40, 0.95f, 0.05f, 0.0f},
          {200, 0.99f, 0.01f, 2.0f}};
}

sample::SamplerParams CpuParams(const KilnCudaSamplingParams& p) {
  sample::SamplerParams s;
  s.penalty_last_n = 0;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.temperature = p.temperature;
  return s;
}

// Same token as the CPU sampler (Apply, then SampleWithUniform with the same u) for every
// parameter set on 150 logit rows with ties and banned tokens.
TEST(CudaSampleChain, ReplayDrawsTheCpuSamplersToken) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const KilnCudaSamplingParams& p : SamplingParamSets()) {
    sample::Sampler cpu(CpuParams(p));
    sample::Distribution dist;
    for (int trial = 0; trial < 150; ++trial) {
      const std::vector<float> logits = SamplingLogits(500, rng);
      const double u = uniform(rng);
      ASSERT_TRUE(cpu.Apply(logits, {}, &dist).ok());
      ASSERT_EQ(ReplayDeviceSampler(logits, p, u), sample::Sampler::SampleWithUniform(dist, u))
          << "top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " T "
          << p.temperature << " trial " << trial;
    }
  }
}

// ---- On a device
// ---------------------------------------------------------------------------------

using testing::BuiltModule;
using ::testing::HasSubstr;
using testing::LastError;

// The plan's view of a layer addresses the rows the CPU's cache hands out, for GQA and MLA
// layouts (a q8_0 MLA row's RoPE part as the f16 tail, the other types' rows all one type).
TEST(CudaPlan, PagedKvOfAddressesTheCacheRows) {
  const absl::StatusOr<KvLayout> layouts[] = {
      KvLayout::Gqa(2, 2, 32, GgmlType::kF16, 8), KvLayout::Gqa(2, 3, 64, GgmlType::kQ8_0, 5),
      KvLayout::Mla(2, MlaInputs::kKvl, MlaInputs::kRope, GgmlType::kF16, 8),
      KvLayout::Mla(2, MlaInputs::kKvl, MlaInputs::kRope, GgmlType::kQ8_0, 8)};
  for (const absl::StatusOr<KvLayout>& layout : layouts) {
    ASSERT_TRUE(layout.ok()) << layout.status();
    const bool mla = layout->kind() == KvAttentionKind::kMla;
    SCOPED_TRACE(::testing::Message()
                 << (mla ? "mla " : "gqa ") << static_cast<int>(layout->elem_type()));
    const AttentionCase c = MakeAttentionCase(layout, 2 * layout->n_kv_heads(), 3);
    const KilnCudaPagedKv kv =
        cuda::PagedKvOf(*layout, c.cache->placement(), c.cache->NumBlocks(), AttentionCase::kLayer);
    EXPECT_EQ(kv.n_blocks, c.cache->NumBlocks());
    EXPECT_EQ(kv.block_size, layout->block_size());
    EXPECT_EQ(kv.head_dim, layout->row_elems());
    EXPECT_EQ(kv.n_kv_heads, mla ? 1 : layout->n_kv_heads());
    EXPECT_EQ(kv.elem_type, static_cast<uint32_t>(layout->elem_type()));
    const bool q8_mla = mla && layout->elem_type() == GgmlType::kQ8_0;
    EXPECT_EQ(kv.tail_start, q8_mla ? MlaInputs::kKvl : 0);
    EXPECT_EQ(kv.tail_offset_bytes, q8_mla ? int64_t(layout->rope_offset_bytes()) : 0);
    auto row_at = [&](const void* base, KvSlot s, int32_t h) {
      return static_cast<const std::byte*>(base) + s.block * kv.block_stride_bytes +
             h * kv.head_stride_bytes + s.offset * kv.row_bytes;
    };
    for (int32_t pos = 0; pos < 37; ++pos) {
      const absl::StatusOr<KvSlot> slot = c.cache->SlotOf(c.ids[0], pos);
      ASSERT_TRUE(slot.ok()) << slot.status();
      if (mla) {
        EXPECT_EQ(row_at(kv.d_k_base, *slot, 0), c.cache->LatentRow(*slot, AttentionCase::kLayer));
        EXPECT_EQ(kv.d_v_base, kv.d_k_base);
        continue;
      }
      for (int32_t h = 0; h < layout->n_kv_heads(); ++h) {
        EXPECT_EQ(row_at(kv.d_k_base, *slot, h), c.cache->KeyRow(*slot, AttentionCase::kLayer, h));
        EXPECT_EQ(row_at(kv.d_v_base, *slot, h),
                  c.cache->ValueRow(*slot, AttentionCase::kLayer, h));
      }
    }
  }
}

// The packed mask, read back through the kernels' index code, is the mask: each token's visible
// positions in order and their cache slots (KvCache::SlotOf), for causal, windowed and tree
// tokens; a mask without a window or extras packs them as absent.
TEST(CudaPlan, PackedMaskWalksAsTheMask) {
  const AttentionCase c = MakeAttentionCase(GgmlType::kF16, 4, 2, 32, 8, 4);
  const AttentionMask mask = c.Mask();
  const cuda::PackedMask packed = cuda::PackMask(mask);
  std::vector<int32_t> copy = packed.data;  // what the backend uploads
  const KilnCudaAttentionBatch b = cuda::BatchAt(packed, copy.data());
  EXPECT_EQ(b.n_tokens, c.n_tokens());
  ASSERT_NE(b.d_error, nullptr);
  EXPECT_EQ(*b.d_error, 0);
  const cuda::VisibleRows rows{b.d_seq, b.d_n_visible, b.d_first_visible, b.d_extra_indptr,
                               b.d_extra_positions};
  const cuda::BlockTables tables{b.d_kv_indptr, b.d_kv_indices, 8, c.cache->NumBlocks()};
  int32_t max_visible = 0;
  for (int32_t t = 0; t < c.n_tokens(); ++t) {
    std::vector<int32_t> want;
    for (int32_t p = mask.first_visible[t]; p < mask.n_visible[t]; ++p) want.push_back(p);
    for (int32_t i = mask.extra_indptr[t]; i < mask.extra_indptr[t + 1]; ++i) {
      want.push_back(mask.extra_positions[i]);
    }
    max_visible = std::max<int32_t>(max_visible, static_cast<int32_t>(want.size()));
    ASSERT_EQ(cuda::VisibleCount(rows, t), static_cast<int32_t>(want.size())) << "token " << t;
    for (int32_t i = 0; i < static_cast<int32_t>(want.size()); ++i) {
      const int32_t pos = cuda::VisiblePosition(rows, t, i);
      ASSERT_EQ(pos, want[i]) << "token " << t << " row " << i;
      int32_t block = -1, offset = -1;
      ASSERT_TRUE(cuda::LocatePosition(tables, mask.seq[t], pos, &block, &offset));
      const absl::StatusOr<KvSlot> slot = c.cache->SlotOf(c.ids[mask.seq[t]], pos);
      ASSERT_TRUE(slot.ok()) << slot.status();
      EXPECT_EQ(block, slot->block);
      EXPECT_EQ(offset, slot->offset);
    }
  }
  EXPECT_EQ(packed.max_visible, max_visible);

  AttentionMask plain = mask;
  plain.first_visible = {};
  plain.extra_indptr = {};
  plain.extra_positions = {};
  const cuda::PackedMask p2 = cuda::PackMask(plain);
  std::vector<int32_t> copy2 = p2.data;
  const KilnCudaAttentionBatch b2 = cuda::BatchAt(p2, copy2.data());
  EXPECT_EQ(b2.d_first_visible, nullptr);
  EXPECT_EQ(b2.d_extra_indptr, nullptr);
  EXPECT_EQ(b2.d_extra_positions, nullptr);
  EXPECT_EQ(copy2.size(), 2 * c.seq.size() + c.tables.indptr.size() + c.tables.indices.size() + 1);
  EXPECT_EQ(p2.max_visible, 50);  // the windowed token sees its whole prefix without the window
}

// A layout with a sliding-window group (layer 1; window 64, so nothing is released): the packed
// table is the asked group's, each position locating its slot's block of that group, which is
// another block than group 0's.
TEST(CudaPlan, PackedMaskTakesTheGroupsTable) {
  const std::vector<uint8_t> sliding = {0, 1};
  auto grouped = KvLayout::Gqa(2, 2, 32, GgmlType::kF16, 8)->WithSlidingGroups(sliding, 64);
  const AttentionCase c = MakeAttentionCase(grouped, 4, 6);
  ASSERT_EQ(c.cache->layout().layer_group(AttentionCase::kLayer), 1);
  const AttentionMask mask = c.Mask();
  for (int32_t group : {0, 1}) {
    SCOPED_TRACE(group);
    const cuda::PackedMask packed = cuda::PackMask(mask, group);
    std::vector<int32_t> copy = packed.data;
    const KilnCudaAttentionBatch b = cuda::BatchAt(packed, copy.data());
    const cuda::BlockTables tables{b.d_kv_indptr, b.d_kv_indices, 8, c.cache->NumBlocks()};
    int32_t other_than_group_0 = 0;
    for (int32_t s = 0; s < 3; ++s) {
      for (int32_t pos = 0; pos < 25; ++pos) {
        int32_t block = -1, offset = -1;
        ASSERT_TRUE(cuda::LocatePosition(tables, s, pos, &block, &offset));
        const absl::StatusOr<KvSlot> slot = c.cache->SlotOf(c.ids[s], pos);
        ASSERT_TRUE(slot.ok()) << slot.status();
        EXPECT_EQ(block, slot->group_block(group)) << "sequence " << s << " position " << pos;
        EXPECT_EQ(offset, slot->offset);
        other_than_group_0 += block != slot->block ? 1 : 0;
      }
    }
    EXPECT_EQ(other_than_group_0, group == 0 ? 0 : 3 * 25);
  }
}

TEST(CudaPlan, MatMulPathByTokensTypeAndShape) {
  using cuda::MatMulPath;
  const cuda::MatMulCaps both{8, true}, gemm_only{0, true}, none{};
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4096, 4096, 1), MatMulPath::kGemv);
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4096, 4096, cuda::kGemvMaxTokens),
            MatMulPath::kGemv);
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4096, 4096, cuda::kGemvMaxTokens + 1),
            MatMulPath::kGemm);
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4096, 4096, 512), MatMulPath::kGemm);
  // Not on the device, no kernel for the type, no tokens: the CPU.
  EXPECT_EQ(cuda::ChooseMatMulPath(both, false, 4096, 4096, 1), MatMulPath::kCpu);
  EXPECT_EQ(cuda::ChooseMatMulPath(none, true, 4096, 4096, 1), MatMulPath::kCpu);
  EXPECT_EQ(cuda::ChooseMatMulPath(none, true, 4096, 4096, 512), MatMulPath::kCpu);
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4096, 4096, 0), MatMulPath::kCpu);
  // A shape the f16 GEMM does not take (n_out not a multiple of 8): GEMV in chunks, else the CPU.
  EXPECT_EQ(cuda::ChooseMatMulPath(both, true, 4100, 4096, 64), MatMulPath::kGemv);
  EXPECT_EQ(cuda::ChooseMatMulPath(gemm_only, true, 4100, 4096, 64), MatMulPath::kCpu);
  EXPECT_EQ(cuda::ChooseMatMulPath(gemm_only, true, 4096, 4096, 1), MatMulPath::kGemm);
}

// Host bytes find their part of the device copy of the range that holds them all, and nothing
// else: not a range's neighbour, not bytes that run past its end, not a null pointer.
TEST(CudaPlan, DeviceCopiesFindTheRangeHoldingTheBytes) {
  // Fake addresses (never dereferenced): two host ranges with a gap, their device copies.
  auto at = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  cuda::DeviceCopies copies;
  copies.Add(at(0x1000), 0x100, at(0x90000));
  copies.Add(at(0x2000), 0x40, at(0xa0000));
  EXPECT_EQ(copies.bytes(), 0x140u);
  EXPECT_EQ(copies.Find(at(0x1000), 0x100), at(0x90000));  // the whole tensor
  EXPECT_EQ(copies.Find(at(0x1040), 0x20), at(0x90040));   // rows inside it
  EXPECT_EQ(copies.Find(at(0x10ff), 1), at(0x900ff));      // its last byte
  EXPECT_EQ(copies.Find(at(0x1040), 0xc1), nullptr);       // one byte past its end
  EXPECT_EQ(copies.Find(at(0x1100), 1), nullptr);          // the gap
  EXPECT_EQ(copies.Find(at(0x0fff), 2), nullptr);          // before the first range
  EXPECT_EQ(copies.Find(at(0x2010), 0x30), at(0xa0010));   // the second range
  EXPECT_EQ(copies.Find(at(0x2010), 0x31), nullptr);
  EXPECT_EQ(copies.Find(nullptr, 0), nullptr);
  EXPECT_EQ(cuda::DeviceCopies().Find(at(0x1000), 1), nullptr);  // nothing recorded
}

TEST(CudaPlan, SplitsFillTheDeviceWithoutTinySplits) {
  EXPECT_EQ(cuda::ChooseSplits(32, 64), 1);      // a short context: one split
  EXPECT_EQ(cuda::ChooseSplits(64, 32768), 33);  // decode, 64 heads, 32k rows: 2112 / 64
  EXPECT_EQ(cuda::ChooseSplits(1, 32768), cuda::kMaxSplits);  // the kernel's limit
  EXPECT_EQ(cuda::ChooseSplits(8, 200), 3);                   // 64 rows a split at least
  EXPECT_EQ(cuda::ChooseSplits(512 * 32, 4096), 1);  // a prefill fills the device by itself
  for (int64_t n_rows : {1, 7, 100, 1000}) {
    for (int32_t max_visible : {0, 1, 65, 1000, 100000}) {
      const int32_t s = cuda::ChooseSplits(n_rows, max_visible);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, cuda::kMaxSplits);
      if (s > 1) {
        EXPECT_GE(max_visible / s, cuda::kMinRowsPerSplit) << n_rows << " " << max_visible;
      }
    }
  }
}

// Bad arguments are refused before anything is launched, with or without a device.
TEST(CudaKernelsAbi, BadArgumentsReturnStatusAndMessage) {
  std::string why;
  std::optional<CudaModule> m = BuiltModule(&why);
  if (!m) GTEST_SKIP() << why;
  float fake[4];  // never dereferenced: the calls fail their checks first
  EXPECT_EQ(m->gemv(8, fake, 4, 32, fake, 9, fake, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("n_tokens must be 1..8"));
  EXPECT_EQ(m->gemm_f16(nullptr, fake, 8, 8, fake, 1, fake, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_gemm_f16"));
  KilnCudaPagedKv kv = {fake, fake, 1024, 256, 128, 4, 16, 2, 64, 1, 0, 0};
  int32_t ints[4] = {0};
  KilnCudaAttentionBatch batch = {1, ints, ints, ints, ints, nullptr, nullptr, nullptr, nullptr};
  EXPECT_EQ(m->paged_attention(&kv, &batch, fake, 4, 0.0f, 0, fake, 1 << 20, fake, nullptr),
            KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("n_splits 0"));
  EXPECT_EQ(m->paged_attention(&kv, &batch, fake, 4, 0.0f, 2, fake, 10, fake, nullptr),
            KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("workspace of 10 floats, 528 needed"));
  kv.elem_type = 12;  // Q4_K is no cache type
  EXPECT_EQ(m->paged_attention(&kv, &batch, fake, 4, 0.0f, 2, fake, 1 << 20, fake, nullptr),
            KILN_CUDA_UNSUPPORTED);
  EXPECT_EQ(m->paged_attention_workspace(1, 4, 2, 64), size_t{528});
  const KilnCudaSamplingParams no_top_k = {0, 1.0f, 0.0f, 1.0f};
  double u = 0.5;
  int32_t token = 0;
  EXPECT_EQ(m->sample(fake, 1, 100, &no_top_k, &no_top_k, &u, &token, nullptr),
            KILN_CUDA_UNSUPPORTED);
  EXPECT_THAT(LastError(*m), HasSubstr("top_k 0"));
  // The matmul capabilities: the six GEMV/GEMM types, GEMV's limit equal to the backend's
  // threshold, nothing for the others, and a null output refused.
  int32_t gemv_max = -1, gemm = -1;
  for (GgmlType t : {GgmlType::kF16, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0,
                     GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    ASSERT_EQ(m->matmul_caps(static_cast<uint32_t>(t), &gemv_max, &gemm), KILN_CUDA_OK);
    EXPECT_EQ(gemv_max, cuda::kGemvMaxTokens) << static_cast<int>(t);
    EXPECT_EQ(gemm, 1) << static_cast<int>(t);
  }
  for (uint32_t t : {0u, 2u, 13u, 30u, 999u}) {  // F32, Q4_0, Q5_K, BF16, unknown
    ASSERT_EQ(m->matmul_caps(t, &gemv_max, &gemm), KILN_CUDA_OK);
    EXPECT_EQ(gemv_max, 0) << t;
    EXPECT_EQ(gemm, 0) << t;
  }
  EXPECT_EQ(m->matmul_caps(12, nullptr, &gemm), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_matmul_caps: null output"));
}

// Device memory and a stream for one test; every call checked.
class DeviceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    m_ = GetCudaModule(&why);
    if (m_ == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_EQ(m_->stream_create(0, &stream_), KILN_CUDA_OK) << LastError(*m_);
  }
  void TearDown() override {
    if (m_ == nullptr) return;
    for (void* p : buffers_) m_->device_free(p);
    m_->stream_destroy(stream_);
  }
  template <typename T>
  T* Upload(const T* host, size_t n) {
    void* d = Alloc(n * sizeof(T));
    EXPECT_EQ(m_->copy_h2d_async(d, host, n * sizeof(T), stream_), KILN_CUDA_OK) << LastError(*m_);
    EXPECT_EQ(m_->stream_synchronize(stream_), KILN_CUDA_OK) << LastError(*m_);
    return static_cast<T*>(d);
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    return v.empty() ? nullptr : Upload(v.data(), v.size());
  }
  void* Alloc(size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(m_->device_alloc(0, bytes, &d), KILN_CUDA_OK) << LastError(*m_);
    buffers_.push_back(d);
    return d;
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(m_->stream_synchronize(stream_), KILN_CUDA_OK) << LastError(*m_);
    EXPECT_EQ(m_->copy_d2h_async(v.data(), d, n * sizeof(T), stream_), KILN_CUDA_OK);
    EXPECT_EQ(m_->stream_synchronize(stream_), KILN_CUDA_OK) << LastError(*m_);
    return v;
  }

  const CudaModule* m_ = nullptr;
  kiln_cuda_stream stream_ = nullptr;
  std::vector<void*> buffers_;
};

// A random [n_out, n_in] weight quantized with the CPU's reference quantizer, and its exact f32
// decoding by the CPU's reference dequantizer.
struct QuantizedWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> decoded;
};

QuantizedWeight MakeWeight(GgmlType type, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  const QuantKernels* k = GetQuantKernels(type, CpuLevel::kScalar);
  EXPECT_TRUE(k != nullptr && k->quantize != nullptr && k->dequantize != nullptr);
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(type));
  EXPECT_TRUE(info.has_value());
  const size_t row_bytes = GgmlRowBytes(*info, static_cast<uint64_t>(n_in));
  QuantizedWeight w;
  w.bytes.resize(row_bytes * n_out);
  w.decoded.resize(size_t(n_out) * n_in);
  const std::vector<float> f = RandomVector(w.decoded.size(), rng);
  for (int64_t r = 0; r < n_out; ++r) {
    k->quantize(f.data() + r * n_in, w.bytes.data() + r * row_bytes, n_in);
    k->dequantize(w.bytes.data() + r * row_bytes, w.decoded.data() + r * n_in, n_in);
  }
  return w;
}

using CudaKernels = DeviceFixture;

// The GEMV kernel's word-at-a-time unit decoders (gemv_units.h), replayed on the host: every
// unit of every row gives the CPU dequantizer's values (within one rounding of d * q + m, which
// either side may fuse), and HalfBits is the CPU's f16 conversion for every bit pattern.
template <uint32_t kType>
void ExpectWordUnitsDecodeAsTheCpu(GgmlType type, std::mt19937& rng) {
  using U = cuda::WordUnit<kType>;
  const int64_t n_out = 5, n_in = 512;
  const QuantizedWeight w = MakeWeight(type, n_out, n_in, rng);
  const size_t row_bytes = w.bytes.size() / n_out;
  ASSERT_EQ(row_bytes % U::kAlign, 0u);
  for (int64_t r = 0; r < n_out; ++r) {
    for (int64_t u = 0; u < n_in / U::kElems; ++u) {
      float got[U::kElems];
      U::Decode(w.bytes.data() + r * row_bytes, u, got);
      for (int e = 0; e < U::kElems; ++e) {
        const float want = w.decoded[r * n_in + u * U::kElems + e];
        ASSERT_NEAR(got[e], want, 1e-6f * std::max(1.0f, std::fabs(want)))
            << "row " << r << " unit " << u << " element " << e;
      }
    }
  }
}

TEST(CudaGemvUnits, DecodeAsTheCpuDequantizers) {
  std::mt19937 rng(31);
  ExpectWordUnitsDecodeAsTheCpu<cuda::kTypeF16>(GgmlType::kF16, rng);
  ExpectWordUnitsDecodeAsTheCpu<cuda::kTypeQ4_1>(GgmlType::kQ4_1, rng);
  ExpectWordUnitsDecodeAsTheCpu<cuda::kTypeQ8_0>(GgmlType::kQ8_0, rng);
  ExpectWordUnitsDecodeAsTheCpu<cuda::kTypeQ4_K>(GgmlType::kQ4_K, rng);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float got = cuda::HalfBits(bits), want = Fp16ToFp32(static_cast<uint16_t>(bits));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
    } else {
      ASSERT_EQ(got, want) << bits;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << bits;
    }
  }
}

// GEMV: each output within f32 accumulation error of the exact product of the CPU-decoded weight
// with x (|err| <= 1e-5 * sum |w||x|, n_in 512: ~60x the f32 rounding bound n_in * 2^-24), and
// within the CPU backend's own activation-quantization error of CpuBackend::MatMul.
TEST_F(CudaKernels, GemvMatchesCpuForEveryWeightType) {
  std::mt19937 rng(11);
  const int64_t n_out = 67, n_in = 512;  // n_out not a multiple of the 4 rows of a thread block
  cpu::CpuBackend cpu(1);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type));
    const QuantizedWeight w = MakeWeight(type, n_out, n_in, rng);
    // misaligned: the weight 1 byte and x 1 float past an allocation's start, so the kernels'
    // element-by-element path runs (the unit decoders need aligned words, float4 loads of x
    // aligned rows).
    for (auto [n_tokens, misaligned] :
         {std::pair<int64_t, bool>{1, false}, {3, false}, {8, false}, {3, true}}) {
      SCOPED_TRACE(::testing::Message() << n_tokens << " tokens, misaligned " << misaligned);
      std::vector<float> x = RandomVector(size_t(n_tokens) * n_in, rng);
      std::vector<uint8_t> w_bytes = w.bytes;
      if (misaligned) {
        x.insert(x.begin(), 0.0f);
        w_bytes.insert(w_bytes.begin(), 0);
      }
      const uint8_t* d_w = Upload(w_bytes) + (misaligned ? 1 : 0);
      const float* d_x = Upload(x) + (misaligned ? 1 : 0);
      if (misaligned) x.erase(x.begin());
      auto* d_y = static_cast<float*>(Alloc(size_t(n_tokens) * n_out * sizeof(float)));
      ASSERT_EQ(
          m_->gemv(static_cast<uint32_t>(type), d_w, n_out, n_in, d_x, n_tokens, d_y, stream_),
          KILN_CUDA_OK)
          << LastError(*m_);
      const std::vector<float> got = Download(d_y, size_t(n_tokens) * n_out);
      std::vector<float> cpu_y(got.size());
      WeightView view;
      view.type = type;
      view.data = w.bytes.data();
      view.n_in = n_in;
      view.n_out = n_out;
      ASSERT_TRUE(cpu.MatMul(view, x.data(), n_tokens, cpu_y.data()).ok());
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t o = 0; o < n_out; ++o) {
          double exact = 0, magnitude = 0;
          for (int64_t i = 0; i < n_in; ++i) {
            exact += double(w.decoded[o * n_in + i]) * x[t * n_in + i];
            magnitude += std::fabs(double(w.decoded[o * n_in + i]) * x[t * n_in + i]);
          }
          const float g = got[t * n_out + o];
          ASSERT_NEAR(g, exact, 1e-5 * magnitude) << "token " << t << " row " << o;
          // The CPU quantizes x to 8 bits for the integer types: ~1% of the magnitude.
          ASSERT_NEAR(g, cpu_y[t * n_out + o], 1e-2 * magnitude) << "token " << t << " row " << o;
        }
      }
    }
  }
}

// Dequantization to f16 is the CPU's decoding rounded to f16, bit for bit; the cuBLASLt GEMM of
// f16 operands (products exact in f32) is within f32 accumulation error of the exact sum.
TEST_F(CudaKernels, DequantizeF16AndGemmMatchCpu) {
  std::mt19937 rng(12);
  const int64_t n_out = 96, n_in = 512, n_tokens = 24;
  KilnCudaGemmContext* ctx = nullptr;
  ASSERT_EQ(m_->gemm_context_create(0, 4 << 20, &ctx), KILN_CUDA_OK) << LastError(*m_);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type));
    const QuantizedWeight w = MakeWeight(type, n_out, n_in, rng);
    const uint8_t* d_w = Upload(w.bytes);
    auto* d_w16 = static_cast<uint16_t*>(Alloc(size_t(n_out) * n_in * 2));
    ASSERT_EQ(m_->dequantize_f16(static_cast<uint32_t>(type), d_w, n_out, n_in, d_w16, stream_),
              KILN_CUDA_OK)
        << LastError(*m_);
    const std::vector<uint16_t> w16 = Download(d_w16, size_t(n_out) * n_in);
    for (size_t i = 0; i < w16.size(); ++i) {
      ASSERT_EQ(w16[i], Fp32ToFp16(w.decoded[i])) << "element " << i;
    }
    const std::vector<float> x = RandomVector(size_t(n_tokens) * n_in, rng);
    const float* d_x = Upload(x);
    auto* d_y = static_cast<float*>(Alloc(size_t(n_tokens) * n_out * sizeof(float)));
    ASSERT_EQ(m_->gemm_f16(ctx, d_w16, n_out, n_in, d_x, n_tokens, d_y, stream_), KILN_CUDA_OK)
        << LastError(*m_);
    const std::vector<float> got = Download(d_y, size_t(n_tokens) * n_out);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        double exact = 0, magnitude = 0;
        for (int64_t i = 0; i < n_in; ++i) {
          const double p =
              double(Fp16ToFp32(w16[o * n_in + i])) * Fp16ToFp32(Fp32ToFp16(x[t * n_in + i]));
          exact += p;
          magnitude += std::fabs(p);
        }
        ASSERT_NEAR(got[t * n_out + o], exact, 1e-5 * magnitude) << "token " << t << " row " << o;
      }
    }
  }
  m_->gemm_context_destroy(ctx);
}

// Paged attention on the device against CpuBackend::Attention over the same cache bytes and mask
// (prefill chunk, windowed decode, tree nodes), |err| <= 5e-5 * max(1, |want|) (f32 sums in
// another order, expf), for each cache type and split count; a bad block id raises the flag.
TEST_F(CudaKernels, PagedAttentionMatchesCpu) {
  struct Shape {
    GgmlType type;
    int32_t n_heads, n_kv_heads, head_dim, block_size;
  };
  const Shape shapes[] = {{GgmlType::kF32, 4, 4, 40, 16},
                          {GgmlType::kF16, 6, 2, 64, 7},
                          {GgmlType::kBF16, 3, 1, 32, 16},
                          {GgmlType::kQ8_0, 8, 2, 64, 5},
                          {GgmlType::kF16, 8, 1, 256, 16}};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "type " << static_cast<int>(sh.type) << " heads " << sh.n_heads << "/"
                 << sh.n_kv_heads << " d " << sh.head_dim);
    const AttentionCase c =
        MakeAttentionCase(sh.type, sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.block_size, 5);
    const KvLayout& layout = c.cache->layout();
    // The host pool's bytes on the device, placed as on the host.
    const size_t pool_bytes = layout.block_bytes() * size_t(c.cache->NumBlocks());
    KvPlacement placement = c.cache->placement();
    placement.base = reinterpret_cast<std::byte*>(
        Upload(reinterpret_cast<const uint8_t*>(placement.base), pool_bytes));
    const KilnCudaPagedKv kv =
        cuda::PagedKvOf(layout, placement, c.cache->NumBlocks(), AttentionCase::kLayer);
    const int32_t zero = 0;
    KilnCudaAttentionBatch batch;
    batch.n_tokens = c.n_tokens();
    batch.d_seq = Upload(c.seq);
    batch.d_kv_indptr = Upload(c.tables.indptr);
    batch.d_kv_indices = Upload(c.tables.indices);
    batch.d_n_visible = Upload(c.n_visible);
    batch.d_first_visible = Upload(c.first_visible);
    batch.d_extra_indptr = Upload(c.extra_indptr);
    batch.d_extra_positions = Upload(c.extra_positions);
    batch.d_error = Upload(&zero, 1);
    const float* d_q = Upload(c.q);
    auto* d_out = static_cast<float*>(Alloc(c.q.size() * sizeof(float)));
    for (int32_t n_splits : {1, 3, 64}) {
      SCOPED_TRACE(::testing::Message() << n_splits << " splits");
      const size_t ws =
          m_->paged_attention_workspace(c.n_tokens(), sh.n_heads, n_splits, sh.head_dim);
      auto* d_ws = static_cast<float*>(Alloc(ws * sizeof(float)));
      ASSERT_EQ(m_->paged_attention(&kv, &batch, d_q, sh.n_heads, 0.0f, n_splits, d_ws, ws, d_out,
                                    stream_),
                KILN_CUDA_OK)
          << LastError(*m_);
      ExpectClose(Download(d_out, c.q.size()), c.cpu_out, 5e-5f);
      EXPECT_EQ(Download(batch.d_error, 1)[0], 0);
    }
    // A table naming a block past the pool: flagged, not read.
    std::vector<int32_t> bad = c.tables.indices;
    bad[0] = c.cache->NumBlocks() + 100;
    batch.d_kv_indices = Upload(bad);
    const size_t ws = m_->paged_attention_workspace(c.n_tokens(), sh.n_heads, 2, sh.head_dim);
    auto* d_ws = static_cast<float*>(Alloc(ws * sizeof(float)));
    ASSERT_EQ(m_->paged_attention(&kv, &batch, d_q, sh.n_heads, 0.0f, 2, d_ws, ws, d_out, stream_),
              KILN_CUDA_OK);
    EXPECT_EQ(Download(batch.d_error, 1)[0], 1);
  }
}

// The device sampler draws the CPU sampler's token for each row (same logits, parameters and u).
TEST_F(CudaKernels, SampleMatchesCpuSampler) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int32_t vocab = 49152;  // the default model's vocabulary
  std::vector<KilnCudaSamplingParams> params;
  for (int rep = 0; rep < 4; ++rep) {
    for (const KilnCudaSamplingParams& p : SamplingParamSets()) params.push_back(p);
  }
  const int64_t n_rows = static_cast<int64_t>(params.size());
  std::vector<float> logits;
  std::vector<double> u;
  for (int64_t r = 0; r < n_rows; ++r) {
    const std::vector<float> row = SamplingLogits(vocab, rng);
    logits.insert(logits.end(), row.begin(), row.end());
    u.push_back(uniform(rng));
  }
  auto* d_tokens = static_cast<int32_t*>(Alloc(n_rows * sizeof(int32_t)));
  ASSERT_EQ(m_->sample(Upload(logits), n_rows, vocab, Upload(params), params.data(), Upload(u),
                       d_tokens, stream_),
            KILN_CUDA_OK)
      << LastError(*m_);
  const std::vector<int32_t> got = Download(d_tokens, n_rows);
  sample::Distribution dist;
  for (int64_t r = 0; r < n_rows; ++r) {
    sample::Sampler cpu(CpuParams(params[r]));
    ASSERT_TRUE(
        cpu.Apply(std::span<const float>(logits).subspan(r * vocab, vocab), {}, &dist).ok());
    EXPECT_EQ(got[r], sample::Sampler::SampleWithUniform(dist, u[r])) << "row " << r;
  }
}

// MLA absorbed attention on the device against CpuBackend::MlaAttention on the same latent cache
// (f16 rows, and q8_0 rows whose RoPE part is f16) and mask, |err| <= 1e-4 * max(1, |want|): the
// f32 sums of the absorption (nope_dim terms) and un-absorption (kv_lora_rank terms) come on top
// of the attention's.
TEST_F(CudaKernels, MlaAttentionMatchesCpu) {
  using In = MlaInputs;
  const int32_t n_heads = 4, kvl = In::kKvl, nope = In::kNope, v_dim = In::kVDim;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kF32}) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type));
    const AttentionCase c =
        MakeAttentionCase(KvLayout::Mla(2, kvl, In::kRope, type, 8), n_heads, 7);
    const MlaInputs in = MakeMlaInputs(c, 8);
    const std::vector<float>& q = in.q;
    const std::vector<float>& w_uk = in.w_uk;
    const std::vector<float>& w_uv = in.w_uv;
    const std::vector<float>& want = in.cpu_out;
    const KvLayout& layout = c.cache->layout();
    // The host pool's bytes on the device, placed as on the host.
    const size_t pool_bytes = layout.block_bytes() * size_t(c.cache->NumBlocks());
    KvPlacement placement = c.cache->placement();
    placement.base = reinterpret_cast<std::byte*>(
        Upload(reinterpret_cast<const uint8_t*>(placement.base), pool_bytes));
    const KilnCudaPagedKv kv =
        cuda::PagedKvOf(layout, placement, c.cache->NumBlocks(), AttentionCase::kLayer);
    const int32_t zero = 0;
    KilnCudaAttentionBatch batch;
    batch.n_tokens = c.n_tokens();
    batch.d_seq = Upload(c.seq);
    batch.d_kv_indptr = Upload(c.tables.indptr);
    batch.d_kv_indices = Upload(c.tables.indices);
    batch.d_n_visible = Upload(c.n_visible);
    batch.d_first_visible = Upload(c.first_visible);
    batch.d_extra_indptr = Upload(c.extra_indptr);
    batch.d_extra_positions = Upload(c.extra_positions);
    batch.d_error = Upload(&zero, 1);
    const float* d_q = Upload(q);
    const float* d_w_uk = Upload(w_uk);
    const float* d_w_uv = Upload(w_uv);
    auto* d_out = static_cast<float*>(Alloc(want.size() * sizeof(float)));
    for (int32_t n_splits : {1, 5}) {
      const size_t ws =
          m_->mla_attention_workspace(c.n_tokens(), n_heads, n_splits, layout.row_elems());
      auto* d_ws = static_cast<float*>(Alloc(ws * sizeof(float)));
      ASSERT_EQ(m_->mla_attention(&kv, &batch, d_q, n_heads, d_w_uk, d_w_uv, kvl, nope, v_dim, 0.0f,
                                  n_splits, d_ws, ws, d_out, stream_),
                KILN_CUDA_OK)
          << LastError(*m_);
      ExpectClose(Download(d_out, want.size()), want, 1e-4f);
      EXPECT_EQ(Download(batch.d_error, 1)[0], 0);
    }
  }
}

}  // namespace
}  // namespace kiln
