// kiln generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//               [--seed S] [--threads N] [--ctx N] [--raw] [--quiet]
// Streams the continuation to stdout; statistics go to stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/kiln/commands.h"
#include "tools/kiln/gen_common.h"

namespace kiln_cli {
namespace {

void GenerateUsage() {
  std::fprintf(stderr,
               "usage: kiln generate -m MODEL -p PROMPT [options]\n"
               "  -p, --prompt TEXT   the prompt (a user message, unless --raw)\n"
               "  --raw               use the prompt as is, without the chat template\n"
               "  --quiet             stdout carries only the generated text\n%s",
               GenFlagsHelp());
}

int PrintPiece(int32_t, const char* piece, size_t len, void*) {
  std::fwrite(piece, 1, len, stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  GenFlags flags;
  std::string prompt;
  bool have_prompt = false, raw = false, quiet = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const int r = ParseGenFlag(args, &i, &flags);
    if (r < 0) return 2;
    if (r > 0) continue;
    const std::string& a = args[i];
    if ((a == "-p" || a == "--prompt") && i + 1 < args.size()) {
      prompt = args[++i];
      have_prompt = true;
    } else if (a == "--raw") {
      raw = true;
    } else if (a == "--quiet" || a == "-q") {
      quiet = true;
    } else {
      std::fprintf(stderr, "kiln generate: unexpected argument '%s'\n", a.c_str());
      GenerateUsage();
      return 2;
    }
  }
  if (flags.model_path.empty() || !have_prompt) {
    GenerateUsage();
    return 2;
  }
  kiln_model* model = LoadModelOrReport(flags.model_path);
  if (model == nullptr) return 1;
  kiln_cache* cache = nullptr;
  kiln_sampler* sampler = nullptr;
  kiln_session* session = nullptr;
  int rc = 1;
  do {
    if (!MakeCacheAndSampler(model, flags, &cache, &sampler)) break;
    std::string text = prompt;
    uint32_t tok_flags = KILN_TOKENIZE_ADD_SPECIAL;
    if (!raw) {
      const kiln_chat_message msg = {"user", prompt.c_str()};
      if (!RenderChat(model, {msg}, true, &text)) break;
      tok_flags = KILN_TOKENIZE_PARSE_SPECIAL;  // the template writes BOS itself when it wants
    }
    std::vector<int32_t> tokens;
    if (!Tokenize(model, text, tok_flags, &tokens)) break;
    kiln_status s = kiln_session_create(model, cache, sampler, &session);
    if (s != KILN_OK) {
      ReportError("creating the session", s);
      break;
    }
    if (!quiet) {
      kiln_model_info info;
      info.struct_size = sizeof info;
      kiln_model_get_info(model, &info);
      kiln_cache_stats st;
      st.struct_size = sizeof st;
      kiln_cache_get_stats(cache, &st);
      std::fprintf(stderr,
                   "kiln generate: %s (%s), n_ctx %d, temp %.2f, top-k %d, top-p %.2f, "
                   "min-p %.2f, %s\n",
                   info.name, info.architecture, st.n_ctx, flags.temp, flags.top_k, flags.top_p,
                   flags.min_p, raw ? "raw prompt" : "chat template");
    }
    const double t0 = NowSeconds();
    s = kiln_session_append_tokens(session, tokens.data(), tokens.size());
    if (s != KILN_OK) {
      ReportError("prefill", s);
      break;
    }
    const double t1 = NowSeconds();
    kiln_generate_params gp = kiln_generate_default_params();
    gp.max_tokens = flags.n_predict;
    gp.callback = PrintPiece;
    kiln_generate_result result;
    result.struct_size = sizeof result;
    s = kiln_session_generate(session, &gp, &result);
    const double t2 = NowSeconds();
    std::printf("\n");
    std::fflush(stdout);
    if (s != KILN_OK) {
      ReportError("generate", s);
      break;
    }
    std::fprintf(stderr,
                 "prompt: %zu tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | stop: %s\n",
                 tokens.size(), tokens.size() / (t1 - t0), result.n_tokens,
                 result.n_tokens / (t2 - t1), StopReasonName(result.stop_reason));
    rc = 0;
  } while (false);
  kiln_session_destroy(session);
  kiln_sampler_destroy(sampler);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return rc;
}

}  // namespace kiln_cli
