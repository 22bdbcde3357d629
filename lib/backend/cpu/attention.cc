// Paged attention over block tables with causal or tree visibility (contract in ops.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/ops.h"
#include "lib/common/platform.h"
#include "lib/quant/activation.h"

namespace kiln::cpu {
namespace {

// Bytes of one K/V row of d elements (op_kernels.h's KvElem).
size_t RowBytes(KvElem e, int64_t d) {
  return static_cast<size_t>(e == KvElem::kF32 ? 4 * d : e == KvElem::kQ8_0 ? d / 32 * 34 : 2 * d);
}

// The softmax of n scaled scores in place, as ggml's soft_max_ext (op_kernels.h): scale, exp
// against the max with a double sum, then one multiply by the sum's inverse.
void ScaledSoftmax(const OpKernels& k, float* s, int64_t n, float scale) {
  k.scale(s, scale, n);
  const double sum = k.softmax_exp(s, k.max(s, n), n, s);
  k.scale(s, static_cast<float>(1.0 / sum), n);
}

absl::Status ValidateAttention(const PagedKvView& kv, const AttentionBatch& b, int32_t n_heads,
                               KvElem* k_elem, KvElem* v_elem) {
  if (kv.n_kv_heads <= 0 || kv.head_dim <= 0 || kv.block_size <= 0 || kv.n_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: n_kv_heads %d, head_dim %d, block_size %d must be positive, "
        "n_blocks %d >= 0",
        kv.n_kv_heads, kv.head_dim, kv.block_size, kv.n_blocks));
  }
  if (kv.head_dim > 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: head_dim %d > 1024 is not supported", kv.head_dim));
  }
  if (n_heads <= 0 || n_heads % kv.n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: n_heads %d is not a positive multiple of n_kv_heads %d",
                        n_heads, kv.n_kv_heads));
  }
  if (!KvElemOf(kv.k.type, k_elem) || !KvElemOf(kv.v.type, v_elem)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: K/V types must be f32, f16, bf16 or q8_0, got k ",
                     GgmlTypeName(static_cast<uint32_t>(kv.k.type)), ", v ",
                     GgmlTypeName(static_cast<uint32_t>(kv.v.type))));
  }
  if ((*k_elem == KvElem::kQ8_0 || *v_elem == KvElem::kQ8_0) && kv.head_dim % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: a q8_0 K/V cache needs head_dim a multiple of 32, got %d", kv.head_dim));
  }
  if (kv.k.base == nullptr || kv.v.base == nullptr) {
    return absl::InvalidArgumentError("PagedAttention: k.base or v.base is null");
  }
  const size_t n_tokens = b.seq.size();
  if (b.n_visible.size() != n_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PagedAttention: n_visible has %d entries, seq has %d", b.n_visible.size(), n_tokens));
  }
  if (b.kv_indptr.empty()) return absl::InvalidArgumentError("PagedAttention: kv_indptr is empty");
  const size_t n_seqs = b.kv_indptr.size() - 1;
  if (b.kv_indptr[0] < 0) {
    return absl::OutOfRangeError(
        absl::StrFormat("PagedAttention: kv_indptr[0] = %d is negative", b.kv_indptr[0]));
  }
  for (size_t s = 0; s < n_seqs; ++s) {
    if (b.kv_indptr[s + 1] < b.kv_indptr[s]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: kv_indptr decreases at index %d", s + 1));
    }
  }
  if (static_cast<size_t>(b.kv_indptr[n_seqs]) > b.kv_indices.size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("PagedAttention: kv_indptr[%d] = %d exceeds kv_indices size %d", n_seqs,
                        b.kv_indptr[n_seqs], b.kv_indices.size()));
  }
  for (int32_t i = b.kv_indptr[0]; i < b.kv_indptr[n_seqs]; ++i) {
    if (b.kv_indices[i] < 0 || b.kv_indices[i] >= kv.n_blocks) {
      return absl::OutOfRangeError(
          absl::StrFormat("PagedAttention: kv_indices[%d] = %d is outside [0, n_blocks = %d)", i,
                          b.kv_indices[i], kv.n_blocks));
    }
  }
  const bool has_first = !b.first_visible.empty();
  if (has_first && b.first_visible.size() != n_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PagedAttention: first_visible has %d entries, seq has %d",
                        b.first_visible.size(), n_tokens));
  }
  const bool has_extra = !b.extra_indptr.empty();
  if (has_extra) {
    if (b.extra_indptr.size() != n_tokens + 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: extra_indptr has %d entries, expected n_tokens + 1 = %d",
                          b.extra_indptr.size(), n_tokens + 1));
    }
    if (b.extra_indptr[0] < 0 ||
        static_cast<size_t>(b.extra_indptr[n_tokens]) > b.extra_positions.size()) {
      return absl::OutOfRangeError(absl::StrFormat(
          "PagedAttention: extra_indptr [%d, %d] does not fit extra_positions size %d",
          b.extra_indptr[0], b.extra_indptr[n_tokens], b.extra_positions.size()));
    }
  }
  for (size_t t = 0; t < n_tokens; ++t) {
    const int32_t s = b.seq[t];
    if (s < 0 || static_cast<size_t>(s) >= n_seqs) {
      return absl::OutOfRangeError(
          absl::StrFormat("PagedAttention: seq[%d] = %d is outside [0, %d)", t, s, n_seqs));
    }
    const int64_t capacity =
        static_cast<int64_t>(b.kv_indptr[s + 1] - b.kv_indptr[s]) * kv.block_size;
    const int32_t nv = b.n_visible[t];
    if (nv < 0 || nv > capacity) {
      return absl::OutOfRangeError(absl::StrFormat(
          "PagedAttention: n_visible[%d] = %d is outside [0, %d] (sequence %d has %d blocks)", t,
          nv, capacity, s, b.kv_indptr[s + 1] - b.kv_indptr[s]));
    }
    const int32_t first = has_first ? b.first_visible[t] : 0;
    if (first < 0 || first > nv) {
      return absl::OutOfRangeError(absl::StrFormat(
          "PagedAttention: first_visible[%d] = %d is outside [0, n_visible = %d]", t, first, nv));
    }
    int32_t n_extra = 0;
    if (has_extra) {
      const int32_t e0 = b.extra_indptr[t], e1 = b.extra_indptr[t + 1];
      if (e1 < e0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("PagedAttention: extra_indptr decreases at index %d", t + 1));
      }
      int64_t prev = static_cast<int64_t>(nv) - 1;
      for (int32_t i = e0; i < e1; ++i) {
        const int32_t p = b.extra_positions[i];
        if (p <= prev || p >= capacity) {
          return absl::OutOfRangeError(absl::StrFormat(
              "PagedAttention: extra_positions[%d] = %d (token %d) must be > %d and < %d "
              "(increasing, beyond n_visible, inside the sequence's blocks)",
              i, p, t, prev, capacity));
        }
        prev = p;
      }
      n_extra = e1 - e0;
    }
    if (nv - first + n_extra == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("PagedAttention: token %d sees no context position", t));
    }
  }
  return absl::OkStatus();
}

// kiln's batch-invariant order (AttentionOrder::kBatchInvariant). One task per (chunk of up to
// kMaxChunkTokens consecutive tokens of one sequence, kv head): the rows every token of the
// chunk sees (its common causal prefix) are scored and accumulated in one call for all the
// chunk's heads, so each K row is widened once per chunk instead of once per token (each V row
// once per four heads); each token then continues with its own rows (the rest of its causal
// prefix, then its tree extras).
// Every score and every V chain is computed exactly as for the token alone (op_kernels.h), so the
// result does not depend on the chunking.
constexpr int64_t kMaxChunkTokens = 8;

size_t Align64(size_t bytes) { return (bytes + 63) & ~size_t{63}; }

// Bytes of one head's query quantized to Q8_0 blocks (for kv_scores_rows_q8_0).
size_t Q8RowBytes(int64_t d) { return static_cast<size_t>(d / 32 * 34); }

// The scores of n_q heads (q: [n_q, d] floats, q8: the same quantized to Q8_0 blocks when K is
// q8_0) against n rows: kv_scores_rows, or for a q8_0 cache kv_scores_rows_q8_0 (op_kernels.h).
struct ScoresKernel {
  const OpKernels& k;
  KvElem k_elem;
  int64_t d;
  QuantizeRowFn quantize_q8 = nullptr;  // set for a q8_0 K cache

  ScoresKernel(const OpKernels& kernels, KvElem elem, int64_t head_dim, CpuLevel level)
      : k(kernels), k_elem(elem), d(head_dim) {
    if (elem == KvElem::kQ8_0) quantize_q8 = ActivationQuantizer(GgmlType::kQ8_0, level);
  }
  // q8[h] = heads [0, n_q) of q quantized (a no-op unless K is q8_0).
  void Quantize(const float* q, int64_t n_q, uint8_t* q8) const {
    if (quantize_q8 == nullptr) return;
    for (int64_t h = 0; h < n_q; ++h) quantize_q8(q + h * d, q8 + h * Q8RowBytes(d), d);
  }
  void operator()(const float* q, const uint8_t* q8, int64_t n_q, const void* const* rows,
                  int64_t n_rows, float* scores, int64_t stride) const {
    if (quantize_q8 != nullptr) {
      k.kv_scores_rows_q8_0(q8, n_q, rows, n_rows, d, scores, stride);
    } else if (d % 16 == 0) {
      k.kv_scores_rows(q, n_q, rows, n_rows, k_elem, d, scores, stride);
    } else {
      GetOpKernels(CpuLevel::kScalar)
          .kv_scores_rows(q, n_q, rows, n_rows, k_elem, d, scores, stride);
    }
  }
};

// list[p - from] = the cache row of position p of one sequence (its block table `blocks`, kv head
// h, `offset` bytes into the row) for p in [from, to). Walks the table block by block: one
// division per call instead of two per row (the lists are rebuilt for every token and layer).
void ListRows(const KvTensorView& t, const int32_t* blocks, int64_t bs, int64_t h, size_t row_bytes,
              size_t offset, int64_t from, int64_t to, const void** list) {
  const uint8_t* base = static_cast<const uint8_t*>(t.base) + h * t.head_stride_bytes + offset;
  int64_t b = from / bs, r = from % bs;
  for (int64_t p = from; p < to; ++b, r = 0) {
    const uint8_t* block = base + blocks[b] * t.block_stride_bytes;
    const int64_t n = std::min(bs - r, to - p);
    for (int64_t i = 0; i < n; ++i) *list++ = block + (r + i) * row_bytes;
    p += n;
  }
}

// One thread's workspace for a chunk: scores [n_q_max, max_visible], q and out of the chunk's
// heads [n_q_max, d] each (floats), q quantized to Q8_0 blocks [n_q_max, d / 32] (for a q8_0
// K cache), then the K and V row pointers of the common prefix and of one token's own rows
// [max_visible] each.
struct ChunkWorkspace {
  float* scores;
  float* q;
  float* out;
  uint8_t* q8;
  const void** k_common;
  const void** v_common;
  const void** k_own;
  const void** v_own;

  static size_t Bytes(int64_t n_q_max, int64_t max_visible, int64_t d) {
    return Align64(n_q_max * max_visible * sizeof(float)) +
           2 * Align64(n_q_max * d * sizeof(float)) + Align64(n_q_max * Q8RowBytes(d)) +
           4 * Align64(max_visible * sizeof(void*));
  }
  ChunkWorkspace(uint8_t* base, int64_t n_q_max, int64_t max_visible, int64_t d) {
    scores = reinterpret_cast<float*>(base);
    base += Align64(n_q_max * max_visible * sizeof(float));
    q = reinterpret_cast<float*>(base);
    base += Align64(n_q_max * d * sizeof(float));
    out = reinterpret_cast<float*>(base);
    base += Align64(n_q_max * d * sizeof(float));
    q8 = base;
    base += Align64(n_q_max * Q8RowBytes(d));
    const void*** lists[] = {&k_common, &v_common, &k_own, &v_own};
    for (const void*** list : lists) {
      *list = reinterpret_cast<const void**>(base);
      base += Align64(max_visible * sizeof(void*));
    }
  }
};

void BatchInvariantAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& b,
                             const float* q, int32_t n_heads, float* out, float scale, uint8_t* ws,
                             size_t per_thread, int64_t max_visible, KvElem k_elem, KvElem v_elem,
                             const OpKernels& k, const ScoresKernel& kv_scores) {
  const int64_t n_tokens = static_cast<int64_t>(b.seq.size());
  const int64_t d = kv.head_dim, bs = kv.block_size, group = n_heads / kv.n_kv_heads;
  const bool has_extra = !b.extra_indptr.empty();
  auto first_visible = [&](int64_t t) -> int64_t {
    return b.first_visible.empty() ? 0 : b.first_visible[t];
  };
  // Chunks of equal size within each run of one sequence's tokens, small enough that every
  // thread gets about two tasks.
  const int64_t chunk_max =
      std::clamp<int64_t>(n_tokens * kv.n_kv_heads / (2 * pool.n_threads()), 1, kMaxChunkTokens);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [t0, t1)
  for (int64_t t0 = 0; t0 < n_tokens;) {
    int64_t run = 1;
    while (t0 + run < n_tokens && b.seq[t0 + run] == b.seq[t0]) ++run;
    const int64_t n_chunks = (run + chunk_max - 1) / chunk_max;
    for (int64_t c = 0; c < n_chunks; ++c) {
      chunks.emplace_back(t0 + run * c / n_chunks, t0 + run * (c + 1) / n_chunks);
    }
    t0 += run;
  }
  // ParallelFor gives each thread a contiguous range of tasks, and a causal chunk's work grows
  // with its position (a prompt's last chunk sees every row): in prompt order the last thread
  // would get about 2T - 1 times the first one's work. Ordered first, last, second, second to
  // last, ..., every contiguous range holds as many early chunks as late ones. (Each token's
  // result does not depend on which task computes it.)
  std::vector<std::pair<int64_t, int64_t>> balanced;
  balanced.reserve(chunks.size());
  for (size_t lo = 0, hi = chunks.size(); lo < hi;) {
    balanced.push_back(chunks[lo++]);
    if (lo < hi) balanced.push_back(chunks[--hi]);
  }
  chunks = std::move(balanced);
  const uint8_t* k_base = static_cast<const uint8_t*>(kv.k.base);
  const uint8_t* v_base = static_cast<const uint8_t*>(kv.v.base);
  const size_t k_row_bytes = RowBytes(k_elem, d), v_row_bytes = RowBytes(v_elem, d);
  const int64_t n_q_max = kMaxChunkTokens * group;

  pool.ParallelFor(
      static_cast<int64_t>(chunks.size()) * kv.n_kv_heads,
      [&](int64_t task0, int64_t task1, int thread) {
        const ChunkWorkspace w(ws + per_thread * thread, n_q_max, max_visible, d);
        for (int64_t task = task0; task < task1; ++task) {
          const auto [t0, t1] = chunks[task / kv.n_kv_heads];
          const int64_t h = task % kv.n_kv_heads;
          const int64_t n_q = (t1 - t0) * group;
          const int32_t* blocks = b.kv_indices.data() + b.kv_indptr[b.seq[t0]];
          auto k_row = [&](int64_t pos) -> const void* {
            return k_base + blocks[pos / bs] * kv.k.block_stride_bytes +
                   h * kv.k.head_stride_bytes + (pos % bs) * k_row_bytes;
          };
          auto v_row = [&](int64_t pos) -> const void* {
            return v_base + blocks[pos / bs] * kv.v.block_stride_bytes +
                   h * kv.v.head_stride_bytes + (pos % bs) * v_row_bytes;
          };
          // The rows every token of the chunk sees first, [c0, c1): the shared start of their
          // windows up to the shortest prefix. Tokens whose windows start at different rows
          // share none (each token's rows must stay in its own visible order).
          const int64_t c0 = first_visible(t0);
          int64_t c1 = b.n_visible[t0];
          for (int64_t t = t0; t < t1; ++t) {
            c1 = first_visible(t) == c0 ? std::min<int64_t>(c1, b.n_visible[t]) : c0;
          }
          const int64_t common = c1 - c0;
          ListRows(kv.k, blocks, bs, h, k_row_bytes, 0, c0, c1, w.k_common);
          ListRows(kv.v, blocks, bs, h, v_row_bytes, 0, c0, c1, w.v_common);
          // Token t's own rows (the rest of its causal prefix or window, then its tree extras)
          // into `list`; returns their count.
          auto own_rows = [&](int64_t t, const KvTensorView& view, size_t row_bytes, auto&& row,
                              const void** list) {
            const int64_t from = common > 0 ? c1 : first_visible(t);
            int64_t n = std::max<int64_t>(0, b.n_visible[t] - from);
            ListRows(view, blocks, bs, h, row_bytes, 0, from, from + n, list);
            if (has_extra) {
              for (int32_t i = b.extra_indptr[t]; i < b.extra_indptr[t + 1]; ++i) {
                list[n++] = row(b.extra_positions[i]);
              }
            }
            return n;
          };
          for (int64_t t = t0; t < t1; ++t) {
            const float* qt = q + (t * n_heads + h * group) * d;  // [G, d]
            std::copy(qt, qt + group * d, w.q + (t - t0) * group * d);
          }
          kv_scores.Quantize(w.q, n_q, w.q8);
          // Scores [n_q, max_visible]: the common rows for every head of the chunk at once, then
          // each token's own rows and its softmax.
          kv_scores(w.q, w.q8, n_q, w.k_common, common, w.scores, max_visible);
          for (int64_t t = t0; t < t1; ++t) {
            float* st = w.scores + (t - t0) * group * max_visible;  // [G, max_visible]
            const int64_t n_own = own_rows(t, kv.k, k_row_bytes, k_row, w.k_own);
            kv_scores(w.q + (t - t0) * group * d, w.q8 + (t - t0) * group * Q8RowBytes(d), group,
                      w.k_own, n_own, st + common, max_visible);
            const int64_t n_vis = common + n_own;
            for (int64_t g = 0; g < group; ++g) {
              float* sg = st + g * max_visible;
              ScaledSoftmax(k, sg, n_vis, scale);
            }
          }
          // V . P: the common rows for every head at once, then each token's own rows.
          std::fill(w.out, w.out + n_q * d, 0.0f);
          k.kv_accumulate_rows(w.out, w.scores, max_visible, n_q, w.v_common, common, v_elem, d);
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t n_own = own_rows(t, kv.v, v_row_bytes, v_row, w.v_own);
            float* ot = w.out + (t - t0) * group * d;
            k.kv_accumulate_rows(ot, w.scores + (t - t0) * group * max_visible + common,
                                 max_visible, group, w.v_own, n_own, v_elem, d);
            std::copy(ot, ot + group * d, out + (t * n_heads + h * group) * d);
          }
        }
      });
}

// One token (a decode step) whose kv heads do not divide among the threads: whole heads would
// leave threads idle (Gemma 3 270M's one kv head on 2 threads: one thread does all the work;
// SmolLM2's 3 on 2: one thread does 2 heads, the other 1). The work is a list of units taken in
// order by whichever thread is free: first every head's scores (in one row chunk a thread when
// the heads are fewer than the threads, else whole), into one shared [n_kv, G, n_vis]; then
// every head's V . P (in column pieces of whole 32-column slices when the heads are fewer),
// each normalizing its head's scores itself once they are all written. (3 kv heads on 2
// threads: scores 0 | 1, then scores 2 | V 0, then V 1 | V 2: three units each, not four.)
// Every score is a function of its own row and every output element one FMA chain over the
// rows in order (op_kernels.h), so the bits are BatchInvariantAttention's for the same token.
// Measured (cpu_ops_bench --attention, 2 threads, Zen 5), us a token of one layer at context
// 4,096: SmolLM2's, f16 and q8_0, 51-56 -> 41-48 (against whole heads, 2 + 1); Gemma 3's 78-83 ->
// 55-68 (against two phases of 32-column V tasks, whose pieces of a q8_0 row, 34 of its 68 bytes,
// each thread fetched from memory alone). From kSplitDecodeMinRows rows on: engine_bench
// decode128 on 2 threads, the default model 443-498 -> 502-510 tok/s against 256 rows (the
// two-phase split's threshold), Gemma 3 unchanged (219-235 both).
constexpr int64_t kSplitDecodeMinRows = 32;
constexpr int64_t kSplitDecodeColumns = 32;  // whole Q8_0 blocks, whole SIMD steps

bool UseSplitDecode(const ThreadPool& pool, const PagedKvView& kv, int64_t n_tokens,
                    int64_t max_visible) {
  return n_tokens == 1 && kv.n_kv_heads % pool.n_threads() != 0 &&
         max_visible >= kSplitDecodeMinRows;
}

// Workspace: the shared scores [n_kv, G, n_vis] and the token's query in Q8_0 blocks [n_kv * G,
// d / 32] (for a q8_0 K cache), then per thread the row pointers [n_vis], one head's normalized
// scores [G, n_vis] and its output slice [G, d] (at most d columns).
struct SplitDecodeWorkspace {
  static size_t PerThread(int64_t group, int64_t n_vis, int64_t d) {
    return Align64(n_vis * sizeof(void*)) + Align64(group * n_vis * sizeof(float)) +
           Align64(group * d * sizeof(float));
  }
  static size_t Shared(int64_t n_kv, int64_t group, int64_t n_vis, int64_t d) {
    return Align64(n_kv * group * n_vis * sizeof(float)) + Align64(n_kv * group * Q8RowBytes(d));
  }
  static size_t Bytes(int n_threads, int64_t n_kv, int64_t group, int64_t n_vis, int64_t d) {
    return Shared(n_kv, group, n_vis, d) + n_threads * PerThread(group, n_vis, d);
  }
  SplitDecodeWorkspace(uint8_t* base, int thread, int64_t n_kv, int64_t group, int64_t n_vis,
                       int64_t d) {
    scores = reinterpret_cast<float*>(base);
    q8 = base + Align64(n_kv * group * n_vis * sizeof(float));
    base += Shared(n_kv, group, n_vis, d) + thread * PerThread(group, n_vis, d);
    rows = reinterpret_cast<const void**>(base);
    base += Align64(n_vis * sizeof(void*));
    p = reinterpret_cast<float*>(base);
    slice = reinterpret_cast<float*>(base + Align64(group * n_vis * sizeof(float)));
  }
  float* scores;      // shared by all threads
  uint8_t* q8;        // shared by all threads
  const void** rows;  // this thread's
  float* p;
  float* slice;
};

void SplitDecodeAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& b,
                          const float* q, int32_t n_heads, float* out, float scale, uint8_t* ws,
                          KvElem k_elem, KvElem v_elem, const OpKernels& k,
                          const ScoresKernel& kv_scores) {
  const int64_t d = kv.head_dim, bs = kv.block_size, n_kv = kv.n_kv_heads;
  const int64_t group = n_heads / n_kv;
  const int64_t first = b.first_visible.empty() ? 0 : b.first_visible[0];
  const int64_t n_prefix = b.n_visible[0] - first;
  const int32_t* extras =
      b.extra_indptr.empty() ? nullptr : b.extra_positions.data() + b.extra_indptr[0];
  const int64_t n_vis = n_prefix + (extras ? b.extra_indptr[1] - b.extra_indptr[0] : 0);
  const int32_t* blocks = b.kv_indices.data() + b.kv_indptr[b.seq[0]];
  const size_t k_row_bytes = RowBytes(k_elem, d), v_row_bytes = RowBytes(v_elem, d);
  // The cache row of visible row j of kv head h, `offset` bytes in.
  auto row = [&](const KvTensorView& t, size_t row_bytes, int64_t h, int64_t j, size_t offset) {
    const int64_t pos = j < n_prefix ? first + j : extras[j - n_prefix];
    return static_cast<const void*>(static_cast<const uint8_t*>(t.base) +
                                    blocks[pos / bs] * t.block_stride_bytes +
                                    h * t.head_stride_bytes + (pos % bs) * row_bytes + offset);
  };
  // list[j - j0] = row(..., j, offset) for visible rows j in [j0, j1).
  auto rows_of = [&](const KvTensorView& t, size_t row_bytes, int64_t h, int64_t j0, int64_t j1,
                     size_t offset, const void** list) {
    const int64_t prefix_end = std::min(j1, n_prefix);
    if (j0 < prefix_end) {
      ListRows(t, blocks, bs, h, row_bytes, offset, first + j0, first + prefix_end, list);
    }
    for (int64_t j = std::max(j0, n_prefix); j < j1; ++j)
      list[j - j0] = row(t, row_bytes, h, j, offset);
  };
  auto workspace = [&](int thread) {
    return SplitDecodeWorkspace(ws, thread, n_kv, group, n_vis, d);
  };
  kv_scores.Quantize(q, n_kv * group, workspace(0).q8);

  const int64_t n_threads = pool.n_threads();
  const bool few_heads = n_kv < n_threads;
  const int64_t row_chunks = few_heads ? n_threads : 1;
  const int64_t col_slices = d % kSplitDecodeColumns == 0 ? d / kSplitDecodeColumns : 1;
  const int64_t col_pieces = few_heads ? std::min(n_threads, col_slices) : 1;
  const int64_t n_score_units = n_kv * row_chunks, n_units = n_score_units + n_kv * col_pieces;
  std::atomic<int64_t> next_unit{0};
  std::vector<std::atomic<int64_t>> chunks_scored(n_kv);  // per head, release after the scores

  auto score_unit = [&](const SplitDecodeWorkspace& w, int64_t h, int64_t chunk) {
    const int64_t j0 = n_vis * chunk / row_chunks, j1 = n_vis * (chunk + 1) / row_chunks;
    rows_of(kv.k, k_row_bytes, h, j0, j1, 0, w.rows);
    kv_scores(q + h * group * d, w.q8 + h * group * Q8RowBytes(d), group, w.rows, j1 - j0,
              w.scores + h * group * n_vis + j0, n_vis);
    chunks_scored[h].fetch_add(1, std::memory_order_release);
  };
  // normalized: the head whose probabilities w.p holds (-1: none yet), so a thread that takes two
  // column pieces of one head normalizes its scores once.
  auto v_unit = [&](const SplitDecodeWorkspace& w, int64_t h, int64_t piece, int64_t& normalized) {
    // Every score unit was taken before this one; one still running is on another thread.
    for (int spins = 0; chunks_scored[h].load(std::memory_order_acquire) < row_chunks; ++spins) {
      if (spins < 128) {
        platform::CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
    const int64_t s0 = col_slices * piece / col_pieces, s1 = col_slices * (piece + 1) / col_pieces;
    const int64_t width = d / col_slices, c0 = s0 * width, n_cols = (s1 - s0) * width;
    if (normalized != h) {
      std::copy(w.scores + h * group * n_vis, w.scores + (h + 1) * group * n_vis, w.p);
      for (int64_t g = 0; g < group; ++g) ScaledSoftmax(k, w.p + g * n_vis, n_vis, scale);
      normalized = h;
    }
    rows_of(kv.v, v_row_bytes, h, 0, n_vis, RowBytes(v_elem, c0), w.rows);
    std::fill(w.slice, w.slice + group * n_cols, 0.0f);
    k.kv_accumulate_rows(w.slice, w.p, n_vis, group, w.rows, n_vis, v_elem, n_cols);
    for (int64_t g = 0; g < group; ++g) {
      std::copy(w.slice + g * n_cols, w.slice + (g + 1) * n_cols, out + (h * group + g) * d + c0);
    }
  };
  pool.ParallelFor(n_threads, [&](int64_t, int64_t, int thread) {
    const SplitDecodeWorkspace w = workspace(thread);
    int64_t normalized = -1;
    for (int64_t u; (u = next_unit.fetch_add(1, std::memory_order_relaxed)) < n_units;) {
      if (u < n_score_units) {
        score_unit(w, u / row_chunks, u % row_chunks);
      } else {
        v_unit(w, (u - n_score_units) / col_pieces, (u - n_score_units) % col_pieces, normalized);
      }
    }
  });
}

// The longest visible list of any token of the batch. The llama.cpp orders start a window at its
// row rounded down to a multiple of 16.
int64_t MaxVisible(const AttentionBatch& b) {
  const bool has_extra = !b.extra_indptr.empty();
  const bool has_first = !b.first_visible.empty();
  int64_t max_visible = 0;
  for (size_t t = 0; t < b.seq.size(); ++t) {
    const int64_t extra = has_extra ? b.extra_indptr[t + 1] - b.extra_indptr[t] : 0;
    const int64_t first = has_first ? b.first_visible[t] : 0;
    max_visible = std::max(max_visible, b.n_visible[t] - first + first % 16 + extra);
  }
  return max_visible;
}

// The llama.cpp orders of PagedAttention (v_dim == head_dim) and of MLA's latent attention
// (v_dim < head_dim: V is the first v_dim elements of each K row, as ggml's view of its latent
// cache). Tasks are (token, kv head) pairs; out: [n_tokens, n_heads, v_dim].
absl::Status LlamaCppOrderAttention(ThreadPool& pool, const PagedKvView& kv,
                                    const AttentionBatch& b, const float* q, int32_t n_heads,
                                    int64_t v_dim, float* out, float scale, Scratch& scratch,
                                    AttentionOrder order, KvElem k_elem, KvElem v_elem,
                                    const OpKernels& k, int64_t max_visible) {
  const int64_t n_tokens = static_cast<int64_t>(b.seq.size());
  const int64_t d = kv.head_dim, vd = v_dim;
  const int64_t bs = kv.block_size;
  const int64_t group = n_heads / kv.n_kv_heads;
  const bool has_extra = !b.extra_indptr.empty();
  const bool has_first = !b.first_visible.empty();
  // llama.cpp's f16 cache path (ggml_vec_dot_f16 / tinyBLAS f16): q and the softmax weights are
  // rounded to f16 before their products with K and V. (kiln's order keeps them in f32.)
  const bool q_to_f16 = k_elem == KvElem::kF16;
  const bool p_to_f16 = v_elem == KvElem::kF16;
  // llama.cpp's prompt batches run K.q through tinyBLAS only for an f16 cache (an f32 q is used
  // in place, which needs a contiguous q; a converted f16 q is contiguous), V.p for both types.
  const bool prompt = order == AttentionOrder::kLlamaCppPrompt;
  const int64_t kq_lanes = prompt && q_to_f16 ? kAttnLanesTinyBlas : kAttnLanes;
  // The SIMD score kernels cover whole steps of their lanes; other head sizes use the definition.
  const auto kv_scores =
      d % kq_lanes == 0 ? k.kv_scores : GetOpKernels(CpuLevel::kScalar).kv_scores;
  const int64_t n_lanes = prompt ? kAttnLanesTinyBlas : kAttnLanes;

  // Per-thread workspace: scores [G, max_visible], lane accumulator [kAttnLanes, v_dim] and
  // rounded q [G, d] (floats), then the V row pointers of the whole lane groups [max_visible].
  const size_t floats_bytes =
      Align64((group * max_visible + kAttnLanes * vd + group * d) * sizeof(float));
  const size_t per_thread = floats_bytes + Align64(max_visible * sizeof(const void*));
  uint8_t* ws = static_cast<uint8_t*>(scratch.Get(per_thread * pool.n_threads()));
  if (ws == nullptr) {
    return absl::ResourceExhaustedError("PagedAttention: scratch allocation failed");
  }

  const uint8_t* k_base = static_cast<const uint8_t*>(kv.k.base);
  const uint8_t* v_base = static_cast<const uint8_t*>(kv.v.base);
  const size_t k_row_bytes = RowBytes(k_elem, d), v_row_bytes = RowBytes(v_elem, d);

  pool.ParallelFor(n_tokens * kv.n_kv_heads, [&](int64_t task0, int64_t task1, int thread) {
    float* sc = reinterpret_cast<float*>(ws + per_thread * thread);  // [G, max_visible]
    float* acc = sc + group * max_visible;                           // [kAttnLanes, v_dim]
    float* q_rounded = acc + kAttnLanes * vd;                        // [G, d]
    const void** v_rows = reinterpret_cast<const void**>(ws + per_thread * thread + floats_bytes);
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t t = task / kv.n_kv_heads, h = task % kv.n_kv_heads;
      const float* qt = q + (t * n_heads + h * group) * d;  // [G, d]
      if (q_to_f16) {
        std::copy(qt, qt + group * d, q_rounded);
        k.round_f16(q_rounded, group * d);
        qt = q_rounded;
      }
      const int32_t* blocks = b.kv_indices.data() + b.kv_indptr[b.seq[t]];
      const int64_t nv = b.n_visible[t];
      // A sliding window starts at row `first`. ggml keeps every cell's number (the lanes below)
      // and runs the softmax sum in chunks of 16 cells from cell 0 over the masked cells too: so
      // the rows from `first` rounded down to a multiple of 16 are scored, those before `first`
      // masked (-inf, weight 0).
      const int64_t lead = (has_first ? b.first_visible[t] : 0) % 16;
      const int64_t first = (has_first ? b.first_visible[t] : 0) - lead;

      // Calls fn(block, row, count, index) for runs of consecutive visible rows in one physical
      // block; `index` numbers the visible rows 0, 1, 2, ... in order (prefix, then extras);
      // their lanes are first + index, so a tree node sees exactly the lanes its root-to-node
      // chain would see causally.
      auto for_each_run = [&](auto&& fn) {
        int64_t index = 0;
        for (int64_t p = first; p < nv;) {
          const int64_t count = std::min(bs - p % bs, nv - p);
          fn(blocks[p / bs], p % bs, count, index);
          index += count;
          p += count;
        }
        if (!has_extra) return;
        const int32_t e1 = b.extra_indptr[t + 1];
        for (int32_t i = b.extra_indptr[t]; i < e1;) {
          const int64_t p = b.extra_positions[i];
          int64_t count = 1;
          while (i + count < e1 && b.extra_positions[i + count] == p + count &&
                 (p + count) / bs == p / bs) {
            ++count;
          }
          fn(blocks[p / bs], p % bs, count, index);
          index += count;
          i += static_cast<int32_t>(count);
        }
      };

      // Scores [G, n_vis] = K . q, then softmax as ggml_soft_max_ext.
      // ggml's f32 dot.
      int64_t n_vis = 0;
      for_each_run([&](int32_t block, int64_t row, int64_t count, int64_t index) {
        const uint8_t* kt = k_base + block * kv.k.block_stride_bytes + h * kv.k.head_stride_bytes +
                            row * k_row_bytes;
        kv_scores(qt, group, kt, count, k_elem, d, kq_lanes, sc + index, max_visible);
        n_vis = index + count;
      });
      for (int64_t g = 0; g < group; ++g) {
        float* sg = sc + g * max_visible;
        std::fill(sg, sg + lead, -INFINITY);
        ScaledSoftmax(k, sg, n_vis, scale);
        if (p_to_f16) k.round_f16(sg, n_vis);
      }
      float* ot = out + (t * n_heads + h * group) * vd;  // [G, v_dim]
      // out = V^T . p per head, in the llama.cpp order's lanes over the visible index.
      // Leading runs that are whole 16-row lane groups (a causal prefix with block_size 16)
      // take the register-blocked kernel; the rest (a partial last block, tree extras) follow
      // in index order through the generic one. V rows shorter than their stride (MLA's) go one
      // at a time (the kernels read consecutive rows of v_dim elements).
      int64_t n_groups = 0;
      if (vd == d) {
        for_each_run([&](int32_t block, int64_t row, int64_t count, int64_t index) {
          if (first != 0 || index != 16 * n_groups || count != 16) return;
          v_rows[n_groups++] = v_base + block * kv.v.block_stride_bytes +
                               h * kv.v.head_stride_bytes + row * v_row_bytes;
        });
      }
      const int64_t grouped_rows = 16 * n_groups;
      for (int64_t g = 0; g < group; ++g) {
        std::fill(acc, acc + n_lanes * vd, 0.0f);
        const float* pg = sc + g * max_visible;
        k.kv_accumulate_groups(acc, pg, v_rows, n_groups, n_lanes, v_elem, vd);
        for_each_run([&](int32_t block, int64_t row, int64_t count, int64_t index) {
          if (index < grouped_rows) return;
          const uint8_t* vt = v_base + block * kv.v.block_stride_bytes +
                              h * kv.v.head_stride_bytes + row * v_row_bytes;
          if (vd == d) {
            k.kv_accumulate(acc, pg + index, vt, count, first + index, n_lanes, v_elem, vd);
            return;
          }
          for (int64_t r = 0; r < count; ++r) {
            k.kv_accumulate(acc, pg + index + r, vt + r * v_row_bytes, 1, first + index + r,
                            n_lanes, v_elem, vd);
          }
        });
        k.reduce_lanes(acc, n_lanes, vd, ot + g * vd);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAttentionBatch(const PagedKvView& kv, const AttentionBatch& b,
                                    int32_t n_heads) {
  KvElem k_elem, v_elem;
  return ValidateAttention(kv, b, n_heads, &k_elem, &v_elem);
}

absl::Status PagedAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& b,
                            const float* q, int32_t n_heads, float* out, float scale,
                            Scratch& scratch, AttentionOrder order, CpuLevel level) {
  KvElem k_elem, v_elem;
  KILN_RETURN_IF_ERROR(ValidateAttention(kv, b, n_heads, &k_elem, &v_elem));
  const int64_t n_tokens = static_cast<int64_t>(b.seq.size());
  if (n_tokens == 0) return absl::OkStatus();
  if (q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("PagedAttention: q or out is null");
  }
  const int64_t d = kv.head_dim;
  const int64_t group = n_heads / kv.n_kv_heads;
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(d));
  const OpKernels& k = GetOpKernels(level);
  const int64_t max_visible = MaxVisible(b);
  if (order == AttentionOrder::kBatchInvariant && UseSplitDecode(pool, kv, n_tokens, max_visible)) {
    // Sized for max_visible rows: at least the token's n_vis, which lays the workspace out.
    auto* ws = static_cast<uint8_t*>(scratch.Get(
        SplitDecodeWorkspace::Bytes(pool.n_threads(), kv.n_kv_heads, group, max_visible, d)));
    if (ws == nullptr) {
      return absl::ResourceExhaustedError("PagedAttention: scratch allocation failed");
    }
    SplitDecodeAttention(pool, kv, b, q, n_heads, out, scale, ws, k_elem, v_elem, k,
                         ScoresKernel(k, k_elem, d, level));
    return absl::OkStatus();
  }
  if (order == AttentionOrder::kBatchInvariant) {
    const size_t per_thread = ChunkWorkspace::Bytes(kMaxChunkTokens * group, max_visible, d);
    uint8_t* ws = static_cast<uint8_t*>(scratch.Get(per_thread * pool.n_threads()));
    if (ws == nullptr) {
      return absl::ResourceExhaustedError("PagedAttention: scratch allocation failed");
    }
    BatchInvariantAttention(pool, kv, b, q, n_heads, out, scale, ws, per_thread, max_visible,
                            k_elem, v_elem, k, ScoresKernel(k, k_elem, d, level));
    return absl::OkStatus();
  }

  return LlamaCppOrderAttention(pool, kv, b, q, n_heads, d, out, scale, scratch, order, k_elem,
                                v_elem, k, max_visible);
}

absl::Status MlaPagedAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& b,
                               const MlaAttentionWeights& w, const float* q, int32_t n_heads,
                               float* out, float scale, Scratch& scratch, CpuLevel level) {
  if (kv.n_kv_heads != 1 || kv.k.base != kv.v.base || kv.k.type != kv.v.type) {
    return absl::InvalidArgumentError(
        "MlaAttention: the latent view must be one kv head with k and v the same rows");
  }
  // A q8_0 view is a q8_0 latent cache: c as block_q8_0, then the RoPE part in f16
  // (KvLayout); the batch is validated as for an f16 row of the same width.
  const bool q8_latent = kv.k.type == GgmlType::kQ8_0;
  PagedKvView checked = kv;
  if (q8_latent) checked.k.type = checked.v.type = GgmlType::kF16;
  KvElem elem, v_elem;
  const absl::Status valid = ValidateAttention(checked, b, n_heads, &elem, &v_elem);
  if (!valid.ok())
    return absl::Status(valid.code(), absl::StrCat("MlaAttention: ", valid.message()));
  if (q8_latent && w.kv_lora_rank % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MlaAttention: a q8_0 latent cache needs kv_lora_rank a multiple of 32, got %d",
        w.kv_lora_rank));
  }
  const int64_t kvl = w.kv_lora_rank, nope = w.nope_dim, vd = w.v_head_dim, row = kv.head_dim;
  const int64_t rd = row - kvl, qk = nope + rd;
  // The weights: f32 arrays, or the file's rows (then widened as a cache row of their type).
  const bool file_rows = w.w_uk == nullptr && w.w_uv == nullptr;
  const bool have_weights = file_rows ? w.uk_rows != nullptr && w.uv_rows != nullptr
                                      : w.w_uk != nullptr && w.w_uv != nullptr;
  if (!have_weights || kvl <= 0 || nope <= 0 || vd <= 0 || rd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MlaAttention: weights w_uk %s, w_uv %s, uk_rows %s, uv_rows %s, kv_lora_rank %d (row "
        "%d), nope_dim %d, v_head_dim %d: need both f32 weights or both row lists, and positive "
        "sizes with kv_lora_rank <= row",
        w.w_uk == nullptr ? "null" : "set", w.w_uv == nullptr ? "null" : "set",
        w.uk_rows == nullptr ? "null" : "set", w.uv_rows == nullptr ? "null" : "set", kvl, row,
        nope, vd));
  }
  KvElem w_elem = KvElem::kF32;
  if (file_rows &&
      (!KvElemOf(w.rows_type, &w_elem) ||
       (w_elem == KvElem::kQ8_0 && (kvl % 32 != 0 || (w.uk_transposed && nope % 32 != 0))))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MlaAttention: weight rows of type %s (need f32, f16, bf16 or q8_0 with whole blocks)",
        GgmlTypeName(static_cast<uint32_t>(w.rows_type))));
  }
  const int64_t n_tokens = static_cast<int64_t>(b.seq.size());
  if (n_tokens == 0) return absl::OkStatus();
  if (q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("MlaAttention: q or out is null");
  }
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const OpKernels& k = GetOpKernels(level);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  // The SIMD score kernels cover whole 16-element steps; other lengths use the definition.
  const auto row_scores = row % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  const auto latent_dots = kvl % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  const bool has_extra = !b.extra_indptr.empty();
  const bool has_first = !b.first_visible.empty();
  int64_t max_visible = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t extra = has_extra ? b.extra_indptr[t + 1] - b.extra_indptr[t] : 0;
    max_visible = std::max<int64_t>(max_visible,
                                    b.n_visible[t] - (has_first ? b.first_visible[t] : 0) + extra);
  }
  // Head groups: enough (token, group) tasks for about two per thread.
  const int64_t want_groups = (2 * pool.n_threads() + n_tokens - 1) / n_tokens;
  const int64_t heads_per_group = (n_heads + std::clamp<int64_t>(want_groups, 1, n_heads) - 1) /
                                  std::clamp<int64_t>(want_groups, 1, n_heads);
  const int64_t n_groups = (n_heads + heads_per_group - 1) / heads_per_group;
  const int64_t hg = heads_per_group;

  // Shared (f32 weights): the rows of W_UK and W_UV as kernel row lists, [n_heads * nope] and
  // [n_heads * vd]; the file's rows come as such lists. Per thread: visible row pointers
  // [max_visible], scores [hg, max_visible], q_abs [hg, row], latent output [hg, kvl].
  const size_t shared = file_rows ? 0 : Align64((n_heads * nope + n_heads * vd) * sizeof(void*));
  // A q8_0 latent scores c and the RoPE part apart: their row pointers [max_visible] and scores
  // [hg, max_visible] again, and q_abs split into [hg, kvl] and [hg, rd].
  const size_t per_thread = 2 * Align64(max_visible * sizeof(void*)) +
                            2 * Align64(hg * max_visible * sizeof(float)) +
                            Align64(hg * row * sizeof(float)) + Align64(hg * kvl * sizeof(float)) +
                            Align64(hg * kvl * sizeof(float)) + Align64(hg * rd * sizeof(float));
  uint8_t* ws = static_cast<uint8_t*>(scratch.Get(shared + per_thread * pool.n_threads()));
  if (ws == nullptr) return absl::ResourceExhaustedError("MlaAttention: scratch allocation failed");
  const void* const* uk_rows = w.uk_rows;
  const void* const* uv_rows = w.uv_rows;
  const bool uk_transposed = file_rows && w.uk_transposed;
  if (!file_rows) {
    const void** lists = reinterpret_cast<const void**>(ws);
    for (int64_t r = 0; r < n_heads * nope; ++r) lists[r] = w.w_uk + r * kvl;
    for (int64_t r = 0; r < n_heads * vd; ++r) lists[n_heads * nope + r] = w.w_uv + r * kvl;
    uk_rows = lists;
    uv_rows = lists + n_heads * nope;
  }
  // attn_k_b's rows (W_UK_hᵀ, nope_dim long): q_abs_h[r] = row r . q_nope, a score.
  const auto uk_dots = nope % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;

  const uint8_t* base = static_cast<const uint8_t*>(kv.k.base);
  // c's element type, and where a row's RoPE part starts (q8_0: after the c blocks, in f16).
  const KvElem c_elem = q8_latent ? KvElem::kQ8_0 : elem;
  const size_t rope_offset = RowBytes(c_elem, kvl);
  const size_t row_bytes = rope_offset + RowBytes(elem, rd);
  const int64_t bs = kv.block_size;
  const auto c_scores = kvl % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  const auto rope_scores = rd % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  pool.ParallelFor(n_tokens * n_groups, [&](int64_t task0, int64_t task1, int thread) {
    uint8_t* mine = ws + shared + per_thread * thread;
    const void** rows = reinterpret_cast<const void**>(mine);
    mine += Align64(max_visible * sizeof(void*));
    float* scores = reinterpret_cast<float*>(mine);  // [hg, max_visible]
    mine += Align64(hg * max_visible * sizeof(float));
    float* q_abs = reinterpret_cast<float*>(mine);  // [hg, row]
    mine += Align64(hg * row * sizeof(float));
    float* latent_out = reinterpret_cast<float*>(mine);  // [hg, kvl]
    mine += Align64(hg * kvl * sizeof(float));
    const void** rope_rows = reinterpret_cast<const void**>(mine);  // q8_0 only from here
    mine += Align64(max_visible * sizeof(void*));
    float* rope_part = reinterpret_cast<float*>(mine);  // [hg, max_visible]
    mine += Align64(hg * max_visible * sizeof(float));
    float* q_c = reinterpret_cast<float*>(mine);  // [hg, kvl]
    mine += Align64(hg * kvl * sizeof(float));
    float* q_r = reinterpret_cast<float*>(mine);  // [hg, rd]
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t t = task / n_groups, h0 = task % n_groups * hg;
      const int64_t nh = std::min(hg, n_heads - h0);
      const int32_t* blocks = b.kv_indices.data() + b.kv_indptr[b.seq[t]];
      auto row_at = [&](int64_t pos) -> const void* {
        return base + blocks[pos / bs] * kv.k.block_stride_bytes + (pos % bs) * row_bytes;
      };
      int64_t n_vis = 0;
      for (int64_t p = has_first ? b.first_visible[t] : 0; p < b.n_visible[t]; ++p) {
        rows[n_vis++] = row_at(p);
      }
      if (has_extra) {
        for (int32_t i = b.extra_indptr[t]; i < b.extra_indptr[t + 1]; ++i) {
          rows[n_vis++] = row_at(b.extra_positions[i]);
        }
      }
      // q_abs_h = [W_UK_hᵀ q_nope | q_rope]: one FMA chain per latent element over nope_dim
      // (W_UK_h's rows), or a dot of each of W_UK_hᵀ's rows with q_nope.
      for (int64_t g = 0; g < nh; ++g) {
        const float* qh = q + (t * n_heads + h0 + g) * qk;
        float* qa = q_abs + g * row;
        if (uk_transposed) {
          uk_dots(qh, 1, uk_rows + (h0 + g) * kvl, kvl, w_elem, nope, qa, kvl);
        } else {
          std::fill(qa, qa + kvl, 0.0f);
          k.kv_accumulate_rows(qa, qh, 0, 1, uk_rows + (h0 + g) * nope, nope, w_elem, kvl);
        }
        std::copy(qh + nope, qh + qk, qa + kvl);
      }
      if (!q8_latent) {
        row_scores(q_abs, nh, rows, n_vis, elem, row, scores, max_visible);
      } else {
        // score = (q_c . c) + (q_r . rope): the q8_0 blocks and the f16 part in their kernels.
        for (int64_t g = 0; g < nh; ++g) {
          std::copy(q_abs + g * row, q_abs + g * row + kvl, q_c + g * kvl);
          std::copy(q_abs + g * row + kvl, q_abs + (g + 1) * row, q_r + g * rd);
        }
        for (int64_t j = 0; j < n_vis; ++j) {
          rope_rows[j] = static_cast<const uint8_t*>(rows[j]) + rope_offset;
        }
        c_scores(q_c, nh, rows, n_vis, KvElem::kQ8_0, kvl, scores, max_visible);
        rope_scores(q_r, nh, rope_rows, n_vis, KvElem::kF16, rd, rope_part, max_visible);
        for (int64_t g = 0; g < nh; ++g) {
          k.add(scores + g * max_visible, rope_part + g * max_visible, n_vis,
                scores + g * max_visible);
        }
      }
      for (int64_t g = 0; g < nh; ++g) {
        float* sg = scores + g * max_visible;
        ScaledSoftmax(k, sg, n_vis, scale);
      }
      // Σ_j p_j c_j over the rows' first kv_lora_rank elements, all the group's heads at once.
      std::fill(latent_out, latent_out + nh * kvl, 0.0f);
      k.kv_accumulate_rows(latent_out, scores, max_visible, nh, rows, n_vis, c_elem, kvl);
      for (int64_t g = 0; g < nh; ++g) {
        latent_dots(latent_out + g * kvl, 1, uv_rows + (h0 + g) * vd, vd, w_elem, kvl,
                    out + (t * n_heads + h0 + g) * vd, vd);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status MlaLatentAttentionLlamaCpp(ThreadPool& pool, const PagedKvView& kv,
                                        const AttentionBatch& b, const float* q, int32_t n_heads,
                                        int32_t kv_lora_rank, float* out, float scale,
                                        Scratch& scratch, AttentionOrder order, CpuLevel level) {
  if (kv.n_kv_heads != 1 || kv.k.base != kv.v.base || kv.k.type != kv.v.type) {
    return absl::InvalidArgumentError(
        "MlaLatentAttention: the latent view must be one kv head with k and v the same rows");
  }
  if (order == AttentionOrder::kBatchInvariant) {
    return absl::InvalidArgumentError("MlaLatentAttention: only the llama.cpp orders");
  }
  KvElem k_elem, v_elem;
  const absl::Status valid = ValidateAttention(kv, b, n_heads, &k_elem, &v_elem);
  if (!valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat("MlaLatentAttention: ", valid.message()));
  }
  if (k_elem == KvElem::kQ8_0) {
    return absl::UnimplementedError(
        "MlaLatentAttention: a q8_0 latent cache (llama.cpp's needs its flash attention)");
  }
  if (kv_lora_rank <= 0 || kv_lora_rank > kv.head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MlaLatentAttention: kv_lora_rank %d is outside [1, row %d]", kv_lora_rank, kv.head_dim));
  }
  if (b.seq.empty()) return absl::OkStatus();
  if (q == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttention: q or out is null");
  }
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  return LlamaCppOrderAttention(pool, kv, b, q, n_heads, kv_lora_rank, out, scale, scratch, order,
                                k_elem, v_elem, GetOpKernels(level), MaxVisible(b));
}

absl::Status MlaDecompressedAttention(ThreadPool& pool, const MlaDecompressedKv& kv, const float* q,
                                      std::span<const int32_t> n_visible, float* out, float scale,
                                      Scratch& scratch, CpuLevel level) {
  const int64_t n_tokens = static_cast<int64_t>(n_visible.size());
  const int64_t n_heads = kv.n_heads, nope = kv.nope_dim, rd = kv.rope_dim, vd = kv.v_dim,
                n_ctx = kv.n_ctx, qk = nope + rd;
  if (n_ctx <= 0 || n_heads <= 0 || nope <= 0 || rd < 0 || vd <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MlaDecompressedAttention: n_ctx %d, n_heads %d, nope_dim %d, rope_dim %d, v_dim %d: "
        "need positive sizes (rope_dim >= 0)",
        n_ctx, n_heads, nope, rd, vd));
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (q == nullptr || out == nullptr || kv.k_nope == nullptr || kv.v == nullptr ||
      (rd > 0 && kv.k_rope == nullptr)) {
    return absl::InvalidArgumentError(
        "MlaDecompressedAttention: q, out, k_nope, k_rope or v is null");
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (n_visible[t] < 1 || n_visible[t] > n_ctx) {
      return absl::OutOfRangeError(
          absl::StrFormat("MlaDecompressedAttention: n_visible[%d] = %d is outside [1, %d]", t,
                          n_visible[t], n_ctx));
    }
  }
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const OpKernels& k = GetOpKernels(level);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  // The SIMD score kernels cover whole 16-element steps; other lengths use the definition.
  const auto nope_scores = nope % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  const auto rope_scores = rd % 16 == 0 ? k.kv_scores_rows : scalar.kv_scores_rows;
  constexpr int64_t kBlock = 8;
  const int64_t n_blocks = (n_tokens + kBlock - 1) / kBlock;
  // Per thread: row pointers [3, n_ctx], scores and rope scores [kBlock, n_ctx], q parts
  // [kBlock, nope] and [kBlock, rd], the output accumulator [kBlock, vd].
  const size_t per_thread = 3 * Align64(n_ctx * sizeof(void*)) +
                            2 * Align64(kBlock * n_ctx * sizeof(float)) +
                            Align64(kBlock * (nope + rd + vd) * sizeof(float));
  uint8_t* ws = static_cast<uint8_t*>(scratch.Get(per_thread * pool.n_threads()));
  if (ws == nullptr) {
    return absl::ResourceExhaustedError("MlaDecompressedAttention: scratch allocation failed");
  }
  pool.ParallelFor(n_heads * n_blocks, [&](int64_t task0, int64_t task1, int thread) {
    uint8_t* mine = ws + per_thread * thread;
    const void** k_rows = reinterpret_cast<const void**>(mine);
    mine += Align64(n_ctx * sizeof(void*));
    const void** r_rows = reinterpret_cast<const void**>(mine);
    mine += Align64(n_ctx * sizeof(void*));
    const void** v_rows = reinterpret_cast<const void**>(mine);
    mine += Align64(n_ctx * sizeof(void*));
    float* scores = reinterpret_cast<float*>(mine);  // [kBlock, n_ctx]
    mine += Align64(kBlock * n_ctx * sizeof(float));
    float* rope_part = reinterpret_cast<float*>(mine);  // [kBlock, n_ctx]
    mine += Align64(kBlock * n_ctx * sizeof(float));
    float* q_nope = reinterpret_cast<float*>(mine);  // [kBlock, nope]
    float* q_rope = q_nope + kBlock * nope;          // [kBlock, rd]
    float* acc = q_rope + kBlock * rd;               // [kBlock, vd]
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t h = task / n_blocks, t0 = task % n_blocks * kBlock;
      const int64_t nq = std::min(kBlock, n_tokens - t0);
      int64_t max_vis = 0, min_vis = n_ctx;
      for (int64_t g = 0; g < nq; ++g) {
        max_vis = std::max<int64_t>(max_vis, n_visible[t0 + g]);
        min_vis = std::min<int64_t>(min_vis, n_visible[t0 + g]);
      }
      for (int64_t j = 0; j < max_vis; ++j) {
        k_rows[j] = kv.k_nope + (j * n_heads + h) * nope;
        r_rows[j] = kv.k_rope + j * rd;
        v_rows[j] = kv.v + (j * n_heads + h) * vd;
      }
      for (int64_t g = 0; g < nq; ++g) {
        const float* qh = q + ((t0 + g) * n_heads + h) * qk;
        std::copy(qh, qh + nope, q_nope + g * nope);
        std::copy(qh + nope, qh + qk, q_rope + g * rd);
      }
      // Scores of every row any token of the block sees (each score is its own dot, so the
      // rows a token does not see change nothing of its values).
      nope_scores(q_nope, nq, k_rows, max_vis, KvElem::kF32, nope, scores, n_ctx);
      if (rd > 0) rope_scores(q_rope, nq, r_rows, max_vis, KvElem::kF32, rd, rope_part, n_ctx);
      for (int64_t g = 0; g < nq; ++g) {
        float* sg = scores + g * n_ctx;
        const int64_t nv = n_visible[t0 + g];
        if (rd > 0) k.add(sg, rope_part + g * n_ctx, nv, sg);
        ScaledSoftmax(k, sg, nv, scale);
      }
      // Σ_j p_j v_j: the rows every token sees in one call, then each token's own tail, one
      // chain per output element in row order either way.
      std::fill(acc, acc + nq * vd, 0.0f);
      k.kv_accumulate_rows(acc, scores, n_ctx, nq, v_rows, min_vis, KvElem::kF32, vd);
      for (int64_t g = 0; g < nq; ++g) {
        const int64_t nv = n_visible[t0 + g];
        if (nv > min_vis) {
          k.kv_accumulate_rows(acc + g * vd, scores + g * n_ctx + min_vis, n_ctx, 1,
                               v_rows + min_vis, nv - min_vis, KvElem::kF32, vd);
        }
        std::copy(acc + g * vd, acc + (g + 1) * vd, out + ((t0 + g) * n_heads + h) * vd);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace kiln::cpu
