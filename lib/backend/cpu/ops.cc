#include "lib/backend/cpu/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/prefetch.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/common/cpu_features.h"
#include "lib/common/half.h"
#include "lib/common/platform.h"
#include "lib/quant/activation.h"

namespace kiln::cpu {

// ---- dispatch -----------------------------------------------------------------------------

const OpKernels& GetOpKernels(CpuLevel level) {
  // Built on first use, and only up to this CPU's level: a level's Fill function is compiled
  // with its instruction set and may execute it. Levels above stay empty and are never handed out.
  static const std::array<OpKernels, 3> tables = [] {
    const CpuFeatures& cpu = GetCpuFeatures();
    SetPrefetchForCore(cpu.amd, cpu.x86_family);  // kernels/cpu/prefetch.h
    const CpuLevel best = BestCpuLevel();
    std::array<OpKernels, 3> t{};
    FillOpKernelsScalar(&t[0]);
    if (best >= CpuLevel::kAvx2) {
      t[1] = t[0];
      FillOpKernelsAvx2(&t[1]);
    }
    if (best >= CpuLevel::kAvx512) {
      t[2] = t[1];
      FillOpKernelsAvx512(&t[2]);
    }
    return t;
  }();
  const int best = static_cast<int>(BestCpuLevel());
  const int l = std::min(static_cast<int>(level), best);
  return tables[std::max(l, 0)];
}

bool KvElemOf(GgmlType type, KvElem* elem) {
  switch (type) {
    case GgmlType::kF32:
      *elem = KvElem::kF32;
      return true;
    case GgmlType::kF16:
      *elem = KvElem::kF16;
      return true;
    case GgmlType::kBF16:
      *elem = KvElem::kBf16;
      return true;
    case GgmlType::kQ8_0:
      *elem = KvElem::kQ8_0;
      return true;
    default:
      return false;
  }
}

// ---- Scratch ------------------------------------------------------------------------------

void Scratch::FreeDeleter::operator()(void* p) const { platform::AlignedFree(p); }

void* Scratch::Get(size_t bytes) {
  if (bytes > size_) {
    const size_t rounded = (std::max(bytes, size_ * 3 / 2) + 63) & ~size_t{63};
    buf_.reset(platform::AlignedAlloc(64, rounded));
    size_ = buf_ ? rounded : 0;
  }
  return buf_.get();
}

// ---- MatMul -------------------------------------------------------------------------------

namespace {

constexpr int64_t kRowChunk = 16;  // weight rows per tile (and per parallel task)
static_assert(kMatMulRowAlign % kRowChunk == 0, "a row range must start on a tile");
constexpr int64_t kTokenTile = 32;  // activation rows per tile
// Tokens per vec_dot_tile call: their repacked activations (~2 bytes per element) stay in L2.
constexpr int64_t kTileTokenBlock = 64;
// Tokens per in_place_tile call: for more than 8 tokens the AVX-512 Q8_0 kernel packs each group
// of 16 weight rows 64 blocks at a time and runs every token over each chunk, so more tokens a
// call pack less often (256 tokens' activations of one chunk: 557 KiB, within L2). llama-1b Q8_0
// prefill512, 1 thread: 140 tok/s at 256 tokens a call, the interleaved copy's 151 at 64.
constexpr int64_t kInPlaceTokenBlock = 256;

absl::Status CheckWeight(const WeightView& w, const char* what) {
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": data is null"));
  if (w.n_in <= 0 || w.n_out <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shape {%d, %d} must be positive", what, w.n_in, w.n_out));
  }
  return absl::OkStatus();
}

// Resolves kernels and row sizes of a weight type (and its activation type).
struct MatMulPlan {
  const QuantKernels* k = nullptr;
  const QuantKernels* act = nullptr;     // null when activations are used as f32 directly
  QuantizeRowFn quantize_act = nullptr;  // ActivationQuantizer of act's type
  size_t w_row_bytes = 0;
  size_t act_row_bytes = 0;
};

absl::StatusOr<MatMulPlan> PlanMatMul(const WeightView& w, CpuLevel level) {
  KILN_RETURN_IF_ERROR(CheckWeight(w, "MatMul weight"));
  MatMulPlan p;
  p.k = GetQuantKernels(w.type, level);
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(w.type));
  if (p.k == nullptr || !info) {
    return absl::UnimplementedError(absl::StrCat("MatMul: no CPU kernels for weight type ",
                                                 GgmlTypeName(static_cast<uint32_t>(w.type))));
  }
  if (w.n_in % info->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMul: n_in %d is not a multiple of the %s block size %d", w.n_in,
                        GgmlTypeName(static_cast<uint32_t>(w.type)), info->block_size));
  }
  p.w_row_bytes = GgmlRowBytes(*info, w.n_in);
  const GgmlType at = p.k->vec_dot_type;
  if (at == GgmlType::kF32) {
    p.act_row_bytes = w.n_in * sizeof(float);
    return p;
  }
  p.act = GetQuantKernels(at, level);
  p.quantize_act = ActivationQuantizer(at, level);
  const auto ainfo = GgmlTypeInfoOf(static_cast<uint32_t>(at));
  if (p.act == nullptr || p.quantize_act == nullptr || !ainfo) {
    return absl::UnimplementedError(absl::StrCat(
        "MatMul: activation type ", GgmlTypeName(static_cast<uint32_t>(at)), " of weight type ",
        GgmlTypeName(static_cast<uint32_t>(w.type)), " has no quantizer"));
  }
  if (w.n_in % ainfo->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMul: n_in %d is not a multiple of the activation block size %d", w.n_in,
                        ainfo->block_size));
  }
  p.act_row_bytes = GgmlRowBytes(*ainfo, w.n_in);
  return p;
}

// rows == nullptr means rows 0..n_rows-1 of x. Computes the weight rows [row_begin, row_end)
// (row_begin a multiple of kRowChunk), so each tile holds the rows it holds in the whole matmul.
absl::Status MatMulImpl(ThreadPool& pool, const WeightView& w, const float* x, const int32_t* rows,
                        int64_t n_rows, int64_t row_begin, int64_t row_end, float* y,
                        Scratch& scratch, CpuLevel level) {
  KILN_ASSIGN_OR_RETURN(const MatMulPlan plan, PlanMatMul(w, level));
  if (n_rows <= 0 || row_begin == row_end) return absl::OkStatus();
  if (x == nullptr || y == nullptr) return absl::InvalidArgumentError("MatMul: x or y is null");
  const int64_t n_in = w.n_in, n_out = w.n_out;
  auto x_row = [&](int64_t r) { return x + (rows ? rows[r] : r) * n_in; };

  // Activations: [n_rows] rows of the vec_dot type, each quantized once by one thread.
  const uint8_t* act = nullptr;
  if (plan.act != nullptr) {
    uint8_t* buf = static_cast<uint8_t*>(scratch.Get(n_rows * plan.act_row_bytes));
    if (buf == nullptr) return absl::ResourceExhaustedError("MatMul: scratch allocation failed");
    pool.ParallelFor(n_rows, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        plan.quantize_act(x_row(r), buf + r * plan.act_row_bytes, n_in);
      }
    });
    act = buf;
  }
  // One token's f32 activations (float weights, decode) are read from a copy that starts 16 bytes
  // past a 64-byte boundary. Why: the AVX-512 float dots stream the weights faster with the
  // activations there (Zen 4, kiln generate, 1 thread, four alternating runs: llama-1b-f16
  // 10.3-11.0 -> 11.5-11.8 tok/s, llama-1b-bf16 11.9-12.2 -> 13.3-13.6; 64-byte aligned:
  // 10.0-10.2); the copy is n_in floats per matmul.
  const float* shifted_x = nullptr;
  if (act == nullptr && n_rows == 1) {
    constexpr size_t kShift = 16;
    auto* buf = static_cast<uint8_t*>(scratch.Get(kShift + n_in * sizeof(float)));
    if (buf == nullptr) return absl::ResourceExhaustedError("MatMul: scratch allocation failed");
    auto* copy = reinterpret_cast<float*>(buf + kShift);
    std::memcpy(copy, x_row(0), n_in * sizeof(float));
    shifted_x = copy;
  }
  auto act_row = [&](int64_t r) -> const void* {
    if (shifted_x != nullptr) return shifted_x;
    return act ? static_cast<const void*>(act + r * plan.act_row_bytes) : x_row(r);
  };
  // What the tile kernels read: the quantized activations, or x itself for f32 activations
  // (float weights) when its rows are consecutive; null: no tile.
  const uint8_t* tile_act = act;
  if (act == nullptr && rows == nullptr) tile_act = reinterpret_cast<const uint8_t*>(x);

  const uint8_t* wdata = static_cast<const uint8_t*>(w.data);
  const int64_t n_chunks = (row_end - row_begin + kRowChunk - 1) / kRowChunk;
  // Tile kernels: each thread takes its rows (whole chunks of [begin, end)) in one call per block
  // of token_block tokens, so a kernel prepares those tokens' activations once for all its rows
  // and reads each weight row once per token block. call(r0, n_rows, act, n_tokens, y) computes
  // y[tb..te, r0..r0 + n_rows] of y [n_rows, n_out].
  auto for_each_tile = [&](int64_t begin, int64_t end, auto&& call,
                           int64_t token_block = kTileTokenBlock) {
    pool.ParallelFor((end - begin + kRowChunk - 1) / kRowChunk, [&](int64_t c0, int64_t c1, int) {
      const int64_t r0 = begin + c0 * kRowChunk;
      const int64_t r1 = std::min(end, begin + c1 * kRowChunk);
      for (int64_t tb = 0; tb < n_rows; tb += token_block) {
        const int64_t te = std::min(n_rows, tb + token_block);
        call(r0, static_cast<int>(r1 - r0), tile_act + tb * plan.act_row_bytes,
             static_cast<int>(te - tb), y + tb * n_out + r0);
      }
    });
  };
  // The kernels of the interleaved copies (the integer order's; the K-quants' quads, in vec_dot's
  // order): the rows the copy holds from it (groups of 16 rows; chunks hold whole groups), the
  // others in place (those of a copy still being written in the background, or all of them where
  // the copies' memory could not be had), with the same bits.
  const bool has_copy_kernels = act != nullptr && plan.k->interleaved_tile != nullptr;
  const int64_t copied_end =
      has_copy_kernels ? std::clamp(w.InterleavedRows(), row_begin, row_end) : row_begin;
  if (copied_end > row_begin) {
    static_assert(kRowChunk % quant::kInterleaveRows == 0);
    const InterleavedTileFn tile = plan.k->interleaved_tile;
    const size_t group_bytes = plan.k->interleaved_group_bytes(n_in);
    const auto* groups = static_cast<const uint8_t*>(w.interleaved);
    for_each_tile(row_begin, copied_end,
                  [&](int64_t r0, int rows, const uint8_t* a, int tokens, float* yt) {
                    tile(n_in, groups + r0 / quant::kInterleaveRows * group_bytes, rows, a,
                         plan.act_row_bytes, tokens, yt, static_cast<size_t>(n_out));
                  });
    if (copied_end == row_end) return absl::OkStatus();
  }
  if (has_copy_kernels && w.in_place && plan.k->in_place_tile != nullptr) {
    const VecDotTileFn tile = plan.k->in_place_tile;
    for_each_tile(
        copied_end, row_end,
        [&](int64_t r0, int rows, const uint8_t* a, int tokens, float* yt) {
          tile(n_in, wdata + r0 * plan.w_row_bytes, plan.w_row_bytes, rows, a, plan.act_row_bytes,
               tokens, yt, static_cast<size_t>(n_out));
        },
        kInPlaceTokenBlock);
    return absl::OkStatus();
  }
  if (copied_end > row_begin) {  // PrepareCpuWeights copies in the background only such types
    return absl::InternalError(absl::StrFormat(
        "MatMul: %s is partly copied and has no in-place kernel", std::string(w.name)));
  }
  if (plan.k->vec_dot_tile != nullptr && tile_act != nullptr &&
      (n_rows >= 2 || plan.k->tile_for_one_token)) {
    // Rows x tokens tile kernel: the same bits as vec_dot for every output.
    const VecDotTileFn tile = plan.k->vec_dot_tile;
    for_each_tile(row_begin, row_end,
                  [&](int64_t r0, int rows, const uint8_t* a, int tokens, float* yt) {
                    tile(n_in, wdata + r0 * plan.w_row_bytes, plan.w_row_bytes, rows, a,
                         plan.act_row_bytes, tokens, yt, static_cast<size_t>(n_out));
                  });
    return absl::OkStatus();
  }
  const VecDotFn vec_dot = plan.k->vec_dot;
  // Multi-row kernel: same bits as vec_dot per row. For a single token streaming Q8_0 weights
  // from memory it measured 1.5-2x slower than row-by-row vec_dot (the 4 interleaved 612-byte
  // row streams defeat the prefetcher; the nibble types are fine), so decode skips it there.
  const VecDotRowsFn vec_dot_rows =
      (n_rows > 1 || w.type != GgmlType::kQ8_0) ? plan.k->vec_dot_rows : nullptr;
  pool.ParallelFor(n_chunks, [&](int64_t c0, int64_t c1, int) {
    const int64_t r0 = row_begin + c0 * kRowChunk;
    const int64_t r1 = std::min(row_end, row_begin + c1 * kRowChunk);
    // Tiles of kRowChunk weight rows x kTokenTile tokens: each weight row is read from memory
    // once per token tile; every output is one vec_dot (or the bit-identical vec_dot_rows)
    // of its weight row and its token's activations (batch invariance).
    for (int64_t tb = 0; tb < n_rows; tb += kTokenTile) {
      const int64_t te = std::min(n_rows, tb + kTokenTile);
      for (int64_t rb = r0; rb < r1; rb += kRowChunk) {
        const int64_t re = std::min(r1, rb + kRowChunk);
        for (int64_t t = tb; t < te; ++t) {
          const void* a = act_row(t);
          float* yt = y + t * n_out;
          if (vec_dot_rows != nullptr) {
            vec_dot_rows(n_in, wdata + rb * plan.w_row_bytes, plan.w_row_bytes,
                         static_cast<int>(re - rb), a, yt + rb);
          } else {
            for (int64_t r = rb; r < re; ++r) {
              yt[r] = vec_dot(n_in, wdata + r * plan.w_row_bytes, a);
            }
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens,
                    float* y, Scratch& scratch, CpuLevel level) {
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("MatMul: n_tokens %d < 0", n_tokens));
  }
  return MatMulImpl(pool, w, x, nullptr, n_tokens, 0, w.n_out, y, scratch, level);
}

absl::Status CheckMatMulRange(const WeightView& w, int64_t n_tokens, int64_t row_begin,
                              int64_t row_end) {
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("MatMulRange: n_tokens %d < 0", n_tokens));
  }
  if (row_begin < 0 || row_end > w.n_out || row_begin > row_end) {
    return absl::OutOfRangeError(
        absl::StrFormat("MatMulRange: rows [%d, %d) are not a range of the %d weight rows",
                        row_begin, row_end, w.n_out));
  }
  if (row_begin % kMatMulRowAlign != 0 || (row_end % kMatMulRowAlign != 0 && row_end != w.n_out)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MatMulRange: rows [%d, %d) do not start and end on multiples of %d (or the last row)",
        row_begin, row_end, kMatMulRowAlign));
  }
  return absl::OkStatus();
}

absl::Status MatMulRange(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens,
                         int64_t row_begin, int64_t row_end, float* y, Scratch& scratch,
                         CpuLevel level) {
  KILN_RETURN_IF_ERROR(CheckMatMulRange(w, n_tokens, row_begin, row_end));
  return MatMulImpl(pool, w, x, nullptr, n_tokens, row_begin, row_end, y, scratch, level);
}

absl::Status MatMulRows(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_x_rows,
                        std::span<const int32_t> rows, float* y, Scratch& scratch, CpuLevel level) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= n_x_rows) {
      return absl::OutOfRangeError(
          absl::StrFormat("MatMulRows: rows[%d] = %d is outside [0, %d)", i, rows[i], n_x_rows));
    }
  }
  return MatMulImpl(pool, w, x, rows.data(), static_cast<int64_t>(rows.size()), 0, w.n_out, y,
                    scratch, level);
}

// ---- Embedding ----------------------------------------------------------------------------

absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens, float* out,
                             CpuLevel level) {
  KILN_RETURN_IF_ERROR(CheckWeight(table, "EmbeddingGather table"));
  const QuantKernels* k = GetQuantKernels(table.type, level);
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(table.type));
  if (k == nullptr || !info) {
    return absl::UnimplementedError(absl::StrCat("EmbeddingGather: no CPU kernels for type ",
                                                 GgmlTypeName(static_cast<uint32_t>(table.type))));
  }
  if (table.n_in % info->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("EmbeddingGather: n_embd %d is not a multiple of the block size %d",
                        table.n_in, info->block_size));
  }
  const size_t row_bytes = GgmlRowBytes(*info, table.n_in);
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= table.n_out) {
      return absl::OutOfRangeError(
          absl::StrFormat("EmbeddingGather: tokens[%d] = %d is outside the vocabulary [0, %d)", t,
                          tokens[t], table.n_out));
    }
  }
  // A table with an interleaved copy (a tied embedding, also the output matrix) is read from the
  // copy: the same bytes per row, and the file's pages of it stay released (each lookup of the
  // mapped file made up to 64 KiB around its row resident again: gemma3-270m's 180 MB table).
  // (Rows not yet copied by a background copy come from the file.)
  const quant::InterleavedRowFn from_copy =
      table.interleaved != nullptr ? k->interleaved_row : nullptr;
  const int64_t copied = table.InterleavedRows();
  std::vector<uint8_t> row(from_copy != nullptr ? row_bytes : 0);
  const uint8_t* base = static_cast<const uint8_t*>(table.data);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const uint8_t* src = base + tokens[t] * row_bytes;
    if (from_copy != nullptr && tokens[t] < copied) {
      from_copy(table.interleaved, table.n_in, tokens[t], row.data());
      src = row.data();
    }
    k->dequantize(src, out + t * table.n_in, table.n_in);
  }
  return absl::OkStatus();
}

// ---- Element-wise -------------------------------------------------------------------------

void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps, float* y,
             CpuLevel level) {
  GetOpKernels(level).rms_norm(x, weight, n_rows, n, eps, y);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y, CpuLevel level) {
  GetOpKernels(level).swiglu(gate, up, n, y);
}

float GeluF32(float x) {
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * std::fma(kCoefA * x, x, 1.0f)));
}

const uint16_t* GeluF16Table() {
  // One entry past the 65536: the SIMD kernels gather 32 bits at each f16 index (op_kernels.h).
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t((1 << 16) + 1, 0);
    for (uint32_t i = 0; i < (1u << 16); ++i) {
      t[i] = Fp32ToFp16(GeluF32(Fp16ToFp32(static_cast<uint16_t>(i))));
    }
    return t;
  }();
  return table.data();
}

void GeGlu(const float* gate, const float* up, int64_t n, float* y, CpuLevel level) {
  GetOpKernels(level).geglu(gate, up, GeluF16Table(), n, y);
}

void Scale(float* x, int64_t n, float s, CpuLevel level) { GetOpKernels(level).scale(x, s, n); }

void Add(const float* a, const float* b, int64_t n, float* y, CpuLevel level) {
  GetOpKernels(level).add(a, b, n, y);
}

void SoftmaxRows(float* x, int64_t n_rows, int64_t n, float scale, CpuLevel level) {
  const OpKernels& k = GetOpKernels(level);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * n;
    if (scale != 1.0f) k.scale(row, scale, n);
    const float m = k.max(row, n);
    const float sum = k.exp_sum(row, m, n, row);
    k.scale(row, 1.0f / sum, n);
  }
}

}  // namespace kiln::cpu
