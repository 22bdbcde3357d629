// Device benchmarks of the CUDA module (scripts/cuda_check.sh runs it), on device-resident
// buffers: copy bandwidth (pinned and device to device, the roofline the kernels are compared
// with), the elementwise kernels' bandwidth; the decode GEMV over the weights of one layer of an
// 8B-shape model (Llama-3-8B: 4096 wide, 14336 FFN, 8 KV heads) and its output head, per weight
// type, as GB/s and percent of the device-to-device copy's bandwidth; paged attention decode at
// 32k context (GQA: 32 heads over 8 KV heads of 128, f16 cache; MLA: DeepSeek-V2-Lite's 16
// heads over 512 + 64 latent rows, 4 sequences so that the rows exceed the L2 cache); the
// cuBLASLt f16 GEMM's TFLOP/s at prefill sizes; and the per-op latency of the backend's current
// host-pointer path (an upload, the kernel and a download per op) at a decode-sized row. Weights
// and caches hold a constant byte pattern: the kernels' speed does not depend on the values.
// Exits 2 with the reason without a device.
//   cuda_ops_bench [--quick]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/backend/cuda/cuda_backend.h"
#include "lib/backend/cuda/cuda_plan.h"
#include "lib/backend/cuda_loader.h"
#include "lib/common/ggml_type.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

#define BENCH_CHECK(call)                                                           \
  do {                                                                              \
    const int rc_ = (call);                                                         \
    if (rc_ != KILN_CUDA_OK) {                                                      \
      char msg_[512];                                                               \
      m.last_error(msg_, sizeof msg_);                                              \
      std::fprintf(stderr, "cuda_ops_bench: %s failed: %d %s\n", #call, rc_, msg_); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::string why;
  const kiln::CudaModule* module = kiln::GetCudaModule(&why);
  if (module == nullptr) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device: %s\n", why.c_str());
    return 2;
  }
  const kiln::CudaModule& m = *module;
  char name[256] = {0};
  size_t total = 0;
  m.device_info(0, name, sizeof name, &total);
  std::printf("device 0: %s, %zu MiB\n", name, total >> 20);

  kiln_cuda_stream s = nullptr;
  BENCH_CHECK(m.stream_create(0, &s));
  const size_t bytes = (quick ? size_t{64} : size_t{512}) << 20;
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  void *host = nullptr, *a = nullptr, *b = nullptr, *y = nullptr, *w = nullptr;
  BENCH_CHECK(m.host_alloc(bytes, &host));
  BENCH_CHECK(m.device_alloc(0, bytes, &a));
  BENCH_CHECK(m.device_alloc(0, bytes, &b));
  BENCH_CHECK(m.device_alloc(0, bytes, &y));
  std::memset(host, 0, bytes);
  BENCH_CHECK(m.memset_async(a, 0, bytes, s));
  BENCH_CHECK(m.memset_async(b, 0, bytes, s));
  BENCH_CHECK(m.stream_synchronize(s));

  const int reps = quick ? 3 : 10;
  auto time_it = [&](auto&& body) -> double {
    body();  // warm-up
    m.stream_synchronize(s);
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) body();
    m.stream_synchronize(s);
    return Seconds(t0, Clock::now()) / reps;
  };
  auto report = [&](const char* what, double seconds, double moved_bytes) {
    std::printf("%-34s %9.3f ms  %8.1f GB/s\n", what, seconds * 1e3, moved_bytes / seconds / 1e9);
  };
  report("h2d copy (pinned)", time_it([&] { m.copy_h2d_async(a, host, bytes, s); }), bytes);
  report("d2h copy (pinned)", time_it([&] { m.copy_d2h_async(host, a, bytes, s); }), bytes);
  report("d2d copy", time_it([&] { m.copy_d2d_async(b, a, bytes, s); }), 2.0 * bytes);
  report("add (device)", time_it([&] {
           m.add(static_cast<float*>(a), static_cast<float*>(b), n, static_cast<float*>(y), s);
         }),
         3.0 * bytes);
  report("swiglu (device)", time_it([&] {
           m.swiglu(static_cast<float*>(a), static_cast<float*>(b), n, static_cast<float*>(y), s);
         }),
         3.0 * bytes);
  report("scale (device)", time_it([&] { m.scale(static_cast<float*>(y), n, 1.0f, s); }),
         2.0 * bytes);
  const int64_t row = 4096, rows = n / row;
  BENCH_CHECK(m.device_alloc(0, row * sizeof(float), &w));
  BENCH_CHECK(m.memset_async(w, 0, row * sizeof(float), s));
  report("rms_norm 4096-wide rows (device)", time_it([&] {
           m.rms_norm(static_cast<float*>(a), static_cast<float*>(w), rows, row, 1e-6f,
                      static_cast<float*>(y), s);
         }),
         2.0 * rows * row * sizeof(float));
  BENCH_CHECK(m.stream_synchronize(s));
  const double copy_gbs = 2.0 * bytes / time_it([&] { m.copy_d2d_async(b, a, bytes, s); }) / 1e9;
  // A kernel that moved `moved_bytes` in `seconds`, against the d2d copy's bandwidth.
  auto report_roofline = [&](const char* what, double seconds, double moved_bytes,
                             const std::string& extra = "") {
    const double gbs = moved_bytes / seconds / 1e9;
    std::printf("%-34s %9.3f ms  %8.1f GB/s  %3.0f%% of d2d copy%s\n", what, seconds * 1e3, gbs,
                100.0 * gbs / copy_gbs, extra.c_str());
  };

  // Device memory for the kernels below, freed at the end.
  std::vector<void*> buffers;
  auto alloc = [&](size_t n_bytes, int pattern) -> void* {
    void* p = nullptr;
    if (m.device_alloc(0, n_bytes, &p) != KILN_CUDA_OK) return nullptr;
    buffers.push_back(p);
    m.memset_async(p, pattern, n_bytes, s);
    return p;
  };
#define BENCH_ALLOC(var, n_bytes, pattern)                                             \
  void* var = alloc(n_bytes, pattern);                                                 \
  if (var == nullptr) {                                                                \
    std::fprintf(stderr, "cuda_ops_bench: allocation of %zu bytes failed\n", n_bytes); \
    return 1;                                                                          \
  }

  // Decode GEMV (one token) over an 8B-shape layer's matrices {n_out, n_in}: q, k, v, o, gate,
  // up, down; then the output head (128,256 x 4096). Byte pattern 0x11: f16 scales 0x1111.
  const int64_t layer[][2] = {{4096, 4096},  {1024, 4096},  {1024, 4096}, {4096, 4096},
                              {14336, 4096}, {14336, 4096}, {4096, 14336}};
  const int64_t head[2] = {128256, 4096};
  BENCH_ALLOC(gemv_x, size_t{14336} * 8 * sizeof(float), 0);
  BENCH_ALLOC(gemv_y, size_t{128256} * 8 * sizeof(float), 0);
  for (kiln::GgmlType type : {kiln::GgmlType::kQ4_K, kiln::GgmlType::kQ4_1, kiln::GgmlType::kQ8_0,
                              kiln::GgmlType::kF16}) {
    const auto info = kiln::GgmlTypeInfoOf(static_cast<uint32_t>(type));
    const std::string type_name(info->name);
    auto matrix_bytes = [&](const int64_t* shape) {
      return static_cast<size_t>(shape[0]) * kiln::GgmlRowBytes(*info, shape[1]);
    };
    std::vector<void*> w;
    size_t layer_bytes = 0;
    for (const auto& shape : layer) {
      BENCH_ALLOC(p, matrix_bytes(shape), 0x11);
      w.push_back(p);
      layer_bytes += matrix_bytes(shape);
    }
    BENCH_ALLOC(head_w, matrix_bytes(head), 0x11);
    for (int n_tokens : {1, 8}) {
      const double layer_s = time_it([&] {
        for (size_t i = 0; i < w.size(); ++i) {
          m.gemv(static_cast<uint32_t>(type), w[i], layer[i][0], layer[i][1],
                 static_cast<float*>(gemv_x), n_tokens, static_cast<float*>(gemv_y), s);
        }
      });
      const double head_s = time_it([&] {
        m.gemv(static_cast<uint32_t>(type), head_w, head[0], head[1], static_cast<float*>(gemv_x),
               n_tokens, static_cast<float*>(gemv_y), s);
      });
      char what[80];
      std::snprintf(what, sizeof what, "gemv 8B layer %s, %d token(s)", type_name.c_str(),
                    n_tokens);
      report_roofline(what, layer_s, static_cast<double>(layer_bytes));
      std::snprintf(what, sizeof what, "gemv 8B head %s, %d token(s)", type_name.c_str(), n_tokens);
      report_roofline(what, head_s, static_cast<double>(matrix_bytes(head)));
      if (n_tokens == 1) {
        // 32 layers and the head: the weights' part of one decode step.
        std::printf("%-34s %9.3f ms  (%.0f tok/s at the weights' read alone)\n",
                    "  8B decode step, weights", (32 * layer_s + head_s) * 1e3,
                    1.0 / (32 * layer_s + head_s));
      }
    }
    BENCH_CHECK(m.stream_synchronize(s));
    for (void* p : w) m.device_free(p);
    m.device_free(head_w);
    buffers.resize(buffers.size() - w.size() - 1);
  }

  // Paged attention decode at 32k context: block tables 0..n_blocks-1 per sequence.
  const int32_t kBlock = 16, kContext = 32768, kBlocksPerSeq = kContext / kBlock;
  auto attention_batch = [&](int32_t n_seqs, KilnCudaAttentionBatch* batch) -> bool {
    std::vector<int32_t> seq(n_seqs), indptr(n_seqs + 1), indices(n_seqs * kBlocksPerSeq),
        visible(n_seqs, kContext);
    for (int32_t i = 0; i < n_seqs; ++i) seq[i] = i;
    for (int32_t i = 0; i <= n_seqs; ++i) indptr[i] = i * kBlocksPerSeq;
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int32_t>(i);
    auto upload = [&](const std::vector<int32_t>& v) -> int32_t* {
      void* p = alloc(v.size() * sizeof(int32_t), 0);
      if (p != nullptr) m.copy_h2d_async(p, v.data(), v.size() * sizeof(int32_t), s);
      m.stream_synchronize(s);
      return static_cast<int32_t*>(p);
    };
    *batch = {n_seqs,  upload(seq), upload(indptr), upload(indices), upload(visible),
              nullptr, nullptr,     nullptr,        upload({0})};
    return batch->d_seq && batch->d_kv_indptr && batch->d_kv_indices && batch->d_n_visible &&
           batch->d_error;
  };
  {
    const int32_t n_heads = 32, n_kv = 8, dim = 128;
    const int64_t row = dim * 2, head_stride = kBlock * row, block_stride = n_kv * head_stride;
    const size_t pool = static_cast<size_t>(block_stride) * kBlocksPerSeq;
    BENCH_ALLOC(k, pool, 0x11);
    BENCH_ALLOC(v, pool, 0x11);
    const KilnCudaPagedKv kv = {.d_k_base = k,
                                .d_v_base = v,
                                .block_stride_bytes = block_stride,
                                .head_stride_bytes = head_stride,
                                .row_bytes = row,
                                .n_blocks = kBlocksPerSeq,
                                .block_size = kBlock,
                                .n_kv_heads = n_kv,
                                .head_dim = dim,
                                .elem_type = static_cast<uint32_t>(kiln::GgmlType::kF16),
                                .tail_start = 0,  // the whole row is f16
                                .tail_offset_bytes = 0};
    KilnCudaAttentionBatch batch;
    if (!attention_batch(1, &batch)) return 1;
    const int32_t splits = kiln::cuda::ChooseSplits(n_heads, kContext);
    const size_t ws = m.paged_attention_workspace(1, n_heads, splits, dim);
    BENCH_ALLOC(q, size_t{n_heads} * dim * sizeof(float), 0);
    BENCH_ALLOC(out, size_t{n_heads} * dim * sizeof(float), 0);
    BENCH_ALLOC(work, ws * sizeof(float), 0);
    auto run = [&] {
      return m.paged_attention(&kv, &batch, static_cast<float*>(q), n_heads, 0.0f, splits,
                               static_cast<float*>(work), ws, static_cast<float*>(out), s);
    };
    BENCH_CHECK(run());
    report_roofline("attention GQA 32k f16, 1 token", time_it(run), 2.0 * pool,
                    " (" + std::to_string(splits) + " splits)");
  }
  {
    const int32_t n_seqs = 4, n_heads = 16, rank = 512, rope = 64, nope = 128, v_dim = 128;
    const int64_t row = (rank + rope) * 2, block_stride = kBlock * row;
    const size_t pool = static_cast<size_t>(block_stride) * kBlocksPerSeq * n_seqs;
    BENCH_ALLOC(latent, pool, 0x11);
    const KilnCudaPagedKv kv = {.d_k_base = latent,
                                .d_v_base = latent,
                                .block_stride_bytes = block_stride,
                                .head_stride_bytes = block_stride,
                                .row_bytes = row,
                                .n_blocks = kBlocksPerSeq * n_seqs,
                                .block_size = kBlock,
                                .n_kv_heads = 1,
                                .head_dim = rank + rope,
                                .elem_type = static_cast<uint32_t>(kiln::GgmlType::kF16),
                                .tail_start = 0,  // the whole row is f16
                                .tail_offset_bytes = 0};
    KilnCudaAttentionBatch batch;
    if (!attention_batch(n_seqs, &batch)) return 1;
    const int32_t splits = kiln::cuda::ChooseSplits(int64_t{n_seqs} * n_heads, kContext);
    const size_t ws = m.mla_attention_workspace(n_seqs, n_heads, splits, rank + rope);
    BENCH_ALLOC(q, size_t{n_seqs} * n_heads * (nope + rope) * sizeof(float), 0);
    BENCH_ALLOC(w_uk, size_t{n_heads} * nope * rank * sizeof(float), 0);
    BENCH_ALLOC(w_uv, size_t{n_heads} * v_dim * rank * sizeof(float), 0);
    BENCH_ALLOC(out, size_t{n_seqs} * n_heads * v_dim * sizeof(float), 0);
    BENCH_ALLOC(work, ws * sizeof(float), 0);
    auto run = [&] {
      return m.mla_attention(&kv, &batch, static_cast<float*>(q), n_heads,
                             static_cast<float*>(w_uk), static_cast<float*>(w_uv), rank, nope,
                             v_dim, 0.0f, splits, static_cast<float*>(work), ws,
                             static_cast<float*>(out), s);
    };
    BENCH_CHECK(run());
    report_roofline("attention MLA 32k f16, 4 seqs", time_it(run), static_cast<double>(pool),
                    " (" + std::to_string(splits) + " splits)");
  }

  // The cuBLASLt GEMM at prefill sizes (f16 weights, f32 activations converted by the context).
  {
    KilnCudaGemmContext* gemm = nullptr;
    BENCH_CHECK(m.gemm_context_create(0, size_t{32} << 20, &gemm));
    const int64_t n_out = 14336, n_in = 4096;
    BENCH_ALLOC(w16, size_t{n_out} * n_in * 2, 0x11);
    BENCH_ALLOC(gx, size_t{4096} * n_in * sizeof(float), 0);
    BENCH_ALLOC(gy, size_t{4096} * n_out * sizeof(float), 0);
    for (int64_t n_tokens : {512, 4096}) {
      const double t = time_it([&] {
        m.gemm_f16(gemm, w16, n_out, n_in, static_cast<float*>(gx), n_tokens,
                   static_cast<float*>(gy), s);
      });
      char what[80];
      std::snprintf(what, sizeof what, "gemm f16 14336x4096, %lld tokens",
                    static_cast<long long>(n_tokens));
      std::printf("%-34s %9.3f ms  %8.1f TFLOP/s\n", what, t * 1e3,
                  2.0 * n_tokens * n_in * n_out / t / 1e12);
    }
    m.gemm_context_destroy(gemm);
  }
  BENCH_CHECK(m.stream_synchronize(s));
#undef BENCH_ALLOC

  // The backend's host-pointer path: what one decode-sized op costs today.
  auto backend = kiln::cuda::CudaBackend::Create(m, 0, 1);
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_ops_bench: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  std::vector<float> x(576, 1.0f), g(576, 1.0f), out(576);
  const int op_reps = quick ? 200 : 2000;
  const auto t0 = Clock::now();
  for (int r = 0; r < op_reps; ++r)
    (*backend)->RmsNorm(x.data(), g.data(), 1, 576, 1e-6f, out.data());
  const double per_op = Seconds(t0, Clock::now()) / op_reps;
  if (!(*backend)->TakeDeferredError().ok()) return 1;
  std::printf("%-34s %9.1f us per op (upload + kernel + download)\n", "backend RmsNorm [1, 576]",
              per_op * 1e6);

  for (void* p : buffers) m.device_free(p);
  m.device_free(a);
  m.device_free(b);
  m.device_free(y);
  m.device_free(w);
  m.host_free(host);
  m.stream_destroy(s);
  return 0;
}
