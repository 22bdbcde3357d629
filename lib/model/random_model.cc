#include "lib/model/random_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/common/ggml_type.h"
#include "lib/common/half.h"
#include "lib/common/status.h"
#include "lib/common/strings.h"
#include "lib/gguf/file_type.h"
#include "lib/model/architecture.h"
#include "lib/model/hparams.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

// --- deterministic random numbers (splitmix64 + Box-Muller: same bits on every platform)

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform();
    while (u1 <= 0.0) u1 = Uniform();
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

// --- vocabulary

// GPT-2 bytes_to_unicode (GGUF_FACTS.md §5.3): printable bytes map to themselves, the other 68
// map to U+0100.. in byte order. Returns the UTF-8 spelling of byte b.
std::string ByteToken(uint8_t b) {
  auto printable = [](int c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    cp = 0x100 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // < 0x800 for every value here
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// English text the tiny vocabulary's merges are learned from (written for this project).
constexpr std::string_view kTrainingText =
    "The kiln is a small engine that runs language models on the computer in front of you. "
    "It reads a model file, maps its weights into memory, and turns text into tokens and tokens "
    "into text. When you ask it a question, it reads the prompt, thinks about the words one at "
    "a time, and writes an answer back to you. The model does not know anything about the "
    "world beyond what it learned from the text it was trained on, so it can be wrong. "
    "There is a cat in the garden and the cat is looking at the birds in the tree. "
    "The birds are singing, the sun is shining, and the children are playing in the park. "
    "We went to the market in the morning to buy bread, cheese, apples and a bottle of milk. "
    "In the evening we read a book together and talked about the story until it was late. "
    "This is the house that Jack built, and this is the rat that ate the malt that lay in the "
    "house that Jack built. Once upon a time there was a little girl who lived in a village "
    "near the forest. Whenever she went out, the little girl wore a red riding cloak, so "
    "everyone in the village called her Little Red Riding Hood. One morning she asked her "
    "mother if she could go to visit her grandmother, as it had been a while since they had "
    "seen each other. The weather is nice today, and tomorrow it will be even better. "
    "Please write a short poem about the sea. Hello! How are you? I am fine, thank you, and "
    "you? What is the capital of France? The capital of France is Paris. What time is it? "
    "It is ten past three in the afternoon. Count from one to ten: one, two, three, four, "
    "five, six, seven, eight, nine, ten. The quick brown fox jumps over the lazy dog. "
    "Numbers like 12, 345 and 2024 are split into digits. The assistant answers questions, "
    "the user asks them, and the system sets the rules of the conversation.";

// Splits like GPT-2's pre-tokenizer for ASCII: an optional leading space joined to a run of
// letters, digits or other symbols; other whitespace on its own.
std::vector<std::string> SplitWords(std::string_view text) {
  auto cls = [](unsigned char c) {
    if (std::isalpha(c)) return 0;
    if (std::isdigit(c)) return 1;
    if (std::isspace(c)) return 2;
    return 3;
  };
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && cls(text[j + 1]) != 2) ++j;
    const int c = cls(static_cast<unsigned char>(text[j]));
    ++j;
    while (j < text.size() && cls(static_cast<unsigned char>(text[j])) == c) ++j;
    words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

}  // namespace

TinyVocab BuildTinyVocab(uint32_t min_size) {
  TinyVocab v;
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.emplace_back(s);
    v.token_types.push_back(3);  // control
  }
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteToken(static_cast<uint8_t>(b)));
    v.token_types.push_back(1);
  }
  std::set<std::string> known(v.tokens.begin(), v.tokens.end());

  // Word frequencies; each word is a sequence of byte-token symbols.
  std::map<std::string, int> freq;
  for (const std::string& w : SplitWords(kTrainingText)) ++freq[w];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : freq) {
    std::vector<std::string> syms;
    for (unsigned char c : w) syms.push_back(ByteToken(c));
    words.emplace_back(std::move(syms), n);
  }
  constexpr int kMaxMerges = 300;
  for (int m = 0; m < kMaxMerges; ++m) {
    std::map<std::pair<std::string, std::string>, int> pairs;  // ordered: ties -> smallest pair
    for (const auto& [syms, n] : words) {
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_n = 0;
    for (const auto& [p, n] : pairs) {
      if (n > best_n) {
        best = &p;
        best_n = n;
      }
    }
    if (best == nullptr) break;  // every word is a single symbol
    const std::string left = best->first, right = best->second;
    v.merges.push_back(left + " " + right);
    const std::string merged = left + right;
    if (known.insert(merged).second) {
      v.tokens.push_back(merged);
      v.token_types.push_back(1);
    }
    for (auto& [syms, n] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == left && syms[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms = std::move(out);
    }
  }
  for (uint32_t i = 0; v.tokens.size() < min_size; ++i) {
    v.tokens.push_back(absl::StrFormat("<|unused_%d|>", i));
    v.token_types.push_back(5);
  }
  return v;
}

std::vector<std::string> RandomModelShapeNames() {
  return {"tiny-llama-gqa",      "tiny-llama-mha",     "tiny-llama-mqa",
          "smollm2-135m",        "tiny-qwen2",         "tiny-qwen2-untied",
          "tiny-qwen3",          "tiny-llama3",        "tiny-phi",
          "tiny-mistral3",       "tiny-deepseek2",     "tiny-deepseek2-lite",
          "tiny-deepseek2-kvb",  "tiny-deepseek2-moe", "tiny-deepseek2-moe-softmax",
          "tiny-deepseek2-yarn", "deepseek2-bench",    "llama-1b"};
}

absl::StatusOr<RandomModelShape> RandomModelShapeByName(std::string_view name) {
  RandomModelShape s;
  s.name = std::string(name);
  if (name == "tiny-llama-gqa" || name == "tiny-llama-mha" || name == "tiny-llama-mqa") {
    s.arch = "llama";
    s.n_embd = 256;
    s.n_ff = 512;
    s.n_head = 4;
    s.n_head_kv = name == "tiny-llama-gqa" ? 2 : name == "tiny-llama-mha" ? 4 : 1;
    s.n_layer = 2;
    s.n_ctx = 512;
    s.n_vocab = 0;
    s.rope_freq_base = 10000.0f;
    s.rms_eps = 1e-5f;
    s.tied_output = false;
    return s;
  }
  if (name == "smollm2-135m") {
    s.arch = "llama";
    s.n_embd = 576;
    s.n_ff = 1536;
    s.n_head = 9;
    s.n_head_kv = 3;
    s.n_layer = 30;
    s.n_ctx = 8192;
    s.n_vocab = 49152;
    s.rope_freq_base = 100000.0f;
    s.rms_eps = 1e-5f;
    s.tied_output = true;
    return s;
  }
  if (name == "llama-1b") {
    s.arch = "llama";
    s.n_embd = 2048;
    s.n_ff = 5632;
    s.n_head = 32;
    s.n_head_kv = 4;
    s.n_layer = 22;
    s.n_ctx = 2048;
    s.n_vocab = 32000;
    s.tied_output = false;
    return s;
  }
  if (name == "tiny-qwen2" || name == "tiny-qwen2-untied") {
    s.arch = "qwen2";
    s.n_embd = 256;
    s.n_ff = 512;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_layer = 2;
    s.n_ctx = 512;
    s.n_vocab = 0;
    s.rope_freq_base = 1000000.0f;  // Qwen2's
    s.rms_eps = 1e-6f;              // Qwen2's
    s.tied_output = name == "tiny-qwen2";
    return s;
  }
  if (name == "deepseek2-bench") {  // DeepSeek-V2-Lite's attention, scaled down in width
    s.arch = "deepseek2";
    s.n_embd = 1024;
    s.n_ff = 2816;
    s.n_head = 16;
    s.n_head_kv = 16;  // MLA has no KV heads of its own
    s.n_layer = 8;
    s.n_ctx = 4096;
    s.n_head_dim = 192;
    s.mla_rope_dim = 64;
    s.mla_v_head_dim = 128;
    s.kv_lora_rank = 512;
    s.q_lora_rank = 0;
    s.mla_dense_layers = 1;
    s.n_expert = 16;
    s.n_expert_used = 4;
    s.n_expert_shared = 2;
    s.n_ff_exp = 704;
    return s;
  }
  // The shapes of the other families: n_embd 256, n_ff 512, 4 heads, 2 KV heads, 2 layers,
  // context 512, each with its family's hallmarks (see the header).
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_layer = 2;
  s.n_ctx = 512;
  if (name == "tiny-qwen3") {
    s.arch = "qwen3";
    s.n_head_dim = 128;
    s.rope_freq_base = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.tied_output = true;
    return s;
  }
  if (name == "tiny-llama3") {
    s.arch = "llama";
    s.rope_freq_base = 500000.0f;
    s.llama3_rope_factor = 8.0f;
    s.tokenizer_pre = "llama-bpe";
    s.add_bos = true;
    return s;
  }
  if (name == "tiny-phi") {
    s.arch = "phi3";
    s.sliding_window = 16;
    return s;
  }
  if (name == "tiny-mistral3") {
    s.arch = "mistral3";
    s.n_head_dim = 128;
    s.rope_freq_base = 1000000.0f;
    s.attn_temperature_scale = 0.5f;
    s.rope_orig_ctx = 8;
    return s;
  }
  if (name == "tiny-deepseek2" || name == "tiny-deepseek2-lite" || name == "tiny-deepseek2-kvb" ||
      name == "tiny-deepseek2-moe" || name == "tiny-deepseek2-moe-softmax" ||
      name == "tiny-deepseek2-yarn") {
    s.arch = "deepseek2";
    s.n_head_kv = 4;  // MLA has no KV heads of its own; every head decompresses the latent
    s.n_head_dim = 48;
    s.mla_rope_dim = 16;
    s.mla_v_head_dim = 32;
    s.kv_lora_rank = 64;
    s.q_lora_rank = name == "tiny-deepseek2-lite" ? 0 : 128;
    s.mla_combined_kv_b = name == "tiny-deepseek2-kvb";
    if (name == "tiny-deepseek2-moe") {  // DeepSeek-V3's routing in miniature
      s.n_layer = 3;
      s.mla_dense_layers = 1;
      s.n_expert = 8;
      s.n_expert_used = 2;
      s.n_expert_shared = 1;
      s.n_ff_exp = 64;
      s.moe_sigmoid = true;
      s.moe_probs_bias = true;
      s.n_expert_group = 4;
      s.n_expert_group_used = 2;
      s.moe_weights_norm = true;
      s.moe_weights_scale = 2.5f;
    }
    if (name == "tiny-deepseek2-moe-softmax") {  // DeepSeek-V2-Lite's routing in miniature
      s.n_layer = 3;
      s.mla_dense_layers = 1;
      s.n_expert = 8;
      s.n_expert_used = 3;
      s.n_expert_shared = 2;
      s.n_ff_exp = 64;
    }
    if (name == "tiny-deepseek2-yarn") {  // DeepSeek-V2's YaRN (factor 40, mscale_all_dim 0.707)
      s.yarn_factor = 40.0f;
      s.rope_orig_ctx = 64;
      s.yarn_log_mul = 0.0707f;
    }
    return s;
  }

  return absl::NotFoundError(StrCat("unknown model shape '", name, "' (known: ",
                                    absl::StrJoin(RandomModelShapeNames(), ", "), ")"));
}

namespace {

// Encodes rows of f32 values (each `row_len` long) into `type`.
absl::Status EncodeRows(uint32_t type, const float* x, uint64_t n_rows, uint64_t row_len,
                        uint8_t* out) {
  const GgmlTypeInfo info = *GgmlTypeInfoOf(type);
  const size_t row_bytes = GgmlRowBytes(info, row_len);
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      std::memcpy(out, x, n_rows * row_len * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (uint64_t i = 0; i < n_rows * row_len; ++i) {
        const uint16_t h = Fp32ToFp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (uint64_t i = 0; i < n_rows * row_len; ++i) {
        const uint16_t h = Fp32ToBf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return absl::OkStatus();
    default:
      break;
  }
  const QuantKernels* k = GetQuantKernels(static_cast<GgmlType>(type), CpuLevel::kScalar);
  if (k == nullptr || k->quantize == nullptr) {
    return absl::FailedPreconditionError(StrCat("no quantizer is registered for type ",
                                                GgmlTypeName(type),
                                                " yet (lib/quant); pick another --type"));
  }
  for (uint64_t r = 0; r < n_rows; ++r) {
    k->quantize(x + r * row_len, out + r * row_bytes, static_cast<int64_t>(row_len));
  }
  return absl::OkStatus();
}

// The type a tensor of row length `row_len` is stored in when `wanted` is requested.
uint32_t StorageType(uint32_t wanted, uint64_t row_len) {
  if (row_len % GgmlTypeInfoOf(wanted)->block_size == 0) return wanted;
  if (row_len % 32 == 0) return static_cast<uint32_t>(GgmlType::kQ8_0);
  return static_cast<uint32_t>(GgmlType::kF16);
}

// The hyper-parameters the architecture writes and lays its tensor table out from.
ModelHparams HparamsOf(const RandomModelShape& s, uint32_t n_vocab) {
  ModelHparams hp;
  hp.arch = s.arch;
  hp.n_vocab = n_vocab;
  hp.n_ctx_train = s.n_ctx;
  hp.n_embd = s.n_embd;
  hp.n_layer = s.n_layer;
  hp.n_head = s.n_head;
  hp.n_head_kv = s.n_head_kv;
  hp.head_dim = s.head_dim();
  hp.n_ff = s.n_ff;
  hp.rms_eps = s.rms_eps;
  hp.rope.n_rot = static_cast<int32_t>(s.head_dim());
  hp.rope.freq_base = s.rope_freq_base;
  hp.tied_output = s.tied_output;
  hp.sliding_window = s.sliding_window;
  hp.rope.orig_ctx = static_cast<int32_t>(s.rope_orig_ctx != 0 ? s.rope_orig_ctx : s.n_ctx);
  hp.attn_temperature_scale = s.attn_temperature_scale;
  if (s.kv_lora_rank > 0) {
    hp.mla.q_lora_rank = s.q_lora_rank;
    hp.mla.kv_lora_rank = s.kv_lora_rank;
    hp.mla.nope_dim = s.head_dim() - s.mla_rope_dim;
    hp.mla.rope_dim = s.mla_rope_dim;
    hp.mla.v_head_dim = s.mla_v_head_dim;
    hp.mla.split_kv_b = !s.mla_combined_kv_b;
    hp.mla.n_layer_dense_lead = s.n_expert > 0 ? s.mla_dense_layers : s.n_layer;
    hp.rope.n_rot = static_cast<int32_t>(s.mla_rope_dim);
    hp.moe.n_expert = s.n_expert;
    hp.moe.n_expert_used = s.n_expert_used;
    hp.moe.n_expert_shared = s.n_expert_shared;
    hp.moe.n_ff_exp = s.n_ff_exp;
    hp.moe.gating = s.moe_sigmoid ? MoeGating::kSigmoid : MoeGating::kSoftmax;
    hp.moe.n_group = s.n_expert_group;
    hp.moe.n_group_used = s.n_expert_group_used;
    hp.moe.weights_norm = s.moe_weights_norm;
    hp.moe.weights_scale = s.moe_weights_scale;
    hp.moe.has_probs_bias = s.moe_probs_bias;
    if (s.yarn_factor > 0.0f) {
      hp.rope.scaling = RopeScaling::kYarn;
      hp.rope.freq_scale = 1.0f / s.yarn_factor;
      hp.mla.yarn_log_mul = s.yarn_log_mul;
    }
  }
  return hp;
}

bool IsBias(std::string_view tensor_name) {
  constexpr std::string_view kSuffix = ".bias";
  return tensor_name.size() >= kSuffix.size() &&
         tensor_name.substr(tensor_name.size() - kSuffix.size()) == kSuffix;
}

std::string RegisteredNames() {
  std::string names;
  for (std::string_view n : ArchitectureNames()) {
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  return names;
}

}  // namespace

absl::Status BuildRandomModel(const RandomModelOptions& o, gguf::GgufWriter* w) {
  const RandomModelShape& s = o.shape;
  if (s.n_head == 0 || s.n_embd % s.n_head != 0 || s.n_head_kv == 0 ||
      s.n_head % s.n_head_kv != 0 || s.n_layer == 0 || s.n_ff == 0) {
    return absl::InvalidArgumentError(StrCat("inconsistent shape '", s.name, "'"));
  }
  const Architecture* arch = FindArchitecture(s.arch);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(StrCat("shape '", s.name, "': architecture '", s.arch,
                                             "' is not registered (registered: ", RegisteredNames(),
                                             ")"));
  }
  if (!GgmlTypeInfoOf(o.type)) {
    return absl::InvalidArgumentError(StrCat("unknown ggml type id ", o.type));
  }
  auto note = [&](const std::string& msg) {
    if (o.note) o.note(msg);
  };

  // --- vocabulary (its size is a hyper-parameter)
  uint32_t n_vocab = 0;
  TinyVocab own_vocab;
  if (o.vocab_from != nullptr) {
    const gguf::KeyValue* toks = o.vocab_from->FindKey("tokenizer.ggml.tokens");
    if (toks == nullptr || toks->type != gguf::ValueType::kArray ||
        toks->array_type != gguf::ValueType::kString || toks->array_count == 0) {
      return absl::InvalidArgumentError(
          "--vocab-from file has no tokenizer.ggml.tokens string array");
    }
    n_vocab = static_cast<uint32_t>(toks->array_count);
  } else {
    own_vocab = BuildTinyVocab(s.n_vocab);
    n_vocab = static_cast<uint32_t>(own_vocab.tokens.size());
  }
  const ModelHparams hp = HparamsOf(s, n_vocab);

  // --- metadata
  w->SetString("general.architecture", s.arch);
  w->SetString("general.type", "model");
  w->SetString("general.name",
               StrCat("kiln-mkmodel ", s.name, " ", GgmlTypeName(o.type), " seed ", o.seed));
  arch->WriteHparams(hp, w);
  w->SetUint32("general.file_type", gguf::FileTypeOf(o.type));
  if (o.vocab_from != nullptr) {
    size_t copied = 0;
    for (const gguf::KeyValue& kv : o.vocab_from->metadata()) {
      if (kv.key.rfind("tokenizer.", 0) == 0) {
        w->CopyKeyValue(kv);
        ++copied;
      }
    }
    note(absl::StrFormat("copied %d tokenizer keys (%d tokens)", copied, n_vocab));
  } else {
    w->SetString("tokenizer.ggml.model", "gpt2");
    w->SetString("tokenizer.ggml.pre", s.tokenizer_pre);
    w->SetArrayString("tokenizer.ggml.tokens", own_vocab.tokens);
    w->SetArrayInt32("tokenizer.ggml.token_type", own_vocab.token_types);
    w->SetArrayString("tokenizer.ggml.merges", own_vocab.merges);
    w->SetUint32("tokenizer.ggml.bos_token_id", 1);
    w->SetUint32("tokenizer.ggml.eos_token_id", 2);
    w->SetUint32("tokenizer.ggml.unknown_token_id", 0);
    w->SetUint32("tokenizer.ggml.padding_token_id", 2);
    w->SetBool("tokenizer.ggml.add_bos_token", s.add_bos);
    w->SetBool("tokenizer.ggml.add_space_prefix", false);
    w->SetString("tokenizer.chat_template",
                 "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  }
  if (o.type != static_cast<uint32_t>(GgmlType::kF32) &&
      o.type != static_cast<uint32_t>(GgmlType::kF16) &&
      o.type != static_cast<uint32_t>(GgmlType::kBF16)) {
    w->SetUint32("general.quantization_version", 2);
  }
  KILN_RETURN_IF_ERROR(w->status());

  // --- tensors, in the architecture's table order
  Rng rng(o.seed * 0x2545F4914F6CDD1Dull + 0x1234567);
  std::vector<float> values;
  auto add_matrix = [&](const std::string& name, uint64_t row_len, uint64_t n_rows,
                        uint64_t n_mat) -> absl::Status {  // ne = {row_len, n_rows, n_mat}
    // llama-quantize leaves mixture-of-experts routers (ffn_gate_inp) in f32.
    const bool router = name.ends_with("ffn_gate_inp.weight");
    const uint32_t type =
        router ? static_cast<uint32_t>(GgmlType::kF32) : StorageType(o.type, row_len);
    if (type != o.type && !router) {
      note(absl::StrFormat("%s: row length %d is not a multiple of the %s block size; stored as %s",
                           name, row_len, GgmlTypeName(o.type), GgmlTypeName(type)));
    }
    std::vector<uint64_t> ne = {row_len, n_rows};
    if (n_mat > 1) ne.push_back(n_mat);
    n_rows *= n_mat;  // a stack of matrices is stored as their rows, one after the other
    values.resize(row_len * n_rows);
    const float scale = 1.0f / std::sqrt(static_cast<float>(row_len));
    for (float& v : values) v = rng.Normal() * scale;
    std::vector<uint8_t> bytes(GgmlRowBytes(*GgmlTypeInfoOf(type), row_len) * n_rows);
    KILN_RETURN_IF_ERROR(EncodeRows(type, values.data(), n_rows, row_len, bytes.data()));
    return w->AddTensor(name, type, ne, std::move(bytes));
  };
  auto add_vector = [&](const std::string& name, uint64_t n) -> absl::Status {  // [n] f32
    std::vector<float> g(n);
    if (IsBias(name)) {
      for (float& v : g) v = 0.5f * rng.Normal();
    } else {
      for (float& v : g) v = 1.0f + 0.02f * rng.Normal();
    }
    std::vector<uint8_t> bytes(g.size() * 4);
    std::memcpy(bytes.data(), g.data(), bytes.size());
    return w->AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), {n}, std::move(bytes));
  };
  if (s.llama3_rope_factor > 0.0f) {
    // llama.cpp's converter (LlamaModel.generate_extra_tensors) for rope_type "llama3": one
    // divisor per rotated pair, 1 for short wavelengths, the factor for long ones, smoothed
    // between.
    constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOldContext = 8192.0;
    const double low_freq_wavelen = kOldContext / kLowFreqFactor;
    const double high_freq_wavelen = kOldContext / kHighFreqFactor;
    const uint32_t dim = s.head_dim();
    std::vector<float> factors(dim / 2);
    for (uint32_t i = 0; i < dim / 2; ++i) {
      const double freq =
          1.0 / std::pow(static_cast<double>(s.rope_freq_base), static_cast<double>(2 * i) / dim);
      const double wavelen = 2.0 * std::numbers::pi / freq;
      if (wavelen < high_freq_wavelen) {
        factors[i] = 1.0f;
      } else if (wavelen > low_freq_wavelen) {
        factors[i] = s.llama3_rope_factor;
      } else {
        const double smooth =
            (kOldContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
        factors[i] = static_cast<float>(1.0 / ((1.0 - smooth) / s.llama3_rope_factor + smooth));
      }
    }
    std::vector<uint8_t> bytes(factors.size() * 4);
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    KILN_RETURN_IF_ERROR(w->AddTensor("rope_freqs.weight", static_cast<uint32_t>(GgmlType::kF32),
                                      {factors.size()}, std::move(bytes)));
  }
  for (const TensorSpec& t : arch->Tensors(hp)) {
    if (t.optional) continue;
    switch (t.role) {
      case TensorRole::kEmbedding:
      case TensorRole::kMatrix:
        KILN_RETURN_IF_ERROR(add_matrix(t.name, static_cast<uint64_t>(t.n_in),
                                        static_cast<uint64_t>(t.n_out),
                                        static_cast<uint64_t>(t.n_mat)));
        break;
      case TensorRole::kVector:
        KILN_RETURN_IF_ERROR(add_vector(t.name, static_cast<uint64_t>(t.n_in * t.n_out)));
        break;
    }
  }
  return w->status();
}

}  // namespace kiln
