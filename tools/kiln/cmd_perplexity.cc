// kiln perplexity -m MODEL -f FILE [--ctx N] [--threads N] [--chunks N] [--cache-type T]
//
// llama.cpp's llama-perplexity method, replicated: tokenize the whole file (BOS added when the
// vocabulary adds one), cut it into floor(n_tokens / ctx) chunks of ctx tokens, evaluate each
// chunk from an empty context (its first token replaced by BOS when the vocabulary adds one),
// and score only the second half: the logits at positions [ctx/2, ctx - 1) predicting the tokens
// at [ctx/2 + 1, ctx), i.e. ctx - 1 - ctx/2 tokens per chunk. Perplexity = exp(mean NLL) over
// every scored token. Prints the running value per chunk ("[i]ppl,") like llama.cpp, and ends
// with the line "perplexity: <value>".
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tools/kiln/commands.h"
#include "tools/kiln/gen_common.h"

namespace kiln_cli {

int RunPerplexity(const std::vector<std::string>& args) {
  GenFlags flags;
  flags.ctx = 512;  // llama-perplexity's default
  std::string file;
  long long chunks_limit = -1;  // <= 0: every chunk
  for (size_t i = 0; i < args.size(); ++i) {
    const int r = ParseGenFlag(args, &i, &flags);
    if (r < 0) return 2;
    if (r > 0) continue;
    if (args[i] == "-f" || args[i] == "--file") {
      if (!TakeFlagValue(args, &i, &file)) return 2;
    } else if (args[i] == "--chunks") {
      std::string v;
      if (!TakeFlagValue(args, &i, &v) || !ParseIntFlag("--chunks", v, 0, 1 << 30, &chunks_limit)) {
        return 2;
      }
    } else {
      std::fprintf(stderr, "kiln perplexity: unexpected argument '%s'\n", args[i].c_str());
      return 2;
    }
  }
  if (flags.model_path.empty() || file.empty() || flags.ctx < 4) {
    std::fprintf(stderr,
                 "usage: kiln perplexity -m MODEL -f FILE [--ctx N (default 512)] [--threads N] "
                 "[--chunks N] [--cache-type T] [--mla-prefill M]\n"
                 "       [--swa-full]\n");
    return 2;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "kiln perplexity: cannot read '%s'\n", file.c_str());
    return 1;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  kiln_model* model = LoadModelOrReport(flags.model_path);
  if (model == nullptr) return 1;
  kiln_cache* cache = nullptr;
  kiln_session* session = nullptr;
  int rc = 1;
  do {
    kiln_cache_params cp;
    kiln_cache_params_init(&cp, sizeof cp);
    cp.n_threads = flags.threads;
    cp.n_ctx = flags.ctx;
    cp.prefix_caching = 0;  // every chunk is new text
    cp.kv_type = flags.cache_type;
    cp.llama_cpp_order = flags.llama_cpp_order ? 1 : 0;
    cp.mla_prefill = flags.mla_prefill;
    cp.swa_full = flags.swa_full ? 1 : 0;
    kiln_status s = kiln_cache_create(model, &cp, &cache);
    if (s != KILN_OK) {
      ReportError("creating the cache", s);
      break;
    }
    s = kiln_session_create(model, cache, nullptr, &session);
    if (s != KILN_OK) {
      ReportError("creating the session", s);
      break;
    }
    std::vector<int32_t> tokens, bos_probe;
    if (!Tokenize(model, text, KILN_TOKENIZE_ADD_SPECIAL, &tokens)) break;
    if (!Tokenize(model, "", KILN_TOKENIZE_ADD_SPECIAL, &bos_probe)) break;
    kiln_model_info info;
    info.struct_size = sizeof info;
    kiln_model_get_info(model, &info);
    const bool add_bos = !bos_probe.empty() && bos_probe[0] == info.token_bos;
    const size_t ctx = static_cast<size_t>(flags.ctx);
    if (tokens.size() < 2 * ctx) {
      std::fprintf(stderr, "kiln perplexity: %zu tokens; need at least 2 * ctx = %zu\n",
                   tokens.size(), 2 * ctx);
      break;
    }
    size_t n_chunks = tokens.size() / ctx;
    if (chunks_limit > 0 && static_cast<size_t>(chunks_limit) < n_chunks) n_chunks = chunks_limit;
    const size_t first = ctx / 2;
    std::fprintf(stderr,
                 "kiln perplexity: %zu tokens, %zu chunks of %zu, scoring %zu per chunk%s\n",
                 tokens.size(), n_chunks, ctx, ctx - 1 - first, add_bos ? ", BOS first" : "");
    std::vector<int32_t> chunk(ctx);
    std::vector<float> logprobs(ctx - 1);
    double nll = 0, nll2 = 0;
    size_t count = 0;
    const double t0 = NowSeconds();
    bool failed = false;
    for (size_t c = 0; c < n_chunks; ++c) {
      chunk.assign(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
      if (add_bos) chunk[0] = info.token_bos;
      s = kiln_session_rewind(session, kiln_session_n_tokens(session));
      if (s == KILN_OK) {
        s = kiln_session_append_tokens_scored(session, chunk.data(), chunk.size(), logprobs.data());
      }
      if (s != KILN_OK) {
        ReportError("evaluating chunk " + std::to_string(c), s);
        failed = true;
        break;
      }
      // logprobs[j] scores chunk[j + 1]; llama.cpp scores j in [first, ctx - 1).
      for (size_t j = first; j + 1 < ctx; ++j) {
        nll -= logprobs[j];
        nll2 += static_cast<double>(logprobs[j]) * logprobs[j];
        ++count;
      }
      std::printf("[%zu]%.4f,", c + 1, std::exp(nll / count));
      std::fflush(stdout);
    }
    if (failed) break;
    const double secs = NowSeconds() - t0;
    const double mean = nll / count;
    const double ppl = std::exp(mean);
    double var = nll2 / count - mean * mean;
    const double err = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) * ppl : 0.0;
    std::printf("\n");
    std::fprintf(stderr, "kiln perplexity: %zu tokens evaluated in %.1f s (%.1f tok/s)\n",
                 n_chunks * ctx, secs, n_chunks * ctx / secs);
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, err);
    std::printf("perplexity: %.4f\n", ppl);
    rc = 0;
  } while (false);
  kiln_session_destroy(session);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return rc;
}

}  // namespace kiln_cli
