// The random-model generator behind kiln-mkmodel (lib/model/random_model.h): writes models,
// reads them back with the reader and checks every key, every tensor shape and type, the weight
// statistics, determinism, type fallbacks and --vocab-from; qwen2 shapes carry the keys and the
// tensor table of their architecture (Q/K/V biases) and load as models.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "lib/common/ggml_type.h"
#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/model.h"
#include "lib/model/random_model.h"
#include "lib/quant/quant.h"
#include "tests/common/test_util.h"

namespace kiln::gguf {
namespace {

struct Built {
  std::vector<uint8_t> bytes;
  std::unique_ptr<GgufFile> file;
  std::vector<std::string> notes;
};

Built Build(const RandomModelShape& shape, uint32_t type, uint64_t seed,
            const GgufFile* vocab_from = nullptr) {
  Built b;
  RandomModelOptions o;
  o.shape = shape;
  o.type = type;
  o.seed = seed;
  o.vocab_from = vocab_from;
  o.note = [&b](std::string_view m) { b.notes.emplace_back(m); };
  GgufWriter w;
  absl::Status st = BuildRandomModel(o, &w);
  EXPECT_TRUE(st.ok()) << st;
  auto bytes = w.WriteToBuffer();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return b;
  b.bytes = std::move(bytes).value();
  auto f = GgufFile::Parse(b.bytes.data(), b.bytes.size());
  EXPECT_TRUE(f.ok()) << f.status();
  if (f.ok()) b.file = std::move(f).value();
  return b;
}

std::vector<float> F32Values(const TensorInfo& t) {
  std::vector<float> v(t.n_elements);
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

TEST(RandomModelTest, TinyLlamaGqaF32KeysAndTensors) {
  const RandomModelShape shape = *RandomModelShapeByName("tiny-llama-gqa");
  Built b = Build(shape, static_cast<uint32_t>(GgmlType::kF32), 7);
  ASSERT_NE(b.file, nullptr);
  const GgufFile& f = *b.file;
  EXPECT_TRUE(b.notes.empty());

  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetUint("general.file_type"), 0u);
  EXPECT_EQ(f.FindKey("general.quantization_version"), nullptr);
  EXPECT_EQ(*f.GetUint("llama.block_count"), 2u);
  EXPECT_EQ(*f.GetUint("llama.context_length"), 512u);
  EXPECT_EQ(*f.GetUint("llama.embedding_length"), 256u);
  EXPECT_EQ(*f.GetUint("llama.feed_forward_length"), 512u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count"), 4u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(*f.GetUint("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(*f.GetFloat("llama.rope.freq_base"), 10000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  // Every hyper-parameter is stored as uint32 and the floats as float32, like the converter.
  EXPECT_EQ(f.FindKey("llama.block_count")->type, ValueType::kUint32);
  EXPECT_EQ(f.FindKey("llama.rope.freq_base")->type, ValueType::kFloat32);

  // Tokenizer.
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "default");
  auto tokens = *f.GetStringArray("tokenizer.ggml.tokens");
  auto types = *f.GetIntArray("tokenizer.ggml.token_type");
  auto merges = *f.GetStringArray("tokenizer.ggml.merges");
  const uint64_t n_vocab = *f.GetUint("llama.vocab_size");
  EXPECT_EQ(tokens.size(), n_vocab);
  EXPECT_EQ(types.size(), n_vocab);
  EXPECT_EQ(merges.size(), 300u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(types[0], 3);
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(tokens[3 + ' '], "\xC4\xA0");   // byte 0x20 -> U+0120 'Ġ'
  EXPECT_EQ(tokens[3 + '\n'], "\xC4\x8A");  // byte 0x0A -> U+010A 'Ċ'
  EXPECT_EQ(tokens[3 + 'a'], "a");
  EXPECT_EQ(tokens[3 + 0xAD], "\xC5\x83");  // 0xAD -> U+0143
  std::set<std::string_view> unique(tokens.begin(), tokens.end());
  EXPECT_EQ(unique.size(), tokens.size());
  for (std::string_view m : merges) {  // "left right": both sides and their join are tokens
    const size_t sp = m.find(' ', 1);
    ASSERT_NE(sp, std::string_view::npos) << m;
    EXPECT_TRUE(unique.count(m.substr(0, sp))) << m;
    EXPECT_TRUE(unique.count(m.substr(sp + 1))) << m;
    EXPECT_TRUE(unique.count(std::string(m.substr(0, sp)) + std::string(m.substr(sp + 1)))) << m;
  }
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_FALSE(*f.GetBool("tokenizer.ggml.add_bos_token"));

  // Tensors: names, shapes (ggml order), types.
  struct Expect {
    std::string name;
    std::vector<uint64_t> ne;
  };
  std::vector<Expect> expected = {{"token_embd.weight", {256, n_vocab}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expected.push_back({p + "attn_norm.weight", {256}});
    expected.push_back({p + "attn_q.weight", {256, 256}});
    expected.push_back({p + "attn_k.weight", {256, 128}});
    expected.push_back({p + "attn_v.weight", {256, 128}});
    expected.push_back({p + "attn_output.weight", {256, 256}});
    expected.push_back({p + "ffn_norm.weight", {256}});
    expected.push_back({p + "ffn_gate.weight", {256, 512}});
    expected.push_back({p + "ffn_up.weight", {256, 512}});
    expected.push_back({p + "ffn_down.weight", {512, 256}});
  }
  expected.push_back({"output_norm.weight", {256}});
  expected.push_back({"output.weight", {256, n_vocab}});
  ASSERT_EQ(f.tensors().size(), expected.size());
  for (const Expect& e : expected) {
    const TensorInfo* t = f.FindTensor(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->ne, e.ne) << e.name;
    EXPECT_EQ(t->type, 0u) << e.name;
    const std::vector<float> v = F32Values(*t);
    double sum = 0, sum2 = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << e.name;
      sum += x;
      sum2 += double{x} * x;
    }
    const double mean = sum / v.size(), sd = std::sqrt(sum2 / v.size() - mean * mean);
    if (e.ne.size() == 1) {  // norm: 1 + 0.02 N(0,1)
      EXPECT_NEAR(mean, 1.0, 0.01) << e.name;
      EXPECT_NEAR(sd, 0.02, 0.005) << e.name;
    } else {  // N(0, 1/fan_in)
      const double want = 1.0 / std::sqrt(static_cast<double>(e.ne[0]));
      EXPECT_NEAR(sd, want, 0.05 * want) << e.name;
      EXPECT_NEAR(mean, 0.0, 0.05 * want) << e.name;
    }
  }
}

TEST(RandomModelTest, DeterministicPerSeed) {
  const RandomModelShape shape = *RandomModelShapeByName("tiny-llama-mqa");
  Built a = Build(shape, static_cast<uint32_t>(GgmlType::kF16), 3);
  Built b = Build(shape, static_cast<uint32_t>(GgmlType::kF16), 3);
  Built c = Build(shape, static_cast<uint32_t>(GgmlType::kF16), 4);
  ASSERT_NE(a.file, nullptr);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_NE(a.bytes, c.bytes);
  EXPECT_EQ(*a.file->GetUint("llama.attention.head_count_kv"), 1u);
  EXPECT_EQ(a.file->FindTensor("blk.1.attn_k.weight")->ne, (std::vector<uint64_t>{256, 64}));
  EXPECT_EQ(a.file->FindTensor("blk.1.attn_k.weight")->type, 1u);
  EXPECT_EQ(*a.file->GetUint("general.file_type"), 1u);
}

TEST(RandomModelTest, BlockSizeFallbackIsReported) {
  // Rows of 320 do not fit q4_K's 256-element blocks: q8_0 instead, like llama-quantize.
  RandomModelShape shape = *RandomModelShapeByName("tiny-llama-mha");
  shape.name = "odd";
  shape.n_embd = 320;
  shape.n_head = 5;
  shape.n_head_kv = 5;
  shape.n_layer = 1;
  const uint32_t q4k = static_cast<uint32_t>(GgmlType::kQ4_K);
  if (GetQuantKernels(GgmlType::kQ4_K, CpuLevel::kScalar) == nullptr) {
    GTEST_SKIP() << "q4_K quantizer not registered yet";
  }
  Built b = Build(shape, q4k, 1);
  ASSERT_NE(b.file, nullptr);
  const uint32_t q8 = static_cast<uint32_t>(GgmlType::kQ8_0);
  EXPECT_EQ(b.file->FindTensor("token_embd.weight")->type, q8);
  EXPECT_EQ(b.file->FindTensor("blk.0.attn_q.weight")->type, q8);
  EXPECT_EQ(b.file->FindTensor("blk.0.ffn_down.weight")->type, q4k);  // rows of n_ff = 512
  EXPECT_EQ(b.file->FindTensor("blk.0.attn_norm.weight")->type, 0u);
  EXPECT_EQ(*b.file->GetUint("general.file_type"), 14u);
  EXPECT_EQ(*b.file->GetUint("general.quantization_version"), 2u);
  ASSERT_FALSE(b.notes.empty());
  EXPECT_THAT(b.notes[0], ::testing::HasSubstr("token_embd.weight"));
  EXPECT_THAT(b.notes[0], ::testing::HasSubstr("q8_0"));
}

TEST(RandomModelTest, VocabFromRealModel) {
  const std::string path = kiln::testing::DefaultModelPath();
  ASSERT_FALSE(path.empty());
  auto real = GgufFile::Open(path);
  ASSERT_TRUE(real.ok()) << real.status();
  RandomModelShape shape = *RandomModelShapeByName("tiny-llama-gqa");
  shape.n_layer = 1;
  shape.tied_output = true;
  Built b = Build(shape, static_cast<uint32_t>(GgmlType::kF16), 1, real->get());
  ASSERT_NE(b.file, nullptr);
  EXPECT_EQ(*b.file->GetUint("llama.vocab_size"), 49152u);
  EXPECT_EQ(*b.file->GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(*b.file->GetString("tokenizer.chat_template"),
            *(*real)->GetString("tokenizer.chat_template"));
  EXPECT_EQ(b.file->GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(b.file->FindTensor("token_embd.weight")->ne, (std::vector<uint64_t>{256, 49152}));
  EXPECT_EQ(b.file->FindTensor("output.weight"), nullptr);
  size_t n_tok_keys = 0;
  for (const KeyValue& kv : (*real)->metadata()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    ++n_tok_keys;
    const KeyValue* copy = b.file->FindKey(kv.key);
    ASSERT_NE(copy, nullptr) << kv.key;
    EXPECT_EQ(copy->type, kv.type);
    ASSERT_EQ(copy->value_size, kv.value_size);
    EXPECT_EQ(std::memcmp(copy->value_data, kv.value_data, kv.value_size), 0) << kv.key;
  }
  EXPECT_EQ(n_tok_keys, 12u);
}

TEST(RandomModelTest, NamesAndErrors) {
  EXPECT_THAT(RandomModelShapeNames(),
              ::testing::ElementsAre("tiny-llama-gqa", "tiny-llama-mha", "tiny-llama-mqa",
                                     "smollm2-135m", "tiny-qwen2", "tiny-qwen2-untied",
                                     "tiny-qwen3", "tiny-llama3", "tiny-phi", "tiny-mistral3",
                                     "tiny-deepseek2", "tiny-deepseek2-lite", "tiny-deepseek2-kvb",
                                     "tiny-deepseek2-moe", "tiny-deepseek2-moe-softmax",
                                     "tiny-deepseek2-yarn", "deepseek2-bench", "llama-1b"));
  for (const std::string& name : RandomModelShapeNames()) {
    auto shape = RandomModelShapeByName(name);
    ASSERT_TRUE(shape.ok()) << name;
    EXPECT_NE(FindArchitecture(shape->arch), nullptr) << name << ": " << shape->arch;
  }
  const RandomModelShape s = *RandomModelShapeByName("smollm2-135m");
  EXPECT_EQ(s.n_embd, 576u);
  EXPECT_EQ(s.n_layer, 30u);
  EXPECT_EQ(s.n_vocab, 49152u);
  EXPECT_TRUE(s.tied_output);
  EXPECT_EQ(BuildTinyVocab(49152).tokens.size(), 49152u);
  auto bad = RandomModelShapeByName("huge");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("tiny-llama-gqa"));
  EXPECT_EQ(*WeightTypeByName("q4_K"), static_cast<uint32_t>(GgmlType::kQ4_K));
  EXPECT_EQ(*WeightTypeByName("bf16"), static_cast<uint32_t>(GgmlType::kBF16));
  EXPECT_EQ(WeightTypeByName("q4_k").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RandomModelTest, UnregisteredArchitectureIsRejected) {
  RandomModelShape shape = *RandomModelShapeByName("tiny-llama-gqa");
  shape.arch = "mamba";
  RandomModelOptions o;
  o.shape = shape;
  GgufWriter w;
  const absl::Status st = BuildRandomModel(o, &w);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("mamba"));
  std::string registered;
  for (std::string_view n : ArchitectureNames()) {
    registered += (registered.empty() ? "" : ", ") + std::string(n);
  }
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("(registered: " + registered + ")"));
  EXPECT_EQ(w.tensor_count(), 0u);
}

// The llama shapes write exactly their architecture's required tensors, in table order (the
// optional biases are left out).
TEST(RandomModelTest, LlamaTensorsFollowTheArchitectureTable) {
  const RandomModelShape shape = *RandomModelShapeByName("tiny-llama-gqa");
  Built b = Build(shape, static_cast<uint32_t>(GgmlType::kQ8_0), 7);
  ASSERT_NE(b.file, nullptr);
  const Architecture* arch = FindArchitecture("llama");
  ASSERT_NE(arch, nullptr);
  ModelHparams hp;
  hp.arch = "llama";
  hp.n_vocab = static_cast<int64_t>(b.file->GetStringArray("tokenizer.ggml.tokens")->size());
  hp.n_embd = 256;
  hp.n_layer = 2;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 64;
  hp.n_ff = 512;
  std::vector<std::string> want;
  for (const TensorSpec& t : arch->Tensors(hp)) {
    if (!t.optional) want.push_back(t.name);
  }
  std::vector<std::string> got;
  for (const TensorInfo& t : b.file->tensors()) got.emplace_back(t.name);
  EXPECT_EQ(got, want);
  EXPECT_EQ(b.file->FindTensor("blk.0.attn_q.bias"), nullptr);
}

// qwen2 shapes: general.architecture "qwen2", qwen2.* keys, Q/K/V biases (no output bias),
// tied or separate head; each loads as a qwen2 model with NEOX rotation.
TEST(RandomModelTest, TinyQwen2KeysTensorsAndLoad) {
  for (const char* name : {"tiny-qwen2", "tiny-qwen2-untied"}) {
    SCOPED_TRACE(name);
    const RandomModelShape shape = *RandomModelShapeByName(name);
    EXPECT_EQ(shape.arch, "qwen2");
    const bool tied = std::string(name) == "tiny-qwen2";
    EXPECT_EQ(shape.tied_output, tied);
    Built b = Build(shape, static_cast<uint32_t>(GgmlType::kF32), 1);
    ASSERT_NE(b.file, nullptr);
    const GgufFile& f = *b.file;
    EXPECT_EQ(*f.GetString("general.architecture"), "qwen2");
    EXPECT_EQ(*f.GetUint("qwen2.block_count"), 2u);
    EXPECT_EQ(*f.GetUint("qwen2.context_length"), 512u);
    EXPECT_EQ(*f.GetUint("qwen2.embedding_length"), 256u);
    EXPECT_EQ(*f.GetUint("qwen2.feed_forward_length"), 512u);
    EXPECT_EQ(*f.GetUint("qwen2.attention.head_count"), 4u);
    EXPECT_EQ(*f.GetUint("qwen2.attention.head_count_kv"), 2u);
    EXPECT_EQ(*f.GetUint("qwen2.rope.dimension_count"), 64u);
    EXPECT_EQ(*f.GetFloat("qwen2.rope.freq_base"), 1000000.0);
    EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("qwen2.attention.layer_norm_rms_epsilon")),
                    1e-6f);
    EXPECT_EQ(f.FindKey("llama.block_count"), nullptr);
    EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");

    const uint64_t n_vocab = *f.GetUint("qwen2.vocab_size");
    EXPECT_EQ(f.tensors().size(), 2u * 12u + 2u + (tied ? 0u : 1u));
    EXPECT_EQ(f.FindTensor("output.weight") == nullptr, tied);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      for (auto [bias, size] : {std::pair{"attn_q.bias", 256u}, std::pair{"attn_k.bias", 128u},
                                std::pair{"attn_v.bias", 128u}}) {
        const TensorInfo* t = f.FindTensor(p + bias);
        ASSERT_NE(t, nullptr) << p << bias;
        EXPECT_EQ(t->ne, (std::vector<uint64_t>{size})) << p << bias;
        EXPECT_EQ(t->type, 0u);
        const std::vector<float> v = F32Values(*t);
        double sum2 = 0;
        for (float x : v) sum2 += double{x} * x;
        EXPECT_NEAR(std::sqrt(sum2 / v.size()), 0.5, 0.1) << p << bias;  // 0.5 N(0,1)
      }
      EXPECT_EQ(f.FindTensor(p + "attn_output.bias"), nullptr);
      EXPECT_EQ(f.FindTensor(p + "attn_q.weight")->ne, (std::vector<uint64_t>{256, 256}));
      EXPECT_EQ(f.FindTensor(p + "attn_k.weight")->ne, (std::vector<uint64_t>{256, 128}));
    }
    EXPECT_EQ(f.FindTensor("token_embd.weight")->ne, (std::vector<uint64_t>{256, n_vocab}));

    const std::string path = kiln::testing::TempDir() + "/" + name + ".gguf";
    GgufWriter w;
    RandomModelOptions o;
    o.shape = shape;
    o.type = static_cast<uint32_t>(GgmlType::kQ8_0);
    ASSERT_TRUE(BuildRandomModel(o, &w).ok());
    ASSERT_TRUE(w.WriteToFile(path).ok());
    ModelLoadOptions load;
    load.path = path;
    auto model = Model::Load(load);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->architecture().name(), "qwen2");
    EXPECT_EQ((*model)->hparams().rope.mode, RopeMode::kNeox);
    EXPECT_EQ((*model)->hparams().tied_output, tied);
    EXPECT_NE((*model)->Tensor("blk.1.attn_v.bias"), nullptr);
  }
}

}  // namespace
}  // namespace kiln::gguf
