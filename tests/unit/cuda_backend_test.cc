// The CUDA backend's device ops against the CPU backend on the same inputs. Every test here
// needs a device and skips (with the reason) without one; cuda_ops_test covers what runs
// without a device.
//
// Bounds (stated per test): the copies, Add, AddRowBias, Scale, the RoPE rotation (the same
// table, the same FMAs), GeGLU (the same f16 table) and the gathers of F32/F16/BF16/Q8_0/Q4_0
// are bit for bit the CPU's; Q4_1's gather too (d * q + m with the product rounded on its own,
// as the CPU); RMSNorm's float reduction runs in another order (1e-5 relative, or absolute below
// 1); SwiGLU's expf may differ from the host's vector exp by an ulp or two (1e-6 the same way).
#include "lib/backend/cuda/cuda_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cuda_loader.h"
#include "lib/common/half.h"
#include "lib/kv/kv_cache.h"

namespace kiln {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    module_ = GetCudaModule(&why);
    if (module_ == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
    auto b = cuda::CudaBackend::Create(*module_, 0, 1);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }

  std::vector<float> Random(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }

  const CudaModule* module_ = nullptr;
  std::unique_ptr<cuda::CudaBackend> gpu_;
  cpu::CpuBackend cpu_{1};
};

// Sizes that are not multiples of a block (256) or a warp, plus more rows than one grid pass.
TEST_F(CudaBackendTest, RmsNormMatchesCpu) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {3, 576}, {5, 1000}, {70000, 7}}) {
    const auto x = Random(rows * n, -3, 3, 1), w = Random(n, 0.5f, 1.5f, 2);
    std::vector<float> want(rows * n), got(rows * n);
    cpu_.RmsNorm(x.data(), w.data(), rows, n, 1e-6f, want.data());
    gpu_->RmsNorm(x.data(), w.data(), rows, n, 1e-6f, got.data());
    ASSERT_TRUE(gpu_->TakeDeferredError().ok());
    for (int64_t i = 0; i < rows * n; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::fabs(want[i])))
          << "rows " << rows << " n " << n << " element " << i;
    }
  }
}

TEST_F(CudaBackendTest, AddScaleRowBiasMatchCpuExactly) {
  const int64_t rows = 7, n = 1001;
  const auto a = Random(rows * n, -5, 5, 3), b = Random(rows * n, -5, 5, 4),
             bias = Random(n, -1, 1, 5);
  std::vector<float> want(rows * n), got(rows * n);
  cpu_.Add(a.data(), b.data(), rows * n, want.data());
  gpu_->Add(a.data(), b.data(), rows * n, got.data());
  EXPECT_EQ(got, want);
  cpu_.AddRowBias(want.data(), bias.data(), rows, n);
  gpu_->AddRowBias(got.data(), bias.data(), rows, n);
  EXPECT_EQ(got, want);
  cpu_.Scale(want.data(), rows * n, 0.37f);
  gpu_->Scale(got.data(), rows * n, 0.37f);
  EXPECT_EQ(got, want);
  // Aliased output (y = a + y).
  std::vector<float> want_alias = b, got_alias = b;
  cpu_.Add(a.data(), want_alias.data(), rows * n, want_alias.data());
  gpu_->Add(a.data(), got_alias.data(), rows * n, got_alias.data());
  EXPECT_EQ(got_alias, want_alias);
  EXPECT_TRUE(gpu_->TakeDeferredError().ok());
}

TEST_F(CudaBackendTest, SwiGluAndGeGluMatchCpu) {
  const int64_t n = 4099;
  // GeGLU's thresholds at +-10 are inside the range.
  const auto gate = Random(n, -12, 12, 6), up = Random(n, -2, 2, 7);
  std::vector<float> want(n), got(n);
  cpu_.SwiGlu(gate.data(), up.data(), n, want.data());
  gpu_->SwiGlu(gate.data(), up.data(), n, got.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << i;
  }
  cpu_.GeGlu(gate.data(), up.data(), n, want.data());
  gpu_->GeGlu(gate.data(), up.data(), n, got.data());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(gpu_->TakeDeferredError().ok());
}

TEST_F(CudaBackendTest, RopeMatchesCpuInBothModes) {
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    RopeConfig config;
    config.mode = mode;
    config.n_rot = 48;  // partial rotation: dims 48..63 untouched
    const int32_t head_dim = 64, n_heads = 3;
    const std::vector<int32_t> positions = {0, 1, 17, 4095, 5};
    const auto x = Random(positions.size() * n_heads * head_dim, -2, 2, 8);
    std::vector<float> want = x, got = x;
    ASSERT_TRUE(cpu_.PrepareRope(config, head_dim, positions).ok());
    ASSERT_TRUE(gpu_->PrepareRope(config, head_dim, positions).ok());
    cpu_.RotateRope(want.data(), n_heads);
    gpu_->RotateRope(got.data(), n_heads);
    EXPECT_EQ(got, want) << (mode == RopeMode::kNeox ? "neox" : "norm");
  }
  EXPECT_TRUE(gpu_->TakeDeferredError().ok());
  RopeConfig bad;
  bad.n_rot = 3;
  EXPECT_EQ(gpu_->PrepareRope(bad, 64, std::vector<int32_t>{0}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A table of each device-gathered type, uploaded by PrepareWeights, gathered on both backends.
TEST_F(CudaBackendTest, EmbeddingGatherMatchesCpu) {
  const int64_t n_in = 64, n_vocab = 300;
  std::mt19937 rng(9);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0,
                        GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    WeightView w;
    w.type = type;
    w.n_in = n_in;
    w.n_out = n_vocab;
    std::vector<uint8_t> bytes(w.row_bytes() * n_vocab);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    // Scales (the leading f16 of every 32-element block) finite and small; f16/bf16 elements
    // finite; f32 elements finite.
    if (type == GgmlType::kF32) {
      auto f = Random(n_in * n_vocab, -1, 1, 10);
      std::memcpy(bytes.data(), f.data(), bytes.size());
    } else if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
      for (size_t i = 0; i + 1 < bytes.size(); i += 2) bytes[i + 1] &= 0x3B;
    } else {
      const size_t block = type == GgmlType::kQ4_0 ? 18 : type == GgmlType::kQ4_1 ? 20 : 34;
      for (size_t i = 0; i < bytes.size(); i += block) {
        bytes[i + 1] &= 0x3B;
        if (type == GgmlType::kQ4_1) bytes[i + 3] &= 0x3B;
      }
    }
    w.data = bytes.data();
    WeightView* list[] = {&w};
    auto store = gpu_->PrepareWeights(list, false);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_NE(w.device_data, nullptr);
    EXPECT_EQ((*store)->bytes(), bytes.size());
    const std::vector<int32_t> tokens = {0, 299, 5, 5, 123};
    std::vector<float> want(tokens.size() * n_in), got(tokens.size() * n_in, -7.0f);
    WeightView host = w;
    host.device_data = nullptr;
    ASSERT_TRUE(cpu_.EmbeddingGather(host, tokens, want.data()).ok());
    ASSERT_TRUE(gpu_->EmbeddingGather(w, tokens, got.data()).ok());
    EXPECT_EQ(got, want) << "type " << static_cast<int>(type);
    const std::vector<int32_t> bad = {1, 300};
    const absl::Status s = gpu_->EmbeddingGather(w, bad, got.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(s.message(), ::testing::HasSubstr("tokens[1] = 300 is outside the vocabulary"));
  }
}

// K/V rows written through the device cache read back as the CPU cache holds them; CopyKvSlot
// and a copy-on-write block copy move them on the device.
TEST_F(CudaBackendTest, KvRowsInDeviceMemoryMatchCpuCache) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    auto layout = KvLayout::Gqa(2, 2, 64, type, 16);
    ASSERT_TRUE(layout.ok()) << layout.status();
    KvCacheOptions cpu_opts, gpu_opts;
    cpu_opts.num_blocks = gpu_opts.num_blocks = 4;
    gpu_opts.storage = [&](const KvLayout& l, int32_t n) { return gpu_->NewKvStorage(l, n); };
    auto cpu_cache = KvCache::Create(*layout, cpu_opts);
    auto gpu_cache = KvCache::Create(*layout, gpu_opts);
    ASSERT_TRUE(cpu_cache.ok() && gpu_cache.ok());
    EXPECT_TRUE((*cpu_cache)->host_addressable());
    EXPECT_FALSE((*gpu_cache)->host_addressable());
    const std::vector<KvSlot> slots = {{1, 0}, {1, 15}, {2, 3}};
    const auto k = Random(slots.size() * 2 * 64, -4, 4, 11),
               v = Random(slots.size() * 2 * 64, -4, 4, 12);
    ASSERT_TRUE(cpu_.WriteKv(**cpu_cache, 1, slots, k.data(), v.data()).ok());
    ASSERT_TRUE(gpu_->WriteKv(**gpu_cache, 1, slots, k.data(), v.data()).ok());
    cpu_.CopyKvSlot(**cpu_cache, slots[0], KvSlot{3, 7});
    gpu_->CopyKvSlot(**gpu_cache, slots[0], KvSlot{3, 7});
    ASSERT_TRUE(gpu_->TakeDeferredError().ok());
    const size_t row = layout->row_bytes();
    for (KvSlot s : {slots[0], slots[1], slots[2], KvSlot{3, 7}}) {
      for (int32_t h = 0; h < 2; ++h) {
        std::vector<std::byte> got(row);
        kiln_cuda_stream stream = nullptr;
        ASSERT_EQ(module_->stream_create(0, &stream), KILN_CUDA_OK);
        ASSERT_EQ(module_->copy_d2h_async(got.data(), (*gpu_cache)->KeyRow(s, 1, h), row, stream),
                  KILN_CUDA_OK);
        ASSERT_EQ(module_->stream_synchronize(stream), KILN_CUDA_OK);
        module_->stream_destroy(stream);
        EXPECT_EQ(std::memcmp(got.data(), (*cpu_cache)->KeyRow(s, 1, h), row), 0)
            << "type " << static_cast<int>(type) << " block " << s.block << " offset " << s.offset
            << " head " << h;
      }
    }
    EXPECT_EQ(gpu_->WriteKv(**gpu_cache, 2, slots, k.data(), v.data()).code(),
              absl::StatusCode::kInvalidArgument);
    const std::vector<KvSlot> outside = {{9, 0}};
    EXPECT_EQ(gpu_->WriteKv(**gpu_cache, 0, outside, k.data(), v.data()).code(),
              absl::StatusCode::kOutOfRange);
  }
}

// The ops without a device kernel say so; the matmuls run (on the CPU) and match it exactly.
TEST_F(CudaBackendTest, MissingOpsAreUnimplementedAndMatMulFallsBack) {
  auto layout = KvLayout::Gqa(1, 1, 64, GgmlType::kF32, 16);
  ASSERT_TRUE(layout.ok());
  KvCacheOptions opts;
  opts.num_blocks = 2;
  opts.storage = [&](const KvLayout& l, int32_t n) { return gpu_->NewKvStorage(l, n); };
  auto cache = KvCache::Create(*layout, opts);
  ASSERT_TRUE(cache.ok());
  AttentionMask mask;
  std::vector<float> q(64), out(64);
  const absl::Status s = gpu_->Attention(**cache, 0, mask, q.data(), 1, out.data(), 0.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("Attention has no device kernel"));
  const auto wdata = Random(32 * 64, -1, 1, 13), x = Random(3 * 64, -1, 1, 14);
  WeightView w{GgmlType::kF32, wdata.data(), 64, 32};
  std::vector<float> want(3 * 32), got(3 * 32);
  ASSERT_TRUE(cpu_.MatMul(w, x.data(), 3, want.data()).ok());
  ASSERT_TRUE(gpu_->MatMul(w, x.data(), 3, got.data()).ok());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace kiln
