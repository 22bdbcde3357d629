// The gemma3 architecture on tiny random-weight models (BuildRandomModel with a gemma3 shape whose
// sliding window is 8 positions, so short sequences leave it): the hyper-parameters it reads, its
// logits against a plain float64 Gemma 3 forward pass written here from the model's definition
// (embedding scale, Q/K norms, NEOX RoPE with the window layers' own base, query scaling,
// sliding-window and global attention, post-norms, GeGLU, tied head), and the engine's promises
// with windows: batch/chunk/thread invariance, tree nodes equal to their paths, prefix-cache hits
// equal to a cold prefill; with the sliding layers' blocks released (KvLayout::WithSlidingGroups)
// every logit unchanged. The real model against llama.cpp: e2e_gemma3_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "lib/engine/engine.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"
#include "lib/session/session.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/common/forward_util.h"
#include "tests/common/session_util.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

constexpr int32_t kWindow = 8;

RandomModelShape TinyGemma3Shape() {
  RandomModelShape s;
  s.name = "tiny-gemma3";
  s.arch = "gemma3";
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 1;
  s.n_layer = 6;  // layers 0-4 sliding, 5 global (llama.cpp's default pattern of 6)
  s.n_ctx = 512;
  s.rope_freq_base = 1000000.0f;
  s.rms_eps = 1e-6f;
  s.tied_output = true;
  s.sliding_window = kWindow;
  return s;
}

// `extra_keys` may add or override hyper-parameter keys (files kiln must refuse).
std::string MakeTinyGemma3(uint32_t type, const std::string& tag,
                           const std::function<void(gguf::GgufWriter&)>& extra_keys = nullptr) {
  RandomModelOptions options;
  options.shape = TinyGemma3Shape();
  options.type = type;
  options.seed = 11;
  gguf::GgufWriter writer;
  const absl::Status built = BuildRandomModel(options, &writer);
  EXPECT_TRUE(built.ok()) << built;
  if (extra_keys) extra_keys(writer);
  const std::string path = testing::TempDir() + "/tiny-gemma3-" + tag + ".gguf";
  EXPECT_TRUE(writer.WriteToFile(path).ok());
  return path;
}

std::unique_ptr<Model> LoadModel(const std::string& path) {
  ModelLoadOptions options;
  options.path = path;
  auto model = Model::Load(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

using testing::GreedyDecode;
using testing::MakeCache;
using testing::MakeSlidingReleaseCache;
using testing::Prefill;
using testing::RandomTokens;

// ---- A plain float64 Gemma 3 forward pass over an f32 file (written from the model's
// definition, independent of the engine; recomputes attention over the prefix per token).
class ReferenceGemma3 {
 public:
  explicit ReferenceGemma3(const gguf::GgufFile& f) : f_(f) {}

  // Logits [tokens.size()][n_vocab] of one causal sequence from position 0. window = 0: every
  // layer global (to show the window matters).
  std::vector<std::vector<double>> Forward(const std::vector<int32_t>& tokens, int window) const {
    const RandomModelShape s = TinyGemma3Shape();
    const int64_t d = s.n_embd, hd = s.head_dim(), nh = s.n_head, nkv = s.n_head_kv;
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<double> embd = Vec("token_embd.weight");
    const int64_t n_vocab = static_cast<int64_t>(embd.size()) / d;
    std::vector<std::vector<double>> x(n, std::vector<double>(d));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < d; ++i) x[t][i] = embd[tokens[t] * d + i] * std::sqrt(double(d));
    }
    for (uint32_t l = 0; l < s.n_layer; ++l) {
      const bool swa = window > 0 && l % 6 < 5;
      const double base = swa ? 10000.0 : s.rope_freq_base;
      const std::string b = "blk." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        const std::vector<double> h = Norm(x[t], Vec(b + "attn_norm.weight"));
        q[t] = MatVec(b + "attn_q.weight", h);
        k[t] = MatVec(b + "attn_k.weight", h);
        v[t] = MatVec(b + "attn_v.weight", h);
        HeadNormRope(q[t], nh, Vec(b + "attn_q_norm.weight"), t, base);
        HeadNormRope(k[t], nkv, Vec(b + "attn_k_norm.weight"), t, base);
      }
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> attn(nh * hd, 0.0);
        const int64_t j0 = swa ? std::max<int64_t>(0, t - window + 1) : 0;
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t g = h / (nh / nkv);
          std::vector<double> p(t + 1 - j0);
          double m = -1e300, sum = 0;
          for (int64_t j = j0; j <= t; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < hd; ++i) dot += q[t][h * hd + i] * k[j][g * hd + i];
            p[j - j0] = dot / std::sqrt(double(hd));
            m = std::max(m, p[j - j0]);
          }
          for (double& e : p) sum += (e = std::exp(e - m));
          for (int64_t j = j0; j <= t; ++j) {
            for (int64_t i = 0; i < hd; ++i) attn[h * hd + i] += p[j - j0] / sum * v[j][g * hd + i];
          }
        }
        const std::vector<double> o =
            Norm(MatVec(b + "attn_output.weight", attn), Vec(b + "post_attention_norm.weight"));
        for (int64_t i = 0; i < d; ++i) x[t][i] += o[i];
        const std::vector<double> h = Norm(x[t], Vec(b + "ffn_norm.weight"));
        const std::vector<double> gate = MatVec(b + "ffn_gate.weight", h);
        std::vector<double> act = MatVec(b + "ffn_up.weight", h);
        for (size_t i = 0; i < act.size(); ++i) {
          const double z = gate[i];
          act[i] *= 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
        }
        const std::vector<double> down =
            Norm(MatVec(b + "ffn_down.weight", act), Vec(b + "post_ffw_norm.weight"));
        for (int64_t i = 0; i < d; ++i) x[t][i] += down[i];
      }
    }
    std::vector<std::vector<double>> logits(n, std::vector<double>(n_vocab));
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> h = Norm(x[t], Vec("output_norm.weight"));
      for (int64_t v = 0; v < n_vocab; ++v) {
        for (int64_t i = 0; i < d; ++i) logits[t][v] += embd[v * d + i] * h[i];
      }
    }
    return logits;
  }

 private:
  std::vector<double> Vec(const std::string& name) const {
    const gguf::TensorInfo* t = f_.FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, 0u) << name << " must be f32";
    std::vector<float> tmp(t->n_elements);
    std::memcpy(tmp.data(), t->data, t->nbytes);
    return std::vector<double>(tmp.begin(), tmp.end());
  }
  std::vector<double> MatVec(const std::string& name, const std::vector<double>& x) const {
    const std::vector<double> w = Vec(name);  // [n_out, n_in]
    const size_t n_in = x.size(), n_out = w.size() / n_in;
    std::vector<double> y(n_out, 0.0);
    for (size_t o = 0; o < n_out; ++o) {
      for (size_t i = 0; i < n_in; ++i) y[o] += w[o * n_in + i] * x[i];
    }
    return y;
  }
  static std::vector<double> Norm(std::vector<double> x, const std::vector<double>& w) {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double scale = 1 / std::sqrt(ss / x.size() + 1e-6);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= scale * w[i];
    return x;
  }
  // RMS-normalizes each head of x (heads of head_dim) with w, then rotates it NEOX-style.
  static void HeadNormRope(std::vector<double>& x, int64_t n_heads, const std::vector<double>& w,
                           int64_t pos, double base) {
    const int64_t hd = static_cast<int64_t>(w.size()), half = hd / 2;
    for (int64_t h = 0; h < n_heads; ++h) {
      std::vector<double> head(x.begin() + h * hd, x.begin() + (h + 1) * hd);
      head = Norm(head, w);
      for (int64_t i = 0; i < half; ++i) {
        const double theta = pos * std::pow(base, -2.0 * i / hd);
        const double a = head[i], b = head[i + half];
        x[h * hd + i] = a * std::cos(theta) - b * std::sin(theta);
        x[h * hd + i + half] = a * std::sin(theta) + b * std::cos(theta);
      }
    }
  }
  const gguf::GgufFile& f_;
};

TEST(Gemma3, ReadsItsHyperParametersAndChatTemplate) {
  const std::string path = MakeTinyGemma3(static_cast<uint32_t>(GgmlType::kF32), "hp");
  auto model = LoadModel(path);
  ASSERT_NE(model, nullptr);
  const ModelHparams& hp = model->hparams();
  EXPECT_EQ(hp.arch, "gemma3");
  EXPECT_EQ(hp.sliding_window, kWindow);
  EXPECT_EQ(hp.swa_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(hp.rope.mode, RopeMode::kNeox);
  EXPECT_EQ(hp.rope.freq_base, 1000000.0f);
  EXPECT_EQ(hp.rope_swa.freq_base, 10000.0f);
  EXPECT_TRUE(hp.tied_output);
  // The random file carries a ChatML template; files without one get the family's (the real
  // model's case, e2e_gemma3_test).
  EXPECT_NE(model->chat_template(), "gemma3");
  EXPECT_EQ(model->architecture().default_chat_template(), "gemma3");
  EXPECT_NE(model->Tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_NE(model->Tensor("blk.5.post_ffw_norm.weight"), nullptr);
}

// What kiln cannot run is refused at load with the key named: final-logit soft-capping (Gemma 2
// style) and per-layer sliding-window arrays; a window of 0 means no sliding window (llama.cpp).
TEST(Gemma3, UnsupportedKeysAreClearErrors) {
  const uint32_t f32 = static_cast<uint32_t>(GgmlType::kF32);
  ModelLoadOptions options;
  options.path = MakeTinyGemma3(f32, "softcap", [](gguf::GgufWriter& w) {
    w.SetFloat32("gemma3.final_logit_softcapping", 30.0f);
  });
  auto model = Model::Load(options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("final_logit_softcapping"), std::string::npos)
      << model.status();
  options.path = MakeTinyGemma3(f32, "pattern", [](gguf::GgufWriter& w) {
    const bool layers[] = {true, false, true, false, true, false};
    w.SetArrayBool("gemma3.attention.sliding_window_pattern", layers);
  });
  model = Model::Load(options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("sliding_window_pattern"), std::string::npos)
      << model.status();
  options.path = MakeTinyGemma3(f32, "nowindow", [](gguf::GgufWriter& w) {
    w.SetUint32("gemma3.attention.sliding_window", 0);
  });
  model = Model::Load(options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->hparams().sliding_window, 0);
  EXPECT_FALSE((*model)->hparams().is_swa(0));
}

// Logits against the float64 reference: f32 weights, f32 cache, so what is left is f32
// rounding and GeGLU's f16 table (each GELU rounded to f16: relative 2^-11) through six layers;
// measured below 1e-3 of the largest logit, bounded at 5e-3. The same reference without windows
// differs by far more (checked), so the bound sees the window.
TEST(Gemma3, LogitsMatchFloat64ReferenceWithSlidingWindows) {
  const std::string path = MakeTinyGemma3(static_cast<uint32_t>(GgmlType::kF32), "ref");
  auto model = LoadModel(path);
  ASSERT_NE(model, nullptr);
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const ReferenceGemma3 ref(**file);
  const std::vector<int32_t> tokens = RandomTokens(24, model->hparams().n_vocab, 3);
  for (bool llama_order : {false, true}) {
    SCOPED_TRACE(llama_order ? "llama.cpp order" : "kiln order");
    CpuForward fwd(*model, 2);
    fwd.set_llama_cpp_order(llama_order);
    auto cache = MakeCache(*model, GgmlType::kF32);
    const std::vector<float> got = Prefill(fwd, *cache, cache->CreateSequence(), tokens, 5);
    const int64_t V = model->hparams().n_vocab;
    ASSERT_EQ(got.size(), tokens.size() * V);
    auto rel_error = [&](const std::vector<std::vector<double>>& expected) {
      double max_err = 0, max_ref = 0;
      for (size_t t = 0; t < tokens.size(); ++t) {
        for (int64_t v = 0; v < V; ++v) {
          max_err = std::max(max_err, std::abs(got[t * V + v] - expected[t][v]));
          max_ref = std::max(max_ref, std::abs(expected[t][v]));
        }
      }
      EXPECT_GT(max_ref, 0.1);
      return max_err / max_ref;
    };
    const double windowed = rel_error(ref.Forward(tokens, kWindow));
    const double unwindowed = rel_error(ref.Forward(tokens, 0));
    std::printf("tiny gemma3 vs float64 reference: %.2e (without windows: %.2e)\n", windowed,
                unwindowed);
    EXPECT_LT(windowed, 5e-3);
    EXPECT_GT(unwindowed, 10 * windowed);
  }
}

class Gemma3Invariance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(MakeTinyGemma3(static_cast<uint32_t>(GgmlType::kQ8_0), "q8_0"));
  }
  static void TearDownTestSuite() {
    delete path_;
    path_ = nullptr;
  }
  void SetUp() override {
    model_ = LoadModel(*path_);
    ASSERT_NE(model_, nullptr);
  }
  static std::string* path_;
  std::unique_ptr<Model> model_;
};
std::string* Gemma3Invariance::path_ = nullptr;

// Windows start at a different row for every token past the window, so the chunked attention
// shares fewer rows; the results must not change.
TEST_F(Gemma3Invariance, BitwiseSameAcrossChunkingAndThreads) {
  const std::vector<int32_t> tokens = RandomTokens(40, model_->hparams().n_vocab, 5);
  CpuForward one(*model_, 1), two(*model_, 2);
  auto cache = MakeCache(*model_, GgmlType::kF16);
  const std::vector<float> whole = Prefill(one, *cache, cache->CreateSequence(), tokens, 40);
  for (int chunk : {1, 3, 16}) {
    EXPECT_EQ(Prefill(two, *cache, cache->CreateSequence(), tokens, chunk), whole)
        << "chunks of " << chunk;
  }
}

TEST_F(Gemma3Invariance, PrefixCacheHitEqualsColdPrefill) {
  const int64_t V = model_->hparams().n_vocab;
  const std::vector<int32_t> prompt = RandomTokens(50, V, 31);
  CpuForward fwd(*model_, 2);
  auto cache = MakeCache(*model_, GgmlType::kF16);
  const std::vector<float> cold_logits = Prefill(fwd, *cache, cache->CreateSequence(), prompt, 64);
  const SeqId warm = cache->CreateSequence();
  auto attached = cache->AttachCachedPrefix(warm, std::span(prompt).subspan(0, prompt.size() - 1));
  ASSERT_TRUE(attached.ok());
  EXPECT_EQ(*attached, 48);
  const std::vector<float> warm_logits = Prefill(fwd, *cache, warm, prompt, 64, *attached);
  ASSERT_EQ(warm_logits.size(), 2u * V);
  EXPECT_EQ(warm_logits, std::vector<float>(cold_logits.end() - 2 * V, cold_logits.end()));
}

// Tree nodes past the window: each node's logits equal, bit for bit, those of its root-to-node
// path evaluated causally; a tree as deep as the window is rejected.
TEST_F(Gemma3Invariance, TreeNodesEqualTheirPaths) {
  const int64_t V = model_->hparams().n_vocab;
  const std::vector<int32_t> prompt = RandomTokens(20, V, 9);
  const int32_t n = static_cast<int32_t>(prompt.size());
  CpuForward fwd(*model_, 2);
  auto cache = MakeCache(*model_, GgmlType::kF16);
  const SeqId seq = cache->CreateSequence();
  Prefill(fwd, *cache, seq, std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 32);
  // Root r (the prompt's last token, causal); a, b children of r; c child of a; d child of c.
  const int32_t r = prompt.back();
  const std::vector<int32_t> tree = {r, 11, 12, 13, 14};
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 3};
  const std::vector<int32_t> depth = {0, 1, 1, 2, 3};
  ASSERT_TRUE(cache->AppendSlots(seq, tree).ok());
  ForwardBatch batch;
  for (size_t i = 0; i < tree.size(); ++i) {
    batch.Add(tree[i], seq, n - 1 + depth[i], true, parent[i], n - 1 + static_cast<int32_t>(i));
  }
  ForwardOutput tree_out;
  ASSERT_TRUE(fwd.Forward(batch, *cache, &tree_out).ok());
  const std::vector<std::vector<int32_t>> paths = {
      {r}, {r, 11}, {r, 12}, {r, 11, 13}, {r, 11, 13, 14}};
  for (size_t node = 0; node < paths.size(); ++node) {
    std::vector<int32_t> full(prompt.begin(), prompt.end() - 1);
    full.insert(full.end(), paths[node].begin(), paths[node].end());
    const std::vector<float> causal = Prefill(fwd, *cache, cache->CreateSequence(), full, 64);
    EXPECT_EQ(0, std::memcmp(tree_out.LogitsRow(node), causal.data() + (full.size() - 1) * V,
                             V * sizeof(float)))
        << "tree node " << node;
  }
  // A chain of kWindow nodes below the root: the last one is kWindow positions deep.
  const SeqId deep = cache->CreateSequence();
  Prefill(fwd, *cache, deep, prompt, 32);
  const std::vector<int32_t> chain(kWindow, 7);
  ASSERT_TRUE(cache->AppendSlots(deep, chain).ok());
  ForwardBatch deep_batch;
  for (int32_t i = 0; i < kWindow; ++i) {
    deep_batch.Add(7, deep, n + i, true, i == 0 ? -1 : i - 1, n + i);
  }
  ForwardOutput out;
  // The first node is causal (parent -1) and the rest hang below it: depth up to kWindow - 1.
  EXPECT_TRUE(fwd.Forward(deep_batch, *cache, &out).ok());
  const std::vector<int32_t> one_more = {7};
  ASSERT_TRUE(cache->AppendSlots(deep, one_more).ok());
  deep_batch.Add(7, deep, n + kWindow, true, kWindow - 1, n + kWindow);
  const absl::Status too_deep = fwd.Forward(deep_batch, *cache, &out);
  EXPECT_EQ(too_deep.code(), absl::StatusCode::kInvalidArgument) << too_deep;
  EXPECT_NE(too_deep.message().find("sliding window"), std::string::npos) << too_deep;
}

// ---- Releasing the sliding layers' blocks that leave every window (KvLayout::WithSlidingGroups;
// six groups of one layer, the global layer 5 in group 0): no logit may change. Blocks of 4
// tokens, so the window of 8 leaves blocks often.

// Greedy decoding over ten windows, in both kernel orders: logits bitwise equal to a cache that
// keeps every block, with exactly the blocks below every window released; a fork rewound by four
// tokens decodes the same too, and a rewind into released blocks is refused.
TEST_F(Gemma3Invariance, SlidingReleaseKeepsLogitsBitwise) {
  const int64_t V = model_->hparams().n_vocab;
  const std::vector<int32_t> prompt = RandomTokens(20, V, 17);
  for (bool llama_cpp_order : {false, true}) {
    SCOPED_TRACE(llama_cpp_order ? "llama.cpp order" : "kiln order");
    CpuForward fwd(*model_, 2);
    fwd.set_llama_cpp_order(llama_cpp_order);
    auto keep = MakeCache(*model_, GgmlType::kF16);
    auto release = MakeSlidingReleaseCache(*model_, GgmlType::kF16, 4, 128);
    ASSERT_NE(release, nullptr);
    std::vector<int32_t> kept_tokens = prompt, released_tokens = prompt;
    const SeqId a = keep->CreateSequence(), b = release->CreateSequence();
    const std::vector<float> kept = GreedyDecode(fwd, *keep, a, kept_tokens, 60);
    const std::vector<float> released = GreedyDecode(fwd, *release, b, released_tokens, 60);
    EXPECT_EQ(released_tokens, kept_tokens);
    EXPECT_EQ(released, kept);
    // 80 tokens: the next token's window starts at 73, rounded down to 64: 16 of 20 blocks in
    // each of the 5 sliding groups.
    KvCacheCounters c = release->Counters();
    EXPECT_EQ(c.sliding_blocks_released, 5 * 16);
    EXPECT_EQ(c.sliding_blocks_used, 5 * 4);
    EXPECT_EQ(c.blocks_used, 20 + 5 * 4);
    EXPECT_EQ(c.kv_bytes_in_use, (20 + 5 * 4) * c.block_bytes);

    // Fork, rewind four tokens, run two of them again and decode five: the same in both caches.
    const SeqId fa = *keep->Fork(a), fb = *release->Fork(b);
    ASSERT_TRUE(keep->Truncate(fa, 76).ok());
    ASSERT_TRUE(release->Truncate(fb, 76).ok());
    kept_tokens.resize(78);
    released_tokens.resize(78);
    EXPECT_EQ(GreedyDecode(fwd, *release, fb, released_tokens, 5),
              GreedyDecode(fwd, *keep, fa, kept_tokens, 5));
    EXPECT_EQ(released_tokens, kept_tokens);
    // Back to 70 needs rows from 63 (rounded: 48), released: refused, nothing changed.
    const absl::Status deep = release->Truncate(b, 70);
    EXPECT_EQ(deep.code(), absl::StatusCode::kFailedPrecondition) << deep;
    EXPECT_EQ(*release->Length(b), 80);
    EXPECT_TRUE(release->CheckInvariants().ok()) << release->CheckInvariants();
  }
}

// A prefix hit from a cache whose sliding blocks were released: the hit keeps the window's
// blocks, and its logits equal the cold decode's bit for bit.
TEST_F(Gemma3Invariance, SlidingReleasePrefixHitEqualsCold) {
  const int64_t V = model_->hparams().n_vocab;
  std::vector<int32_t> tokens = RandomTokens(20, V, 23);
  CpuForward fwd(*model_, 2);
  auto cache = MakeSlidingReleaseCache(*model_, GgmlType::kF16, 4, 256);
  ASSERT_NE(cache, nullptr);
  const std::vector<float> cold = GreedyDecode(fwd, *cache, cache->CreateSequence(), tokens, 60);
  const SeqId warm = cache->CreateSequence();
  auto attached = cache->AttachCachedPrefix(warm, std::span(tokens).first(79));
  ASSERT_TRUE(attached.ok());
  EXPECT_EQ(*attached, 76);
  // Only the window's blocks: token 76 reads from row 69, rounded down to 64 (block 16).
  for (int32_t g = 1; g < 6; ++g) {
    EXPECT_EQ(cache->BlockTable(warm, g)->size(), 19u);
    EXPECT_EQ((*cache->BlockTable(warm, g))[15], kNullBlock);
  }
  std::vector<int32_t> prompt = tokens;
  const std::vector<float> warm_rows = GreedyDecode(fwd, *cache, warm, prompt, 0);
  ASSERT_EQ(warm_rows.size(), static_cast<size_t>(V));
  EXPECT_EQ(warm_rows, std::vector<float>(cold.end() - V, cold.end()));
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

// ---- The engine releasing sliding blocks (the default; EngineOptions::swa_full keeps them):
// sessions' text bitwise the same as with every block kept, batched, in a roomy pool and in one
// too small for every block kept, greedy and seeded, with and without n-gram speculation; a
// rewind past a released window recomputes.

// pool_blocks 0: room for a full context.
EngineOptions SlidingEngineOptions(bool swa_full, int64_t pool_blocks = 0) {
  EngineOptions options;
  options.block_size = 4;
  options.prefill_chunk = 16;
  options.swa_full = swa_full;
  // Blocks of the released layout: one layer, 4 rows of K and V at f16 (head_dim 64).
  options.pool_bytes = static_cast<size_t>(pool_blocks) * (2 * 4 * 64 * 2);
  return options;
}

sample::SamplerParams Sampled() {
  sample::SamplerParams sampled = testing::Greedy();
  sampled.temperature = 0.8f;
  return sampled;
}

struct SlidingRun {
  std::vector<std::vector<int32_t>> tokens;  // per session, prompt and generated
  std::string state;                         // session 1's, before its last 20 tokens
  KvCacheCounters counters;                  // at the end, every session still alive
  int64_t preemptions = 0;
};

// Three sessions submitted together and stepped until done: 0 greedy, 1 seeded sampling, 2
// greedy with n-gram drafts; prompts of 30-50 tokens that repeat themselves (drafts find
// matches), 70 tokens each. Then session 0 (100 tokens) rewinds to 10 (into its released window
// when release is on) and generates 20 more; session 1 is saved, restored into a new session,
// and both generate 20 more.
SlidingRun RunSlidingSessions(const Model& model, bool swa_full, int64_t pool_blocks = 0) {
  auto engine = testing::MakeEngine(model, SlidingEngineOptions(swa_full, pool_blocks));
  SlidingRun run;
  if (engine == nullptr) return run;
  const int64_t V = model.hparams().n_vocab;
  const sample::SamplerParams sampled = Sampled();
  spec::NgramParams ngram_params;
  ngram_params.min_ngram = 1;
  ngram_params.max_draft = 4;
  ngram_params.fixed_pass_cost_beta = 0.25;  // draft lengths independent of timing
  auto ngram = spec::NgramStrategy::Create(ngram_params);
  EXPECT_TRUE(ngram.ok()) << ngram.status();
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < 3; ++i) {
    sessions.push_back(testing::NewSession(*engine, i == 1 ? sampled : testing::Greedy(), 7 + i));
    if (i == 2) {
      EXPECT_TRUE(sessions[i]->SetStrategy(ngram->get()).ok());
    }
    std::vector<int32_t> prompt = RandomTokens(15 + 5 * i, 3, V, 40 + i);
    prompt.insert(prompt.end(), prompt.begin(), prompt.end());
    SubmitOptions submit;
    submit.prompt = prompt;
    submit.generate.max_tokens = 70;
    EXPECT_TRUE(sessions[i]->Submit(submit).ok());
  }
  int done = 0;
  for (int step = 0; done < 3 && step < 10000; ++step) {
    engine->scheduler().Step(0, 0.0);
    for (auto& s : sessions) {
      if (!s->request_in_flight()) continue;
      PollResult poll;
      EXPECT_TRUE(s->Poll(SIZE_MAX, SIZE_MAX, &poll).ok());
      if (!poll.done) continue;
      EXPECT_TRUE(poll.status.ok()) << poll.status;
      ++done;
    }
  }
  EXPECT_EQ(done, 3);
  GenerateOptions more;
  more.max_tokens = 20;
  EXPECT_TRUE(sessions[0]->Rewind(90).ok());
  auto generated = sessions[0]->Generate(more);
  EXPECT_TRUE(generated.ok()) << generated.status();
  // Session 1's state (K/V asked for) restored into a new session: both continue alike.
  auto saved = sessions[1]->SaveState();
  EXPECT_TRUE(saved.ok()) << saved.status();
  if (saved.ok()) run.state = *saved;
  auto restored = testing::NewSession(*engine, sampled, 99);
  const absl::Status loaded = restored->LoadState(run.state);
  EXPECT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(restored->stats().computed_tokens, 0);  // its own state: a copy
  EXPECT_TRUE(sessions[1]->Generate(more).ok());
  EXPECT_TRUE(restored->Generate(more).ok());
  EXPECT_EQ(restored->tokens(), sessions[1]->tokens());
  for (auto& s : sessions) {
    run.tokens.push_back(s->tokens());
    run.preemptions += s->stats().preemptions;
  }
  run.counters = engine->Counters();
  return run;
}

TEST_F(Gemma3Invariance, EngineSlidingReleaseKeepsSessionsBitwise) {
  const SlidingRun kept = RunSlidingSessions(*model_, /*swa_full=*/true);
  ASSERT_EQ(kept.tokens.size(), 3u);
  EXPECT_EQ(kept.counters.sliding_blocks_used + kept.counters.sliding_blocks_released, 0);
  // A pool with room for a full context, and one that holds the three sessions (and a restored
  // copy of one) only because released blocks return to it: smaller than the K/V they hold with
  // every block kept.
  constexpr int64_t kSmallPool = 480;
  EXPECT_GT(kept.counters.kv_bytes_in_use, SlidingEngineOptions(false, kSmallPool).pool_bytes);
  for (int64_t pool_blocks : {int64_t{0}, kSmallPool}) {
    SCOPED_TRACE(::testing::Message() << "pool of " << pool_blocks << " blocks");
    const SlidingRun released = RunSlidingSessions(*model_, /*swa_full=*/false, pool_blocks);
    ASSERT_EQ(released.tokens.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(released.tokens[i], kept.tokens[i]) << "session " << i;
    EXPECT_GT(released.counters.sliding_blocks_released, 0);
    EXPECT_LT(released.counters.kv_bytes_in_use, kept.counters.kv_bytes_in_use);
    // Each run's state restored on an engine of the other kind (copied where it holds the rows
    // that engine keeps, else recomputed): the same continuation.
    for (const auto& [state, swa_full] :
         {std::pair{released.state, true}, std::pair{kept.state, false}}) {
      auto engine = testing::MakeEngine(*model_, SlidingEngineOptions(swa_full));
      ASSERT_NE(engine, nullptr);
      auto restored = testing::NewSession(*engine, Sampled(), 5);
      ASSERT_TRUE(restored->LoadState(state).ok());
      // Without release the cache needs the rows the released state lacks: recomputed.
      EXPECT_EQ(restored->stats().computed_tokens > 0, swa_full);
      GenerateOptions more;
      more.max_tokens = 20;
      ASSERT_TRUE(restored->Generate(more).ok());
      EXPECT_EQ(restored->tokens(), kept.tokens[1]) << "restored with swa_full " << swa_full;
    }
    std::printf(
        "pool of %lld blocks: %d of %d blocks hold sliding layers, %lld released, %lld "
        "preemptions; K/V in use %zu bytes, %zu with every block kept\n",
        static_cast<long long>(pool_blocks), released.counters.sliding_blocks_used,
        released.counters.blocks_used,
        static_cast<long long>(released.counters.sliding_blocks_released),
        static_cast<long long>(released.preemptions), released.counters.kv_bytes_in_use,
        kept.counters.kv_bytes_in_use);
  }
}

// With release the pool must hold a block of each of the six groups and the null block.
TEST_F(Gemma3Invariance, EngineRefusesAPoolWithoutABlockPerGroup) {
  auto too_small = Engine::Create(*model_, SlidingEngineOptions(false, 6));
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("pool_bytes"), std::string::npos)
      << too_small.status();
  EXPECT_TRUE(Engine::Create(*model_, SlidingEngineOptions(false, 7)).ok());
  // Every layer in one block: 6 of the blocks above each, and the null block.
  EXPECT_FALSE(Engine::Create(*model_, SlidingEngineOptions(true, 11)).ok());
  EXPECT_TRUE(Engine::Create(*model_, SlidingEngineOptions(true, 12)).ok());
}

}  // namespace
}  // namespace kiln
