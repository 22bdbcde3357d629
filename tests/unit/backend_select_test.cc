// Backend selection: the pure decision for every fallback reason, and the real path on this
// machine (an engine asked for CUDA always gets a working backend and says which, and why).
#include "lib/backend/backend_select.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lib/backend/cuda/cuda_backend.h"
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
  p.incomplete_ops = {"Attention over K/V rows of 1024 elements", "MlaAttention"};
  d = DecideBackend(BackendKind::kCuda, p, 1 << 20);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_THAT(d.fallback_reason,
              HasSubstr("cannot run this model's Attention over K/V rows of 1024 elements; "
                        "MlaAttention"));

  p.incomplete_ops.clear();
  p.device_free_bytes = size_t{3} << 30;  // 3 GiB free; 3 GiB needed + headroom
  d = DecideBackend(BackendKind::kCuda, p, size_t{3} << 30);
  EXPECT_FALSE(d.use_cuda);
  EXPECT_THAT(d.fallback_reason, HasSubstr("device 1 has 3072 MiB free, the model needs 3584 MiB"));

  d = DecideBackend(BackendKind::kCuda, p, size_t{2} << 30);  // 2.5 GiB with headroom: fits
  EXPECT_TRUE(d.use_cuda);
  EXPECT_EQ(d.fallback_reason, "");
}

// The CUDA backend runs every op the default model's shape (llama, GQA) and DeepSeek-V2's (MLA,
// 512 + 64 latent rows) need, in each cache type; only a K/V row longer than the kernels read
// is named.
TEST(CudaIncompleteOps, NoneForLlamaOrDeepseek2) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kF32, GgmlType::kBF16}) {
    auto llama = KvLayout::Gqa(30, 3, 64, type, 16);  // SmolLM2-135M
    auto llama8b = KvLayout::Gqa(32, 8, 128, type, 16);
    auto deepseek2 = KvLayout::Mla(27, 512, 64, type, 16);
    ASSERT_TRUE(llama.ok() && llama8b.ok() && deepseek2.ok());
    EXPECT_THAT(cuda::CudaBackend::IncompleteOps(*llama), ::testing::IsEmpty());
    EXPECT_THAT(cuda::CudaBackend::IncompleteOps(*llama8b), ::testing::IsEmpty());
    EXPECT_THAT(cuda::CudaBackend::IncompleteOps(*deepseek2), ::testing::IsEmpty());
  }
  auto wide = KvLayout::Gqa(2, 1, 1024, GgmlType::kF16, 16);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_THAT(cuda::CudaBackend::IncompleteOps(*wide),
              ::testing::ElementsAre("Attention over K/V rows of 1024 elements (the device "
                                     "kernels read 640 at most)"));
  // The probe carries them: without a device the module's absence is the reason, else none.
  const CudaProbe probe = ProbeCuda(0, *wide);
  EXPECT_EQ(probe.incomplete_ops.size(), 1u);
}

// On this machine's real probe, for llama and deepseek2: without a device a CUDA request runs on
// the CPU and the engine says why (never a missing op); with one it runs on the device. Either
// way the engine computes.
TEST(EngineBackend, CudaRequestRunsOrFallsBackWithReason) {
  for (const char* shape : {"tiny-llama-gqa", "tiny-deepseek2"}) {
    SCOPED_TRACE(shape);
    std::unique_ptr<Model> model =
        testing::LoadRandomModel(shape, "q8_0", 5, StrCat("backend-select-", shape, ".gguf"));
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
    EXPECT_THAT((*engine)->BackendDescription(), ::testing::Not(HasSubstr("cannot run")));
    std::string why;
    if (GetCudaModule(&why) == nullptr) {
      EXPECT_THAT((*engine)->BackendDescription(), StartsWith("cpu ("));
      EXPECT_THAT((*engine)->BackendDescription(),
                  HasSubstr(StrCat("; cuda requested, running on the CPU: ", why)));
    } else {
      EXPECT_THAT((*engine)->BackendDescription(), StartsWith("cuda ("));
    }
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
}

}  // namespace
}  // namespace kiln
