#include "lib/quant/interleave.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/quant/legacy_kernels.h"

namespace kiln::quant {

namespace {

// Rows of Src blocks -> groups of 16 rows of Dst blocks; put(dst, r, src) stores one source block
// as row r of an interleaved block and writes all of row r's bytes. Group by group, so each
// destination block is written once, in address order (a load's page faults and cache lines go
// one way); only the last group's rows past n_rows are zeroed.
template <typename Src, typename Dst, typename Put>
void InterleaveRows(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out,
                    Put put) {
  const int64_t nb = n_in / kQK;
  auto* dst = static_cast<Dst*>(out);
  for (int64_t first = 0; first < n_rows; first += kInterleaveRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kInterleaveRows, n_rows - first));
    Dst* group = dst + first / kInterleaveRows * nb;
    if (rows < kInterleaveRows) std::memset(group, 0, nb * sizeof(Dst));
    const Src* src[kInterleaveRows];
    for (int r = 0; r < rows; ++r) {
      src[r] = reinterpret_cast<const Src*>(static_cast<const uint8_t*>(w) +
                                            static_cast<size_t>(first + r) * w_stride);
    }
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < rows; ++r) put(group[b], r, src[r][b]);
    }
  }
}

// The inverse for one row: row `row` of the groups at `groups` back into its Src blocks at out;
// get(dst, p, r) reads row r of one interleaved block into one source block.
template <typename Src, typename Dst, typename Get>
void ExtractRow(const void* groups, int64_t n_in, int64_t row, void* out, Get get) {
  const int64_t nb = n_in / kQK;
  const int r = static_cast<int>(row % kInterleaveRows);
  const Dst* group = static_cast<const Dst*>(groups) + row / kInterleaveRows * nb;
  auto* dst = static_cast<Src*>(out);
  for (int64_t b = 0; b < nb; ++b) get(dst[b], group[b], r);
}

// 4 bytes from `from` to `to`, each with its top bit flipped (an int8 <-> that value + 128 as an
// unsigned byte), as one 32-bit word.
void FlipTopBits4(const void* from, void* to) {
  uint32_t four;
  std::memcpy(&four, from, 4);
  four ^= 0x80808080u;
  std::memcpy(to, &four, 4);
}

}  // namespace

namespace {

// The nibble formats (Q4_0, Q4_1, Q5_0, Q5_1): one source block as row r of an x16 block (its qs
// 4 bytes a line; its qh, d and m, where the format has them, at [r]), and back.
template <typename Src, typename Dst>
void PutNibbleRow(Dst& p, int r, const Src& src) {
  for (int i = 0; i < 4; ++i) std::memcpy(&p.qs[i][4 * r], src.qs + 4 * i, 4);
  if constexpr (requires { src.qh; }) std::memcpy(p.qh[r], src.qh, 4);
  std::memcpy(p.d[r], src.d, 2);
  if constexpr (requires { src.m; }) std::memcpy(p.m[r], src.m, 2);
}

template <typename Src, typename Dst>
void GetNibbleRow(Src& dst, const Dst& p, int r) {
  for (int i = 0; i < 4; ++i) std::memcpy(dst.qs + 4 * i, &p.qs[i][4 * r], 4);
  if constexpr (requires { dst.qh; }) std::memcpy(dst.qh, p.qh[r], 4);
  std::memcpy(dst.d, p.d[r], 2);
  if constexpr (requires { dst.m; }) std::memcpy(dst.m, p.m[r], 2);
}

// Bytes of one group of 16 interleaved rows of n_in elements in x16 blocks Dst.
template <typename Dst>
size_t GroupBytes(int64_t n_in) {
  return static_cast<size_t>(n_in / kQK) * sizeof(Dst);
}

template <typename Src, typename Dst>
void InterleaveNibbles(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveRows<Src, Dst>(w, w_stride, n_in, n_rows, out, PutNibbleRow<Src, Dst>);
}

}  // namespace

size_t InterleavedGroupBytesQ4_1(int64_t n_in) { return GroupBytes<BlockQ4_1x16>(n_in); }
size_t InterleavedGroupBytesQ4_0(int64_t n_in) { return GroupBytes<BlockQ4_0x16>(n_in); }
size_t InterleavedGroupBytesQ5_0(int64_t n_in) { return GroupBytes<BlockQ5_0x16>(n_in); }
size_t InterleavedGroupBytesQ5_1(int64_t n_in) { return GroupBytes<BlockQ5_1x16>(n_in); }
size_t InterleavedGroupBytesQ8_0(int64_t n_in) { return GroupBytes<BlockQ8_0x16>(n_in); }

void InterleaveQ4_1(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveNibbles<BlockQ4_1, BlockQ4_1x16>(w, w_stride, n_in, n_rows, out);
}
void InterleaveQ4_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveNibbles<BlockQ4_0, BlockQ4_0x16>(w, w_stride, n_in, n_rows, out);
}
void InterleaveQ5_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveNibbles<BlockQ5_0, BlockQ5_0x16>(w, w_stride, n_in, n_rows, out);
}
void InterleaveQ5_1(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveNibbles<BlockQ5_1, BlockQ5_1x16>(w, w_stride, n_in, n_rows, out);
}

namespace {

// One Q8_0 block as row r of an interleaved block: + 128 on each int8 element is a flip of its
// top bit, done 4 elements (one 32-bit word) at a time.
void PutQ8_0Row(BlockQ8_0x16& p, int r, const BlockQ8_0& src) {
  for (int i = 0; i < kQK / 4; ++i) FlipTopBits4(src.qs + 4 * i, &p.qs[i][4 * r]);
  std::memcpy(p.d[r], src.d, 2);
}

void GetQ8_0Row(BlockQ8_0& dst, const BlockQ8_0x16& p, int r) {
  for (int i = 0; i < kQK / 4; ++i) FlipTopBits4(&p.qs[i][4 * r], dst.qs + 4 * i);
  std::memcpy(dst.d, p.d[r], 2);
}

}  // namespace

void InterleaveQ8_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveRows<BlockQ8_0, BlockQ8_0x16>(
      w, w_stride, n_in, n_rows, out,
      [](BlockQ8_0x16& p, int r, const BlockQ8_0& src) { PutQ8_0Row(p, r, src); });
}

void InterleavedRowQ4_0(const void* groups, int64_t n_in, int64_t row, void* out) {
  ExtractRow<BlockQ4_0, BlockQ4_0x16>(groups, n_in, row, out,
                                      GetNibbleRow<BlockQ4_0, BlockQ4_0x16>);
}
void InterleavedRowQ4_1(const void* groups, int64_t n_in, int64_t row, void* out) {
  ExtractRow<BlockQ4_1, BlockQ4_1x16>(groups, n_in, row, out,
                                      GetNibbleRow<BlockQ4_1, BlockQ4_1x16>);
}
void InterleavedRowQ5_0(const void* groups, int64_t n_in, int64_t row, void* out) {
  ExtractRow<BlockQ5_0, BlockQ5_0x16>(groups, n_in, row, out,
                                      GetNibbleRow<BlockQ5_0, BlockQ5_0x16>);
}
void InterleavedRowQ5_1(const void* groups, int64_t n_in, int64_t row, void* out) {
  ExtractRow<BlockQ5_1, BlockQ5_1x16>(groups, n_in, row, out,
                                      GetNibbleRow<BlockQ5_1, BlockQ5_1x16>);
}
void InterleavedRowQ8_0(const void* groups, int64_t n_in, int64_t row, void* out) {
  ExtractRow<BlockQ8_0, BlockQ8_0x16>(groups, n_in, row, out, GetQ8_0Row);
}

namespace {

// Element j (0..31) of a Q5_0 / Q5_1 block's 5-bit codes: the nibble of qs (low for j < 16) and
// bit j of qh as bit 4.
int FiveBitCode(const uint8_t* qs, uint32_t qh, int j) {
  const int nibble = j < kQK / 2 ? qs[j] & 0x0F : qs[j - kQK / 2] >> 4;
  return nibble | static_cast<int>((qh >> j) & 1) << 4;
}

}  // namespace

float VecDotQ8_0Q8_0IntegerRef(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t p = 0;
    for (int j = 0; j < kQK; ++j) p += x[b].qs[j] * y[b].qs[j];
    acc = std::fma(LoadHalf(x[b].d) * LoadHalf(y[b].d), static_cast<float>(p), acc);
  }
  return acc;
}

float VecDotQ4_0Q8_0IntegerRef(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t p = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      p += ((x[b].qs[j] & 0x0F) - 8) * y[b].qs[j] + ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + kQK / 2];
    }
    acc = std::fma(LoadHalf(x[b].d) * LoadHalf(y[b].d), static_cast<float>(p), acc);
  }
  return acc;
}

float VecDotQ5_0Q8_0IntegerRef(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    int32_t p = 0;
    for (int j = 0; j < kQK; ++j) p += (FiveBitCode(x[b].qs, qh, j) - 16) * y[b].qs[j];
    acc = std::fma(LoadHalf(x[b].d) * LoadHalf(y[b].d), static_cast<float>(p), acc);
  }
  return acc;
}

float VecDotQ5_1Q8_1IntegerRef(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float acc = 0.0f, mins = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    int32_t p = 0;
    for (int j = 0; j < kQK; ++j) p += FiveBitCode(x[b].qs, qh, j) * y[b].qs[j];
    const float s = LoadHalf(x[b].d) * LoadHalf(y[b].d);
    acc = std::fma(s, static_cast<float>(p), acc);
    mins = std::fma(LoadHalf(x[b].m), LoadHalf(y[b].s), mins);
  }
  return acc + mins;
}

float VecDotQ4_1Q8_1IntegerRef(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  float acc = 0.0f, mins = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t p = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      p += (x[b].qs[j] & 0x0F) * y[b].qs[j] + (x[b].qs[j] >> 4) * y[b].qs[j + kQK / 2];
    }
    const float s = LoadHalf(x[b].d) * LoadHalf(y[b].d);
    acc = std::fma(s, static_cast<float>(p), acc);
    mins = std::fma(LoadHalf(x[b].m), LoadHalf(y[b].s), mins);
  }
  return acc + mins;
}

}  // namespace kiln::quant
