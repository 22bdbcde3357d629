// kiln-features -m MODEL -i SAMPLES.tsv -o OUT_PREFIX [-t THREADS] [--max-samples N] [--raw]
//               [--layers L1,L2,...]
//
// For every line `prompt<TAB>answer` of SAMPLES.tsv (backslash escapes \\, \t, \n; what
// tools/train/gen_data.py writes), renders the model's chat template around the prompt, appends
// the answer, tokenizes, and runs the target over it with Engine::Prefill, capturing the final
// hidden state (after the output norm: what the LM head reads) of every position from the last
// prompt token on. --raw: the prompt is the model's whole input as is (its special tokens spelled
// out, as `kiln generate --raw` takes it), without the chat template. --layers: the features are
// instead the outputs of those target layers (ascending; the residual stream after each), back
// to back per row, as EAGLE-3 heads fuse them. Writes:
//   OUT_PREFIX.tokens    int32 little-endian: the tokens of those positions, per sample
//   OUT_PREFIX.features  f16 [rows, width]: the feature of each of those positions (width n_embd,
//                        or n_embd times the number of --layers)
//   OUT_PREFIX.index     text: one line per sample, its row count
// Row i of a sample is the feature at its position p_i; its token is the token at p_i, so head k
// of Medusa (predicting k + 1 tokens ahead) learns tokens[i + 1 + k] from features[i].
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/common/half.h"
#include "lib/engine/engine.h"
#include "lib/model/model.h"
#include "lib/tokenizer/chat_template.h"
#include "lib/tokenizer/tokenizer.h"

namespace {

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

int Usage() {
  std::fprintf(stderr,
               "usage: kiln-features -m MODEL -i SAMPLES.tsv -o OUT_PREFIX [-t THREADS] "
               "[--max-samples N] [--raw] [--layers L1,L2,...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, input, prefix;
  int threads = 1;
  long max_samples = -1;
  bool raw = false;
  std::vector<int32_t> layers;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--raw") {
      raw = true;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    if (a == "-m") {
      model_path = argv[++i];
    } else if (a == "-i") {
      input = argv[++i];
    } else if (a == "-o") {
      prefix = argv[++i];
    } else if (a == "-t") {
      threads = std::atoi(argv[++i]);
    } else if (a == "--max-samples") {
      max_samples = std::atol(argv[++i]);
    } else if (a == "--layers") {
      for (const absl::string_view l : absl::StrSplit(argv[++i], ',')) {
        int32_t layer = -1;
        if (!absl::SimpleAtoi(l, &layer)) return Usage();
        layers.push_back(layer);
      }
    } else {
      return Usage();
    }
  }
  if (model_path.empty() || input.empty() || prefix.empty()) return Usage();
  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) {
    std::fprintf(stderr, "kiln-features: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  kiln::EngineOptions options;
  options.n_threads = threads;
  options.prefix_caching = false;
  options.n_ctx = 4096;
  auto engine = kiln::Engine::Create(**model, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "kiln-features: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const kiln::Tokenizer& tok = (*model)->tokenizer();
  kiln::ChatTemplateTokens chat_tokens;
  if (tok.bos() >= 0) chat_tokens.bos_token = std::string(tok.TokenText(tok.bos()));
  if (tok.eos() >= 0) chat_tokens.eos_token = std::string(tok.TokenText(tok.eos()));
  const int64_t d =
      (*model)->hparams().n_embd * (layers.empty() ? 1 : static_cast<int64_t>(layers.size()));

  std::ifstream in(input);
  std::ofstream tokens_out(prefix + ".tokens", std::ios::binary);
  std::ofstream features_out(prefix + ".features", std::ios::binary);
  std::ofstream index_out(prefix + ".index");
  std::string line;
  long n_samples = 0, n_rows = 0;
  std::vector<uint16_t> half(d);
  while (std::getline(in, line) && (max_samples < 0 || n_samples < max_samples)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    const kiln::ChatMessage user{"user", Unescape(line.substr(0, tab))};
    auto rendered = raw ? absl::StatusOr<std::string>(user.content)
                        : kiln::ApplyChatTemplate((*model)->chat_template(), std::span(&user, 1),
                                                  /*add_generation_prompt=*/true, chat_tokens);
    if (!rendered.ok()) {
      std::fprintf(stderr, "kiln-features: %s\n", std::string(rendered.status().message()).c_str());
      return 1;
    }
    auto prompt_ids = tok.Encode(*rendered, /*add_special=*/true, /*parse_special=*/true);
    auto all_ids = tok.Encode(*rendered + Unescape(line.substr(tab + 1)), true, true);
    if (!prompt_ids.ok() || !all_ids.ok() || all_ids->size() <= prompt_ids->size() ||
        all_ids->size() > 4000) {
      continue;
    }
    const int32_t first = static_cast<int32_t>(prompt_ids->size()) - 1;
    const kiln::SeqId seq =
        (*engine)->Locked([](kiln::KvCache& c, kiln::ForwardPass&) { return c.CreateSequence(); });
    kiln::PrefillRequest request;
    request.seq = seq;
    request.tokens = *all_ids;
    request.logits_from = first;
    request.on_logits = [](int32_t, const float*) {};
    request.hidden_layers = layers;
    request.on_hidden = [&](int32_t index, const float* row) {
      for (int64_t i = 0; i < d; ++i) half[i] = kiln::Fp32ToFp16(row[i]);
      features_out.write(reinterpret_cast<const char*>(half.data()), d * 2);
      tokens_out.write(reinterpret_cast<const char*>(&(*all_ids)[index]), 4);
    };
    const absl::Status st = (*engine)->Prefill(request);
    (*engine)
        ->Locked([&](kiln::KvCache& c, kiln::ForwardPass&) { return c.Free(seq); })
        .IgnoreError();
    if (!st.ok()) {
      std::fprintf(stderr, "kiln-features: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    const long rows = static_cast<long>(all_ids->size()) - first;
    index_out << rows << "\n";
    n_rows += rows;
    ++n_samples;
  }
  std::fprintf(stderr, "kiln-features: %ld samples, %ld rows of %lld features\n", n_samples, n_rows,
               static_cast<long long>(d));
  return 0;
}
