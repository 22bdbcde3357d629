// Backend selection: the pure decision for every fallback reason, and the real path on this
// machine (an engine asked for CUDA always gets a working backend and says which, and why).
#include "lib/backend/backend_select.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lib/engine/engine.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(DecideBackend, CpuRequestNeverProbes) {
  const BackendDecision d = DecideBackend(BackendKind::kCpu, CudaProbe{}, 0);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_EQ(d.fallback_reason, "");
}

TEST(DecideBackend, EachFallbackNamesItsReason) {
  CudaProbe none;
  none.why_not = "libkiln_cuda.so not built or not found";
  BackendDecision d = DecideBackend(BackendKind::kCuda, none, 0);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_EQ(d.fallback_reason,
            "cuda requested, running on the CPU: libkiln_cuda.so not built or not found");

  CudaModule two_devices;
  two_devices.n_devices = 2;
  CudaProbe p;
  p.module = &two_devices;
  p.device = 2;
  p.device_free_bytes = size_t{1} << 40;
  d = DecideBackend(BackendKind::kAuto, p, 1 << 20);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_THAT(d.fallback_reason, HasSubstr("cuda_device 2 does not exist (2 devices)"));

  p.device = 1;
  p.incomplete_ops = {"Attention", "MlaAttention"};
  d = DecideBackend(BackendKind::kCuda, p, 1 << 20);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_THAT(d.fallback_reason, HasSubstr("no device kernels yet for Attention, MlaAttention"));

  p.incomplete_ops.clear();
  p.device_free_bytes = size_t{3} << 30;  // 3 GiB free; 3 GiB needed + headroom
  d = DecideBackend(BackendKind::kCuda, p, size_t{3} << 30);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_THAT(d.fallback_reason, HasSubstr("device 1 has 3072 MiB free, the model needs 3584 MiB"));

  d = DecideBackend(BackendKind::kCuda, p, size_t{2} << 30);  // 2.5 GiB with headroom: fits
  EXPECT_TRUE(d.use_cuda);
  EXPECT_EQ(d.fallback_reason, "");
}

// On this machine's real probe: without a device (or with one, while the CUDA backend still
// lacks attention kernels) a CUDA request runs on the CPU, and the engine says why.
TEST(EngineBackend, CudaRequestFallsBackToCpuWithReason) {
  std::unique_ptr<Model> model =
      testing::LoadRandomModel("tiny-llama-gqa", "q8_0", 5, "backend-select-tiny.gguf");
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.n_threads = 1;
  options.n_ctx = 64;
  auto cpu = Engine::Create(*model, options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_THAT((*cpu)->BackendDescription(), StartsWith("cpu ("));
  EXPECT_THAT((*cpu)->BackendDescription(), ::testing::Not(HasSubstr("cuda")));

  options.backend = BackendKind::kCuda;
  auto engine = Engine::Create(*model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_THAT((*engine)->BackendDescription(), StartsWith("cpu ("));
  EXPECT_THAT((*engine)->BackendDescription(), HasSubstr("; cuda requested, running on the CPU: "));
  std::string why;
  if (GetCudaModule(&why) == nullptr) {
    EXPECT_THAT((*engine)->BackendDescription(), HasSubstr(why));
  }
  // The fallback engine computes: a prefill returns logits.
  int32_t n_done = 0;
  bool got_logits = false;
  PrefillRequest request;
  const std::vector<int32_t> tokens = {1, 2, 3};
  request.seq =
      (*engine)->Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  request.tokens = tokens;
  request.on_logits = [&](int32_t, const float*) { got_logits = true; };
  ASSERT_TRUE((*engine)->Prefill(request, &n_done).ok());
  EXPECT_EQ(n_done, 3);
  EXPECT_TRUE(got_logits);
}

}  // namespace
}  // namespace kiln
