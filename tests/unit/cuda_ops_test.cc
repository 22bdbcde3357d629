// CUDA ops against the CPU reference. Skips (with the reason) only when no device is usable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/cuda_loader.h"
#include "lib/common/half.h"
#include "tests/common/cuda_test_util.h"

namespace kiln {
namespace {

using testing::BuiltModule;
using ::testing::HasSubstr;
using testing::LastError;

TEST(CudaLoader, FallsBackCleanlyWithoutDevice) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) {
    EXPECT_FALSE(why.empty());
  } else {
    EXPECT_GT(m->n_devices, 0);
  }
}

// A module of the current ABI missing entry points is rejected, naming each missing one (here
// all but the two the stand-in exports, the matmul capabilities of ABI 4 among them).
TEST(CudaLoader, NamesEveryMissingEntryPoint) {
  const absl::StatusOr<CudaModule> m =
      OpenCudaModule(testing::ModulePath("KILN_CUDA_PARTIAL_MODULE", KILN_CUDA_PARTIAL_MODULE));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(m.status().message());
  EXPECT_THAT(message, HasSubstr("libkiln_cuda.so lacks entry points: kiln_cuda_last_error, "
                                 "kiln_cuda_device_info, kiln_cuda_mem_info, "));
  EXPECT_THAT(message, HasSubstr(", kiln_cuda_matmul_caps, kiln_cuda_gemv, "));
  EXPECT_THAT(message, HasSubstr(", kiln_cuda_sample"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("kiln_cuda_device_count")));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("kiln_cuda_module_abi")));
}

TEST(CudaOps, DequantizeQ8_0MatchesCpu) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  const int64_t rows = 3, cols = 64;
  std::vector<uint8_t> blocks(rows * cols / 32 * 34);
  std::mt19937 rng(1);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  std::vector<float> expected(rows * cols), got(rows * cols);
  for (int64_t blk = 0; blk < rows * cols / 32; ++blk) {
    const uint8_t* p = blocks.data() + blk * 34;
    const uint16_t d_bits = static_cast<uint16_t>(p[0] | (p[1] << 8)) & 0x3BFF;  // finite, < 1
    blocks[blk * 34] = d_bits & 0xFF;
    blocks[blk * 34 + 1] = d_bits >> 8;
    for (int j = 0; j < 32; ++j) {
      expected[blk * 32 + j] = Fp16ToFp32(d_bits) * static_cast<int8_t>(p[2 + j]);
    }
  }
  ASSERT_EQ(m->dequantize(8, blocks.data(), blocks.size(), rows, cols, got.data()), 0);
  EXPECT_EQ(got, expected);
}

// Runs on every machine with the module built: the bad calls return a status and a message that
// names the call and the cause, with or without a device, and nothing aborts.
TEST(CudaModuleAbi, BadCallsReturnStatusAndMessage) {
  std::string why;
  std::optional<CudaModule> m = BuiltModule(&why);
#ifdef KILN_CUDA_TEST_MODULE
  ASSERT_TRUE(m.has_value()) << why;
#else
  if (!m) GTEST_SKIP() << why;
#endif
  EXPECT_EQ(m->device_alloc(0, 1024, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_device_alloc: null out"));
  EXPECT_EQ(m->stream_synchronize(nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_stream_synchronize: null stream"));
  float host[4] = {0};
  EXPECT_EQ(m->copy_h2d_async(nullptr, host, sizeof host, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_copy_h2d_async: null destination"));
  EXPECT_EQ(m->copy_d2h_async(host, host, sizeof host, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("null stream"));
  EXPECT_EQ(m->mem_info(0, nullptr, nullptr), KILN_CUDA_INVALID_ARGUMENT);
  // Zero-byte requests and null frees are no-ops, not errors.
  void* p = host;
  EXPECT_EQ(m->device_alloc(0, 0, &p), KILN_CUDA_OK);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(m->device_free(nullptr), KILN_CUDA_OK);
  EXPECT_EQ(m->stream_destroy(nullptr), KILN_CUDA_OK);
  // A dequantize of a type without a kernel, and of a too-short source.
  float out[32];
  uint8_t src[34] = {0};
  EXPECT_EQ(m->dequantize(12, src, sizeof src, 1, 32, out), KILN_CUDA_UNSUPPORTED);
  EXPECT_THAT(LastError(*m), HasSubstr("ggml type 12 has no kernel"));
  EXPECT_EQ(m->dequantize(8, src, 10, 1, 32, out), KILN_CUDA_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(*m), HasSubstr("needs 34"));
  // The status the library makes of it.
  const absl::Status s = m->ToStatus(KILN_CUDA_INVALID_ARGUMENT, "upload");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("upload: kiln_cuda_dequantize"));
  EXPECT_TRUE(m->ToStatus(KILN_CUDA_OK, "x").ok());
  EXPECT_EQ(CudaStatusCode(KILN_CUDA_OUT_OF_MEMORY), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatusCode(KILN_CUDA_UNSUPPORTED), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CudaStatusCode(KILN_CUDA_DEVICE_ERROR), absl::StatusCode::kInternal);
}

// An allocation or stream on a device that does not exist (device 0 without a device, else the
// first index past the last) fails with a CUDA runtime message instead of aborting.
TEST(CudaModuleAbi, AllocationOnAMissingDeviceFailsWithMessage) {
  std::string why;
  std::optional<CudaModule> m = BuiltModule(&why);
  if (!m) GTEST_SKIP() << why;
  const CudaModule* with_device = GetCudaModule(&why);
  const int missing = with_device != nullptr ? with_device->n_devices : 0;
  void* p = nullptr;
  const int rc = m->device_alloc(missing, 1 << 20, &p);
  EXPECT_NE(rc, KILN_CUDA_OK);
  EXPECT_EQ(p, nullptr);
  EXPECT_THAT(LastError(*m), HasSubstr("kiln_cuda_device_alloc"));
  kiln_cuda_stream stream = nullptr;
  EXPECT_NE(m->stream_create(missing, &stream), KILN_CUDA_OK);
  EXPECT_EQ(stream, nullptr);
}

// Host -> device, memset, device -> device, device -> host on one stream: the bytes come back.
TEST(CudaMemory, CopiesAndMemsetRoundTrip) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr size_t kN = 1000;  // not a multiple of any vector width
  std::vector<float> src(kN), back(kN, -1.0f);
  for (size_t i = 0; i < kN; ++i) src[i] = 0.5f * float(i) - 7.0f;
  kiln_cuda_stream stream = nullptr;
  ASSERT_EQ(m->stream_create(0, &stream), KILN_CUDA_OK) << LastError(*m);
  void *a = nullptr, *b = nullptr, *pinned = nullptr;
  ASSERT_EQ(m->device_alloc(0, kN * sizeof(float), &a), KILN_CUDA_OK) << LastError(*m);
  ASSERT_EQ(m->device_alloc(0, kN * sizeof(float), &b), KILN_CUDA_OK) << LastError(*m);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  ASSERT_EQ(m->host_alloc(kN * sizeof(float), &pinned), KILN_CUDA_OK) << LastError(*m);
  EXPECT_EQ(m->copy_h2d_async(a, src.data(), kN * sizeof(float), stream), KILN_CUDA_OK);
  // Zeroes elements [10, 20) of a: all-zero bytes are 0.0f.
  EXPECT_EQ(m->memset_async(static_cast<float*>(a) + 10, 0, 10 * sizeof(float), stream),
            KILN_CUDA_OK);
  EXPECT_EQ(m->copy_d2d_async(b, a, kN * sizeof(float), stream), KILN_CUDA_OK);
  EXPECT_EQ(m->copy_d2h_async(pinned, b, kN * sizeof(float), stream), KILN_CUDA_OK);
  ASSERT_EQ(m->stream_synchronize(stream), KILN_CUDA_OK) << LastError(*m);
  std::memcpy(back.data(), pinned, kN * sizeof(float));
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(back[i], i >= 10 && i < 20 ? 0.0f : src[i]) << "element " << i;
  }
  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(m->mem_info(0, &free_bytes, &total_bytes), KILN_CUDA_OK);
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  EXPECT_EQ(m->device_free(a), KILN_CUDA_OK);
  EXPECT_EQ(m->device_free(b), KILN_CUDA_OK);
  EXPECT_EQ(m->host_free(pinned), KILN_CUDA_OK);
  EXPECT_EQ(m->stream_destroy(stream), KILN_CUDA_OK);
}

// An allocation larger than any device: OUT_OF_MEMORY (ResourceExhausted), and the module
// keeps working afterwards (the error is not sticky).
TEST(CudaMemory, OversizedAllocationIsOutOfMemory) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  void* p = nullptr;
  const int rc = m->device_alloc(0, size_t{1} << 50, &p);
  EXPECT_EQ(rc, KILN_CUDA_OUT_OF_MEMORY) << LastError(*m);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(m->ToStatus(rc, "weights").code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(m->device_alloc(0, 4096, &p), KILN_CUDA_OK) << LastError(*m);
  EXPECT_EQ(m->device_free(p), KILN_CUDA_OK);
}

}  // namespace
}  // namespace kiln
