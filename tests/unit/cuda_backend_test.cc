// The CUDA backend's device ops against the CPU backend on the same inputs. Every test here
// needs a device and skips (with the reason) without one; cuda_ops_test, cuda_kernels_test (the
// module's argument checks, the host-side plan) and backend_select_test cover what runs without
// a device. The matmul and attention bounds are stated at their tests.
//
// Bounds (stated per test): the copies, Add, AddRowBias, Scale, the RoPE rotation (the same
// table, the same FMAs), GeGLU (the same f16 table) and the gathers of F32/F16/BF16/Q8_0/Q4_0
// are bit for bit the CPU's; Q4_1's gather too (d * q + m with the product rounded on its own,
// as the CPU); RMSNorm's float reduction runs in another order (1e-5 relative, or absolute below
// 1); SwiGLU's expf may differ from the host's vector exp by an ulp or two (1e-6 the same way).
#include "lib/backend/cuda/cuda_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/attention_mask.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cuda_loader.h"
#include "lib/backend/mla_attention.h"
#include "lib/common/half.h"
#include "lib/kv/kv_cache.h"
#include "tests/common/cpu_test_util.h"

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

// Every matmul path against the CPU on the same f16 weight: GEMV (1 and 8 tokens), the
// cuBLASLt GEMM (9 and 40 tokens), a row range on each (its columns only, the others untouched),
// an expert's rows; a Q4_0 weight (no device kernel) runs on the CPU, bit for bit. Bound:
// 2e-2 x sum |w x| per output (the GEMM rounds x to f16; the CPU's own f16 path rounds too).
TEST_F(CudaBackendTest, MatMulPathsMatchCpu) {
  const int64_t n_out = 64, n_in = 256;
  const auto wf = Random(n_out * n_in, -1, 1, 20);
  std::vector<uint16_t> wh(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wh[i] = Fp32ToFp16(wf[i]);
  WeightView w{GgmlType::kF16, wh.data(), n_in, n_out};
  WeightView host = w;
  WeightView* list[] = {&w};
  auto store = gpu_->PrepareWeights(list, false);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int64_t n_tokens : {1, 8, 9, 40}) {
    SCOPED_TRACE(::testing::Message() << n_tokens << " tokens");
    const auto x = Random(n_tokens * n_in, -1, 1, 21 + static_cast<uint32_t>(n_tokens));
    std::vector<float> want(n_tokens * n_out), got(n_tokens * n_out);
    ASSERT_TRUE(cpu_.MatMul(host, x.data(), n_tokens, want.data()).ok());
    ASSERT_TRUE(gpu_->MatMul(w, x.data(), n_tokens, got.data()).ok());
    auto bound = [&](int64_t t, int64_t o) {
      float m = 0;
      for (int64_t i = 0; i < n_in; ++i)
        m += std::fabs(Fp16ToFp32(wh[o * n_in + i]) * x[t * n_in + i]);
      return 2e-2f * m;
    };
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        ASSERT_NEAR(got[t * n_out + o], want[t * n_out + o], bound(t, o)) << t << " " << o;
      }
    }
    std::vector<float> range(n_tokens * n_out, -7.0f);
    ASSERT_TRUE(gpu_->MatMulRange(w, x.data(), n_tokens, 32, 64, range.data()).ok());
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        if (o < 32) {
          ASSERT_EQ(range[t * n_out + o], -7.0f);
        } else {
          ASSERT_NEAR(range[t * n_out + o], want[t * n_out + o], bound(t, o)) << t << " " << o;
        }
      }
    }
    std::vector<float> expert(n_tokens * n_out / 2);
    ASSERT_TRUE(gpu_->ExpertMatMul(w, 2, 1, x.data(), n_tokens, expert.data()).ok());
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t o = 0; o < n_out / 2; ++o) {
        ASSERT_NEAR(expert[t * n_out / 2 + o], want[t * n_out + n_out / 2 + o],
                    bound(t, n_out / 2 + o));
      }
    }
  }
  std::vector<float> y(n_out);
  EXPECT_EQ(gpu_->ExpertMatMul(w, 3, 0, wf.data(), 1, y.data()).code(),
            absl::StatusCode::kInvalidArgument);  // 64 rows are not 3 experts
  EXPECT_EQ(gpu_->MatMulRange(w, wf.data(), 1, 16, 8, y.data()).code(),
            absl::StatusCode::kOutOfRange);

  std::vector<uint8_t> q4(n_out * n_in / 32 * 18);
  std::mt19937 rng(23);
  for (auto& byte : q4) byte = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < q4.size(); i += 18) q4[i + 1] &= 0x3B;  // finite scales
  WeightView q{GgmlType::kQ4_0, q4.data(), n_in, n_out};
  WeightView* qlist[] = {&q};
  auto qstore = gpu_->PrepareWeights(qlist, false);
  ASSERT_TRUE(qstore.ok()) << qstore.status();
  const auto x = Random(3 * n_in, -1, 1, 24);
  std::vector<float> want(3 * n_out), got(3 * n_out);
  WeightView qhost = q;
  qhost.device_data = nullptr;
  ASSERT_TRUE(cpu_.MatMul(qhost, x.data(), 3, want.data()).ok());
  ASSERT_TRUE(gpu_->MatMul(q, x.data(), 3, got.data()).ok());
  EXPECT_EQ(got, want);
}

// Two caches of one layout, one on each backend, holding the same rows of three sequences.
struct CachePair {
  std::unique_ptr<KvCache> cpu, gpu;
  std::vector<SeqId> ids;
  KvTables tables;
  std::vector<int32_t> seq, n_visible, first_visible, extra_indptr, extra_positions;
  AttentionMask Mask() const {
    return AttentionMask{seq, &tables, n_visible, extra_indptr, extra_positions, first_visible};
  }
};

// Prefill tokens of sequence 0, a windowed decode token of sequence 1, tree nodes of sequence 2
// (the mask kinds of a real batch); rows written through each backend's WriteKv / WriteLatent.
CachePair MakeCaches(const KvLayout& layout, cpu::CpuBackend& cpu, cuda::CudaBackend& gpu) {
  CachePair c;
  KvCacheOptions cpu_opts{.num_blocks = 32, .enable_prefix_caching = false};
  KvCacheOptions gpu_opts = cpu_opts;
  gpu_opts.storage = [&gpu](const KvLayout& l, int32_t n) { return gpu.NewKvStorage(l, n); };
  auto a = KvCache::Create(layout, cpu_opts), b = KvCache::Create(layout, gpu_opts);
  EXPECT_TRUE(a.ok() && b.ok());
  c.cpu = std::move(*a);
  c.gpu = std::move(*b);
  std::mt19937 rng(30);
  std::uniform_real_distribution<float> d(-1, 1);
  for (int32_t len : {37, 70, 25}) {
    const SeqId s = c.cpu->CreateSequence();
    EXPECT_EQ(c.gpu->CreateSequence(), s);
    c.ids.push_back(s);
    std::vector<int32_t> tokens(len, 5);
    std::vector<KvSlot> slots(len), gpu_slots(len);
    EXPECT_TRUE(c.cpu->AppendSlots(s, tokens, slots).ok());
    EXPECT_TRUE(c.gpu->AppendSlots(s, tokens, gpu_slots).ok());
    EXPECT_EQ(slots.size(), gpu_slots.size());
    for (int32_t layer = 0; layer < layout.n_layers(); ++layer) {
      const bool mla = layout.kind() == KvAttentionKind::kMla;
      std::vector<float> k(size_t(len) *
                           (mla ? layout.row_elems() : layout.n_kv_heads() * layout.head_dim()));
      for (float& v : k) v = d(rng);
      if (mla) {
        EXPECT_TRUE(cpu.WriteLatent(*c.cpu, layer, slots, k.data()).ok());
        EXPECT_TRUE(gpu.WriteLatent(*c.gpu, layer, slots, k.data()).ok());
        continue;
      }
      std::vector<float> v(k.size());
      for (float& e : v) e = d(rng);
      EXPECT_TRUE(cpu.WriteKv(*c.cpu, layer, slots, k.data(), v.data()).ok());
      EXPECT_TRUE(gpu.WriteKv(*c.gpu, layer, slots, k.data(), v.data()).ok());
    }
  }
  EXPECT_TRUE(c.cpu->BuildTables(c.ids, &c.tables).ok());
  for (int32_t p = 30; p < 37; ++p) {
    c.seq.push_back(0), c.n_visible.push_back(p + 1), c.first_visible.push_back(0);
  }
  c.seq.push_back(1), c.n_visible.push_back(70), c.first_visible.push_back(20);
  c.extra_indptr.assign(c.seq.size() + 1, 0);
  const std::vector<int32_t> parent = {-1, 0, 0, 1, -1};
  for (size_t i = 0; i < parent.size(); ++i) {
    c.seq.push_back(2), c.n_visible.push_back(20), c.first_visible.push_back(0);
  }
  EXPECT_TRUE(BuildTreeVisibility(parent, std::vector<int32_t>{20, 21, 22, 23, 24}, c.extra_indptr,
                                  c.extra_positions)
                  .ok());
  return c;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * std::max(1.0f, std::fabs(want[i])))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

// GQA (and MHA, MQA) attention on the device K/V against the CPU's on the same rows and mask,
// |err| <= 5e-5 * max(1, |want|) (f32 sums in another order); a mask the CPU refuses is refused
// with the CPU's message before anything runs. The last shape has a sliding-window group (layer
// 1, window 128: nothing released), whose rows live in other blocks of the one pool.
TEST_F(CudaBackendTest, AttentionMatchesCpu) {
  struct Shape {
    GgmlType type;
    int32_t n_heads, n_kv_heads, head_dim;
    bool sliding_group = false;
  };
  for (const Shape sh : {Shape{GgmlType::kF32, 4, 4, 40}, Shape{GgmlType::kF16, 6, 2, 64},
                         Shape{GgmlType::kBF16, 3, 1, 32}, Shape{GgmlType::kQ8_0, 8, 2, 128},
                         Shape{GgmlType::kF16, 4, 2, 64, /*sliding_group=*/true}}) {
    SCOPED_TRACE(::testing::Message()
                 << "type " << static_cast<int>(sh.type) << " heads " << sh.n_heads << "/"
                 << sh.n_kv_heads << (sh.sliding_group ? ", sliding group" : ""));
    auto layout = KvLayout::Gqa(2, sh.n_kv_heads, sh.head_dim, sh.type, 16);
    ASSERT_TRUE(layout.ok()) << layout.status();
    if (sh.sliding_group) {
      const std::vector<uint8_t> sliding = {0, 1};
      layout = layout->WithSlidingGroups(sliding, 128);
      ASSERT_TRUE(layout.ok()) << layout.status();
    }
    CachePair c = MakeCaches(*layout, cpu_, *gpu_);
    auto q = Random(c.seq.size() * sh.n_heads * sh.head_dim, -2, 2, 31);
    // On the Q8_0 grid for a q8_0 cache: the CPU's default order scores q8_0 K against q rounded
    // to Q8_0 blocks, the device against q in f32; on the grid the rounding changes nothing.
    if (sh.type == GgmlType::kQ8_0) q = testing::OnQ8_0Grid(q.data(), q.size());
    std::vector<float> want(q.size()), got(q.size());
    ASSERT_TRUE(cpu_.Attention(*c.cpu, 1, c.Mask(), q.data(), sh.n_heads, want.data(), 0).ok());
    ASSERT_TRUE(gpu_->Attention(*c.gpu, 1, c.Mask(), q.data(), sh.n_heads, got.data(), 0).ok());
    ExpectClose(got, want, 5e-5f);
    c.n_visible[0] = 10000;
    const absl::Status cs =
        cpu_.Attention(*c.cpu, 1, c.Mask(), q.data(), sh.n_heads, want.data(), 0);
    const absl::Status gs =
        gpu_->Attention(*c.gpu, 1, c.Mask(), q.data(), sh.n_heads, got.data(), 0);
    EXPECT_EQ(gs.code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(gs.message(), cs.message());
  }
}

// MLA's latent rows through the device (WriteLatent, ReadLatent: the CPU's bytes and values) and
// absorbed attention against the CPU's, |err| <= 5e-5 * max(1, |want|), for f16 and q8_0 caches.
TEST_F(CudaBackendTest, MlaAttentionAndLatentRowsMatchCpu) {
  constexpr int32_t kKvl = 64, kRope = 16, kNope = 24, kVDim = 20, kHeads = 4;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type));
    // A backend per case: MLA weights are uploaded once per host address.
    auto fresh = cuda::CudaBackend::Create(*module_, 0, 1);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    cuda::CudaBackend& gpu = **fresh;
    auto layout = KvLayout::Mla(2, kKvl, kRope, type, 8);
    ASSERT_TRUE(layout.ok()) << layout.status();
    CachePair c = MakeCaches(*layout, cpu_, gpu);
    const std::vector<KvSlot> slots = {{1, 0}, {2, 5}};
    std::vector<float> c_want(2 * kKvl), c_got(2 * kKvl), r_want(2 * kRope), r_got(2 * kRope);
    ASSERT_TRUE(cpu_.ReadLatent(*c.cpu, 1, slots, c_want.data(), r_want.data()).ok());
    ASSERT_TRUE(gpu.ReadLatent(*c.gpu, 1, slots, c_got.data(), r_got.data()).ok());
    EXPECT_EQ(c_got, c_want);
    EXPECT_EQ(r_got, r_want);
    const auto q = Random(c.seq.size() * kHeads * (kNope + kRope), -2, 2, 32);
    const auto w_uk = Random(size_t(kHeads) * kNope * kKvl, -0.3f, 0.3f, 33);
    const auto w_uv = Random(size_t(kHeads) * kVDim * kKvl, -0.3f, 0.3f, 34);
    const MlaAttentionWeights w{w_uk.data(), w_uv.data(), kKvl, kNope, kVDim};
    std::vector<float> want(c.seq.size() * kHeads * kVDim), got(want.size());
    ASSERT_TRUE(cpu_.MlaAttention(*c.cpu, 1, c.Mask(), q.data(), kHeads, w, want.data(), 0).ok());
    ASSERT_TRUE(gpu.MlaAttention(*c.gpu, 1, c.Mask(), q.data(), kHeads, w, got.data(), 0).ok());
    ExpectClose(got, want, 5e-5f);
  }
}

}  // namespace
}  // namespace kiln
