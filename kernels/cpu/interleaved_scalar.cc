// The integer-order kernels on row-interleaved weights (interleaved.h) in plain C++: the scalar
// level's matmul of the default numeric mode, and the definition the SIMD kernels reproduce bit
// for bit. Compiled for the baseline with -ffp-contract=off: the only FMAs are the std::fma calls
// of the integer order (correctly rounded whether or not the CPU has an FMA unit).
//
// Per group of 16 rows: the group's f16 scales (and Q4_1's mins) are widened once per call, then
// each token runs its 16 rows' chains over the blocks: the block's integer sums P (exact int32 in
// any order; written as one loop over rows so the compiler can vectorize it), then per row
// acc = fma(dw * da, float(P), acc) (and mins = fma(mw, sa, mins)).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/interleaved.h"
#include "kernels/cpu/legacy.h"
#include "kernels/cpu/scratch.h"

namespace kiln::quant {
namespace {

constexpr int kRows = kInterleaveRows;

// p[r] = Σ qw * qa over the 32 elements of row r of one interleaved Q4_1 block.
void BlockSumsQ4_1(const BlockQ4_1x16& w, const int8_t* qa, int32_t p[kRows]) {
  for (int r = 0; r < kRows; ++r) p[r] = 0;
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* q = w.qs[i] + 4 * r;
      int32_t s = 0;
      for (int j = 0; j < 4; ++j) {
        s += (q[j] & 0x0F) * qa[4 * i + j] + (q[j] >> 4) * qa[16 + 4 * i + j];
      }
      p[r] += s;
    }
  }
}

// The same for one interleaved Q4_0 (kOffset 8: weight nibble - 8), Q5_0 (kOffset 16, kFiveBit:
// weight q - 16, q's bit 4 from the row's qh) or Q5_1 block (kOffset 0, kFiveBit).
template <typename B, int kOffset, bool kFiveBit>
void BlockSumsOffset(const B& w, const int8_t* qa, int32_t p[kRows]) {
  for (int r = 0; r < kRows; ++r) {
    uint32_t qh = 0;
    if constexpr (kFiveBit) std::memcpy(&qh, w.qh[r], 4);
    int32_t s = 0;
    for (int i = 0; i < 4; ++i) {
      const uint8_t* q = w.qs[i] + 4 * r;
      for (int j = 0; j < 4; ++j) {
        const int e = 4 * i + j;
        const int lo = (q[j] & 0x0F) | static_cast<int>((qh >> e) & 1) << 4;
        const int hi = (q[j] >> 4) | static_cast<int>((qh >> (16 + e)) & 1) << 4;
        s += (lo - kOffset) * qa[e] + (hi - kOffset) * qa[16 + e];
      }
    }
    p[r] = s;
  }
}

// The same for one interleaved Q8_0 block (stored as qw + 128).
void BlockSumsQ8_0(const BlockQ8_0x16& w, const int8_t* qa, int32_t p[kRows]) {
  for (int r = 0; r < kRows; ++r) p[r] = 0;
  for (int i = 0; i < 8; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* q = w.qs[i] + 4 * r;
      int32_t s = 0;
      for (int j = 0; j < 4; ++j) s += (q[j] - 128) * qa[4 * i + j];
      p[r] += s;
    }
  }
}

// Q4_1 and Q5_1 (kFiveBit) weights x Q8_1 activations: P = Σ q * qa, and the mins.
template <typename B, bool kFiveBit>
struct MinFormat {
  using Block = B;
  using ActBlock = BlockQ8_1;
  static constexpr bool kHasMins = true;
  static void BlockSums(const Block& w, const int8_t* qa, int32_t p[kRows]) {
    if constexpr (kFiveBit) {
      BlockSumsOffset<B, 0, true>(w, qa, p);
    } else {
      BlockSumsQ4_1(w, qa, p);
    }
  }
  static float ActMin(const ActBlock& a) { return LoadHalf(a.s); }
  static float WeightMin(const Block& w, int r) { return LoadHalf(w.m[r]); }
};
using Q4_1Format = MinFormat<BlockQ4_1x16, false>;
using Q5_1Format = MinFormat<BlockQ5_1x16, true>;

template <typename B, int kOffset>
struct OffsetFormat {
  using Block = B;
  using ActBlock = BlockQ8_0;
  static constexpr bool kHasMins = false;
  static void BlockSums(const Block& w, const int8_t* qa, int32_t p[kRows]) {
    BlockSumsOffset<B, kOffset, kOffset == 16>(w, qa, p);
  }
  static float ActMin(const ActBlock&) { return 0.0f; }
  static float WeightMin(const Block&, int) { return 0.0f; }
};
using Q4_0Format = OffsetFormat<BlockQ4_0x16, 8>;
using Q5_0Format = OffsetFormat<BlockQ5_0x16, 16>;

struct Q8_0Format {
  using Block = BlockQ8_0x16;
  using ActBlock = BlockQ8_0;
  static constexpr bool kHasMins = false;
  static void BlockSums(const Block& w, const int8_t* qa, int32_t p[kRows]) {
    BlockSumsQ8_0(w, qa, p);
  }
  static float ActMin(const ActBlock&) { return 0.0f; }
  static float WeightMin(const Block&, int) { return 0.0f; }
};

template <typename F>
void InterleavedTile(int64_t n, const void* w, int n_rows, const void* a, size_t a_stride,
                     int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  // Per-thread scratch: activation scales da, sa [n_tokens][nb]; one group's dw, mw [nb][16].
  const size_t act_scales = static_cast<size_t>(n_tokens) * nb;
  auto* da = static_cast<float*>(kernels::ThreadScratch(0, act_scales * sizeof(float)));
  auto* sa = static_cast<float*>(kernels::ThreadScratch(1, act_scales * sizeof(float)));
  auto* dw = static_cast<float*>(kernels::ThreadScratch(2, nb * kRows * sizeof(float)));
  auto* mw = static_cast<float*>(kernels::ThreadScratch(3, nb * kRows * sizeof(float)));
  const auto* ap = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_tokens; ++t) {
    const auto* row = reinterpret_cast<const typename F::ActBlock*>(ap + t * a_stride);
    for (int64_t b = 0; b < nb; ++b) {
      da[t * nb + b] = LoadHalf(row[b].d);
      sa[t * nb + b] = F::ActMin(row[b]);
    }
  }
  const auto* groups = static_cast<const typename F::Block*>(w);
  for (int r0 = 0; r0 < n_rows; r0 += kRows) {
    const typename F::Block* g = groups + r0 / kRows * nb;
    const int rows = n_rows - r0 < kRows ? n_rows - r0 : kRows;
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < kRows; ++r) {
        dw[b * kRows + r] = LoadHalf(g[b].d[r]);
        mw[b * kRows + r] = F::WeightMin(g[b], r);
      }
    }
    for (int t = 0; t < n_tokens; ++t) {
      const auto* act = reinterpret_cast<const typename F::ActBlock*>(ap + t * a_stride);
      float acc[kRows] = {}, mins[kRows] = {};
      for (int64_t b = 0; b < nb; ++b) {
        int32_t p[kRows];
        F::BlockSums(g[b], act[b].qs, p);
        const float d = da[t * nb + b];
        for (int r = 0; r < kRows; ++r) {
          acc[r] = std::fma(dw[b * kRows + r] * d, static_cast<float>(p[r]), acc[r]);
        }
        if constexpr (F::kHasMins) {
          const float s = sa[t * nb + b];
          for (int r = 0; r < kRows; ++r) mins[r] = std::fma(mw[b * kRows + r], s, mins[r]);
        }
      }
      float* o = out + t * out_stride + r0;
      for (int r = 0; r < rows; ++r) o[r] = F::kHasMins ? acc[r] + mins[r] : acc[r];
    }
  }
}

}  // namespace

void InterleavedTileQ4_1Q8_1Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ4_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ5_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ5_1Q8_1Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ8_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q8_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void PackQ8_0x16(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out) {
  const auto* rows = static_cast<const uint8_t*>(w);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < kRows; ++r) {
      if (r >= n_rows) {
        for (int i = 0; i < 8; ++i) std::memset(&out[b].qs[i][4 * r], 0, 4);
        std::memset(out[b].d[r], 0, 2);
        continue;
      }
      const auto* src = reinterpret_cast<const BlockQ8_0*>(rows + r * w_stride) + b;
      for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 4; ++j) {
          out[b].qs[i][4 * r + j] = static_cast<uint8_t>(src->qs[4 * i + j]) ^ 0x80;
        }
      }
      std::memcpy(out[b].d[r], src->d, 2);
    }
  }
}

// The integer order straight from the rows: per (row, token), P per block, then
// acc = fma(dw * da, float(P), acc).
void InPlaceTileQ8_0Q8_0Scalar(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  const int64_t nb = n / kQK;
  for (int r = 0; r < n_rows; ++r) {
    const auto* wr =
        reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(w) + r * w_stride);
    for (int t = 0; t < n_tokens; ++t) {
      const auto* at =
          reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(a) + t * a_stride);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t p = 0;
        for (int j = 0; j < kQK; ++j) p += wr[b].qs[j] * at[b].qs[j];
        acc = std::fma(LoadHalf(wr[b].d) * LoadHalf(at[b].d), static_cast<float>(p), acc);
      }
      out[t * out_stride + r] = acc;
    }
  }
}

}  // namespace kiln::quant
