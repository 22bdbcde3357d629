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

// One matmul ready to run: its plan, where its activations are and which kernels its rows take.
// Chunk c is the weight rows [row_begin + c * kRowChunk, row_begin + (c + 1) * kRowChunk) cut at
// row_end; a thread runs a contiguous range of chunks (RunChunks). MatMul runs one job's chunks
// in one ParallelFor, MatMulEach several jobs' in one.
struct MatMulJob {
  MatMulPlan plan;
  const WeightView* w = nullptr;
  const float* x = nullptr;
  const int32_t* rows = nullptr;  // null: rows 0..n_rows-1 of x
  int64_t n_rows = 0;
  int64_t row_begin = 0, row_end = 0;
  float* y = nullptr;
  // Filled by PrepareActivations: the quantized activations [n_rows][plan.act_row_bytes], or
  // one token's f32 copy (shifted_x), or neither (x read as it is).
  const uint8_t* act = nullptr;
  const float* shifted_x = nullptr;
  int act_owner = -1;  // the job (index in PrepareActivations' span) whose copy this one reads
  size_t act_offset = 0;
  // Rows below copied_end come from the interleaved copy, the rest take rest_path.
  int64_t copied_end = 0;
  enum class RestPath { kInPlaceTile, kVecDotTile, kVecDot } rest_path = RestPath::kVecDot;

  int64_t n_chunks() const { return (row_end - row_begin + kRowChunk - 1) / kRowChunk; }
  const float* XRow(int64_t r) const { return x + (rows ? rows[r] : r) * w->n_in; }
  // One token's f32 activations (float weights, decode) are read from a copy that starts 16 bytes
  // past a 64-byte boundary. Why: the AVX-512 float dots stream the weights faster with the
  // activations there (Zen 4, kiln generate, 1 thread, four alternating runs: llama-1b-f16
  // 10.3-11.0 -> 11.5-11.8 tok/s, llama-1b-bf16 11.9-12.2 -> 13.3-13.6; 64-byte aligned:
  // 10.0-10.2); the copy is n_in floats per input.
  static constexpr size_t kShift = 16;
  bool WantsShiftedX() const { return plan.act == nullptr && n_rows == 1; }
  // What the tile kernels read: the quantized activations, or x itself for f32 activations
  // (float weights) when its rows are consecutive; null: no tile.
  const uint8_t* TileAct() const {
    if (act != nullptr) return act;
    return rows == nullptr ? reinterpret_cast<const uint8_t*>(x) : nullptr;
  }
  void RunChunks(int64_t c0, int64_t c1) const;
};

// Plans a job over the weight rows [row_begin, row_end) and picks its kernels; *empty when there
// is nothing to compute.
absl::Status PrepareJob(const WeightView& w, const float* x, const int32_t* rows, int64_t n_rows,
                        int64_t row_begin, int64_t row_end, float* y, CpuLevel level,
                        MatMulJob* job, bool* empty) {
  KILN_ASSIGN_OR_RETURN(job->plan, PlanMatMul(w, level));
  *empty = n_rows <= 0 || row_begin == row_end;
  if (*empty) return absl::OkStatus();
  if (x == nullptr || y == nullptr) return absl::InvalidArgumentError("MatMul: x or y is null");
  job->w = &w;
  job->x = x;
  job->rows = rows;
  job->n_rows = n_rows;
  job->row_begin = row_begin;
  job->row_end = row_end;
  job->y = y;
  const QuantKernels& k = *job->plan.k;
  // The kernels of the interleaved copies (the integer order's; the K-quants' quads, in vec_dot's
  // order): the rows the copy holds from it (groups of 16 rows; chunks hold whole groups), the
  // others in place (those of a copy still being written in the background, or all of them where
  // the copies' memory could not be had), with the same bits.
  static_assert(kRowChunk % quant::kInterleaveRows == 0);
  const bool has_copy_kernels = job->plan.act != nullptr && k.interleaved_tile != nullptr;
  job->copied_end =
      has_copy_kernels ? std::clamp(w.InterleavedRows(), row_begin, row_end) : row_begin;
  if (has_copy_kernels && w.in_place && k.in_place_tile != nullptr) {
    job->rest_path = MatMulJob::RestPath::kInPlaceTile;
  } else if (job->copied_end < row_end && job->copied_end > row_begin) {
    // PrepareCpuWeights copies in the background only types with an in-place kernel.
    return absl::InternalError(absl::StrFormat(
        "MatMul: %s is partly copied and has no in-place kernel", std::string(w.name)));
  } else if (k.vec_dot_tile != nullptr && (job->plan.act != nullptr || rows == nullptr) &&
             (n_rows >= 2 || k.tile_for_one_token)) {
    job->rest_path = MatMulJob::RestPath::kVecDotTile;
  } else {
    job->rest_path = MatMulJob::RestPath::kVecDot;
  }
  return absl::OkStatus();
}

// Quantizes the activations of `jobs` (one input x and rows for all of them, so jobs whose
// weights take the same activation format share one copy) and makes the f32 copy of one token's
// input, in one scratch buffer. Rows are quantized in parallel, each by one thread.
absl::Status PrepareActivations(ThreadPool& pool, std::span<MatMulJob> jobs, Scratch& scratch) {
  constexpr size_t kAlign = 64;
  size_t total = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    MatMulJob& job = jobs[j];
    if (job.plan.act == nullptr && !job.WantsShiftedX()) continue;
    for (size_t o = 0; o < j && job.act_owner < 0; ++o) {
      if (jobs[o].act_owner == static_cast<int>(o) &&
          jobs[o].plan.quantize_act == job.plan.quantize_act && jobs[o].w->n_in == job.w->n_in) {
        job.act_owner = static_cast<int>(o);
      }
    }
    if (job.act_owner >= 0) continue;
    job.act_owner = static_cast<int>(j);
    job.act_offset = total;
    const size_t bytes = job.plan.act != nullptr ? job.n_rows * job.plan.act_row_bytes
                                                 : MatMulJob::kShift + job.w->n_in * sizeof(float);
    total += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return absl::OkStatus();
  auto* buf = static_cast<uint8_t*>(scratch.Get(total));
  if (buf == nullptr) return absl::ResourceExhaustedError("MatMul: scratch allocation failed");
  for (MatMulJob& job : jobs) {
    if (job.act_owner < 0) continue;
    uint8_t* copy = buf + jobs[job.act_owner].act_offset;
    if (job.plan.act != nullptr) {
      job.act = copy;
    } else {
      job.shifted_x = reinterpret_cast<const float*>(copy + MatMulJob::kShift);
    }
  }
  pool.ParallelFor(jobs[0].n_rows, [&](int64_t b, int64_t e, int) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      const MatMulJob& job = jobs[j];
      if (job.act_owner != static_cast<int>(j)) continue;
      uint8_t* copy = buf + job.act_offset;
      for (int64_t r = b; r < e; ++r) {
        if (job.plan.act != nullptr) {
          job.plan.quantize_act(job.XRow(r), copy + r * job.plan.act_row_bytes, job.w->n_in);
        } else {
          std::memcpy(copy + MatMulJob::kShift, job.XRow(0), job.w->n_in * sizeof(float));
        }
      }
    }
  });
  return absl::OkStatus();
}

void MatMulJob::RunChunks(int64_t c0, int64_t c1) const {
  const int64_t r0 = row_begin + c0 * kRowChunk;
  const int64_t r1 = std::min(row_end, row_begin + c1 * kRowChunk);
  const int64_t n_in = w->n_in, n_out = w->n_out;
  const uint8_t* wdata = static_cast<const uint8_t*>(w->data);
  const QuantKernels& k = *plan.k;
  const uint8_t* tile_act = TileAct();
  // call(r0, n_rows, act, n_tokens, y) computes y[tb..te, r0..r0 + n_rows] of y [n_rows, n_out]
  // for each block of token_block tokens: a kernel prepares those tokens' activations once for
  // all its rows and reads each weight row once per token block.
  auto tiles = [&](int64_t b, int64_t e, int64_t token_block, auto&& call) {
    if (b >= e) return;
    for (int64_t tb = 0; tb < n_rows; tb += token_block) {
      const int64_t te = std::min(n_rows, tb + token_block);
      call(b, static_cast<int>(e - b), tile_act + tb * plan.act_row_bytes,
           static_cast<int>(te - tb), y + tb * n_out + b);
    }
  };
  const int64_t split = std::clamp(copied_end, r0, r1);
  if (split > r0) {
    const InterleavedTileFn tile = k.interleaved_tile;
    const size_t group_bytes = k.interleaved_group_bytes(n_in);
    const auto* groups = static_cast<const uint8_t*>(w->interleaved);
    tiles(r0, split, kTileTokenBlock,
          [&](int64_t rb, int n, const uint8_t* a, int tokens, float* yt) {
            tile(n_in, groups + rb / quant::kInterleaveRows * group_bytes, n, a, plan.act_row_bytes,
                 tokens, yt, static_cast<size_t>(n_out));
          });
  }
  if (split == r1) return;
  if (rest_path != RestPath::kVecDot) {
    const bool in_place = rest_path == RestPath::kInPlaceTile;
    const VecDotTileFn tile = in_place ? k.in_place_tile : k.vec_dot_tile;
    // Rows x tokens tile kernels: the same bits as vec_dot for every output.
    tiles(split, r1, in_place ? kInPlaceTokenBlock : kTileTokenBlock,
          [&](int64_t rb, int n, const uint8_t* a, int tokens, float* yt) {
            tile(n_in, wdata + rb * plan.w_row_bytes, plan.w_row_bytes, n, a, plan.act_row_bytes,
                 tokens, yt, static_cast<size_t>(n_out));
          });
    return;
  }
  auto act_row = [&](int64_t r) -> const void* {
    if (shifted_x != nullptr) return shifted_x;
    return act ? static_cast<const void*>(act + r * plan.act_row_bytes) : XRow(r);
  };
  const VecDotFn vec_dot = k.vec_dot;
  // Multi-row kernel: same bits as vec_dot per row. For a single token streaming Q8_0 weights
  // from memory it measured 1.5-2x slower than row-by-row vec_dot (the 4 interleaved 612-byte
  // row streams defeat the prefetcher; the nibble types are fine), so decode skips it there.
  const VecDotRowsFn vec_dot_rows =
      (n_rows > 1 || w->type != GgmlType::kQ8_0) ? k.vec_dot_rows : nullptr;
  // Tiles of kRowChunk weight rows x kTokenTile tokens: each weight row is read from memory once
  // per token tile; every output is one vec_dot (or the bit-identical vec_dot_rows) of its weight
  // row and its token's activations (batch invariance).
  for (int64_t tb = 0; tb < n_rows; tb += kTokenTile) {
    const int64_t te = std::min(n_rows, tb + kTokenTile);
    for (int64_t rb = split; rb < r1; rb += kRowChunk) {
      const int64_t re = std::min(r1, rb + kRowChunk);
      for (int64_t t = tb; t < te; ++t) {
        const void* a = act_row(t);
        float* yt = y + t * n_out;
        if (vec_dot_rows != nullptr) {
          vec_dot_rows(n_in, wdata + rb * plan.w_row_bytes, plan.w_row_bytes,
                       static_cast<int>(re - rb), a, yt + rb);
        } else {
          for (int64_t r = rb; r < re; ++r) yt[r] = vec_dot(n_in, wdata + r * plan.w_row_bytes, a);
        }
      }
    }
  }
}

// Runs the jobs' chunks in one ParallelFor: each thread the share of every job that MatMul's
// split gives it. (A head start for the calling thread, which begins while the workers wake up,
// measured no faster: 4-24 KiB of one token's weights moved to it took the default model's
// two-thread wait after its ranges from 60-80 to 17-40 us a token, and the step within noise.)
void RunJobs(ThreadPool& pool, std::span<const MatMulJob> jobs) {
  int64_t most_chunks = 0;
  for (const MatMulJob& job : jobs) most_chunks = std::max(most_chunks, job.n_chunks());
  // One range per thread, or per chunk when there are fewer chunks than threads.
  const int n_ranges = static_cast<int>(std::min<int64_t>(pool.n_threads(), most_chunks));
  pool.ParallelFor(n_ranges, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      for (const MatMulJob& job : jobs) {
        int64_t c0, c1;
        ThreadPool::StaticRange(job.n_chunks(), n_ranges, static_cast<int>(t), &c0, &c1);
        if (c0 < c1) job.RunChunks(c0, c1);
      }
    }
  });
}

// rows == nullptr means rows 0..n_rows-1 of x. Computes the weight rows [row_begin, row_end)
// (row_begin a multiple of kRowChunk), so each tile holds the rows it holds in the whole matmul.
absl::Status MatMulImpl(ThreadPool& pool, const WeightView& w, const float* x, const int32_t* rows,
                        int64_t n_rows, int64_t row_begin, int64_t row_end, float* y,
                        Scratch& scratch, CpuLevel level) {
  MatMulJob job;
  bool empty = false;
  KILN_RETURN_IF_ERROR(PrepareJob(w, x, rows, n_rows, row_begin, row_end, y, level, &job, &empty));
  if (empty) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(PrepareActivations(pool, std::span(&job, 1), scratch));
  RunJobs(pool, std::span(&job, 1));
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

absl::Status MatMulEach(ThreadPool& pool, const float* x, int64_t n_tokens,
                        std::span<const MatMulTarget> targets, Scratch& scratch, CpuLevel level) {
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("MatMulEach: n_tokens %d < 0", n_tokens));
  }
  KILN_RETURN_IF_ERROR(CheckMatMulTargets(targets));
  // Up to kMaxJobs matrices a job (no allocation a call; a layer has at most three).
  constexpr size_t kMaxJobs = 4;
  for (size_t first = 0; first < targets.size(); first += kMaxJobs) {
    std::array<MatMulJob, kMaxJobs> jobs;
    size_t n_jobs = 0;
    for (size_t i = first; i < std::min(targets.size(), first + kMaxJobs); ++i) {
      bool empty = false;
      KILN_RETURN_IF_ERROR(PrepareJob(*targets[i].w, x, nullptr, n_tokens, 0, targets[i].w->n_out,
                                      targets[i].y, level, &jobs[n_jobs], &empty));
      if (!empty) ++n_jobs;
    }
    if (n_jobs == 0) continue;
    const std::span<MatMulJob> prepared(jobs.data(), n_jobs);
    KILN_RETURN_IF_ERROR(PrepareActivations(pool, prepared, scratch));
    RunJobs(pool, prepared);
  }
  return absl::OkStatus();
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
