// Device benchmarks of the CUDA module's memory and elementwise ops (scripts/cuda_check.sh runs
// it): copy bandwidth (pinned), the elementwise kernels' achieved bandwidth on device-resident
// buffers, and the per-op latency of the backend's current host-pointer path (an upload, the
// kernel and a download per op) at a decode-sized row. Exits 2 with the reason without a device.
//   cuda_ops_bench [--quick]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/backend/cuda/cuda_backend.h"
#include "lib/backend/cuda_loader.h"

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

  m.device_free(a);
  m.device_free(b);
  m.device_free(y);
  m.device_free(w);
  m.host_free(host);
  m.stream_destroy(s);
  return 0;
}
