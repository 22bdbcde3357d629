// kiln generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//               [--seed S] [--threads N] [--ctx N] [--raw] [--quiet]
//               [--strategy none|ngram|draft:PATH|medusa:PATH|eagle:PATH] [--draft-max K]
//               [--typical-acceptance]
//               [--load-state FILE] [--save-state FILE]
// Streams the continuation to stdout; statistics go to stderr. --load-state continues a saved
// session with its sampler settings and random state (the sampling flags do not apply then; the
// prompt, optional, is appended as the next user turn) and
// --save-state saves the session after generating (docs/session_state.md). The shared flags are
// parsed by ParseGenFlag (gen_common.h), the rest with the same value helpers and messages.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
               "  -q, --quiet         stdout carries only the generated text\n"
               "  --strategy S        speculative decoding: none (default), ngram (prompt\n"
               "                      lookup), draft:PATH (a draft GGUF, see kiln-mkdraft)\n"
               "                      medusa:PATH (Medusa heads, see tools/train/) or\n"
               "                      eagle:PATH (an EAGLE head, docs/speculative.md)\n"
               "  --draft-max K       most draft tokens per step (default: ngram 8, draft 5,\n"
               "                      medusa: the head file's whole tree, eagle: chosen per\n"
               "                      step from the measured pass cost)\n"
               "  --typical-acceptance  medusa and eagle: Medusa's typical acceptance instead\n"
               "                      of exact verification when sampling; LOSSY (the text is\n"
               "                      not distributed as plain sampling), more tokens per step\n"
               "  --load-state FILE   continue a saved session, with its sampler settings and\n"
               "                      random state (-p then adds the next turn)\n"
               "  --save-state FILE   save the session after generating\n%s",
               GenFlagsHelp(GenFlags{}, "to generate").c_str());
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
  std::string strategy_name = "none";
  long long draft_max = 0;  // 0: the strategy's default
  bool typical_acceptance = false;
  std::string load_state, save_state;
  for (size_t i = 0; i < args.size(); ++i) {
    const int r = ParseGenFlag(args, &i, &flags);
    if (r < 0) return 2;
    if (r > 0) continue;
    const std::string& a = args[i];
    if (a == "-p" || a == "--prompt") {
      if (!TakeFlagValue(args, &i, &prompt)) return 2;
      have_prompt = true;
    } else if (a == "--strategy") {
      if (!TakeFlagValue(args, &i, &strategy_name)) return 2;
      if (strategy_name != "none" && strategy_name != "ngram" &&
          strategy_name.rfind("draft:", 0) != 0 && strategy_name.rfind("medusa:", 0) != 0 &&
          strategy_name.rfind("eagle:", 0) != 0) {
        BadFlagValue(a, strategy_name,
                     "must be none, ngram, draft:PATH, medusa:PATH or eagle:PATH");
        return 2;
      }
    } else if (a == "--draft-max") {
      std::string v;
      if (!TakeFlagValue(args, &i, &v) ||
          !ParseIntFlag(a, v, 1, 256, &draft_max, "must be an integer in [1, 256]")) {
        return 2;
      }
    } else if (a == "--typical-acceptance") {
      typical_acceptance = true;
    } else if (a == "--load-state") {
      if (!TakeFlagValue(args, &i, &load_state)) return 2;
    } else if (a == "--save-state") {
      if (!TakeFlagValue(args, &i, &save_state)) return 2;
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
  if (flags.model_path.empty() || (!have_prompt && load_state.empty())) {
    GenerateUsage();
    return 2;
  }
  if (typical_acceptance && strategy_name.rfind("medusa:", 0) != 0 &&
      strategy_name.rfind("eagle:", 0) != 0) {
    std::fprintf(
        stderr, "kiln generate: --typical-acceptance needs --strategy medusa:PATH or eagle:PATH\n");
    return 2;
  }
  kiln_model* model = LoadModelOrReport(flags.model_path);
  if (model == nullptr) return 1;
  kiln_cache* cache = nullptr;
  kiln_sampler* sampler = nullptr;
  kiln_session* session = nullptr;
  kiln_strategy* strategy = nullptr;
  int rc = 1;
  do {
    if (!MakeCacheAndSampler(model, flags, &cache, &sampler)) break;
    std::string text = have_prompt ? prompt : std::string();
    // A raw prompt may spell out special tokens (e.g. a hand-written ChatML turn); they are
    // parsed, as llama.cpp's CLI does with its prompt.
    uint32_t tok_flags = KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL;
    if (have_prompt && !raw) {
      const kiln_chat_message msg = {"user", prompt.c_str()};
      if (!RenderChat(model, {msg}, true, &text)) break;
      tok_flags = KILN_TOKENIZE_PARSE_SPECIAL;  // the template writes BOS itself when it wants
    }
    // A prompt after a restored session continues it: no BOS in the middle.
    if (!load_state.empty()) tok_flags &= ~KILN_TOKENIZE_ADD_SPECIAL;
    std::vector<int32_t> tokens;
    if (!text.empty() && !Tokenize(model, text, tok_flags, &tokens)) break;
    kiln_status s = kiln_session_create(model, cache, sampler, &session);
    if (s != KILN_OK) {
      ReportError("creating the session", s);
      break;
    }
    if (strategy_name == "ngram") {
      kiln_ngram_params np;
      kiln_ngram_params_init(&np, sizeof np);
      if (draft_max > 0) {
        np.max_draft = static_cast<int32_t>(draft_max);
        np.start_draft = std::min(np.start_draft, np.max_draft);
      }
      s = kiln_strategy_create_ngram(&np, &strategy);
    } else if (strategy_name.rfind("draft:", 0) == 0) {
      kiln_draft_params dp;
      kiln_draft_params_init(&dp, sizeof dp);
      if (draft_max > 0) dp.max_draft = static_cast<int32_t>(draft_max);
      dp.n_threads = flags.threads;
      s = kiln_strategy_create_draft(model, strategy_name.c_str() + 6, &dp, &strategy);
    } else if (strategy_name.rfind("medusa:", 0) == 0) {
      kiln_medusa_params mp;
      kiln_medusa_params_init(&mp, sizeof mp);
      if (draft_max > 0) mp.max_draft = static_cast<int32_t>(draft_max);
      mp.typical_acceptance = typical_acceptance ? 1 : 0;
      s = kiln_strategy_create_medusa(model, strategy_name.c_str() + 7, &mp, &strategy);
    } else if (strategy_name.rfind("eagle:", 0) == 0) {
      kiln_eagle_params ep;
      kiln_eagle_params_init(&ep, sizeof ep);
      if (draft_max > 0) ep.tree_tokens = static_cast<int32_t>(draft_max);
      ep.n_threads = flags.threads;
      ep.typical_acceptance = typical_acceptance ? 1 : 0;
      s = kiln_strategy_create_eagle(model, strategy_name.c_str() + 6, &ep, &strategy);
    }
    if (s != KILN_OK) {
      ReportError("creating the strategy", s);
      break;
    }
    if (strategy != nullptr && (s = kiln_session_set_strategy(session, strategy)) != KILN_OK) {
      ReportError("setting the strategy", s);
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
    if (!load_state.empty()) {
      // After set_strategy, so that an n-gram strategy's saved state is restored into it.
      s = kiln_session_load_state_file(session, load_state.c_str());
      if (s != KILN_OK) {
        ReportError("loading the session state", s);
        break;
      }
      if (!quiet) {
        std::fprintf(stderr, "kiln generate: continuing %zu tokens from %s\n",
                     kiln_session_n_tokens(session), load_state.c_str());
      }
    }
    const double t0 = NowSeconds();
    s = tokens.empty() ? KILN_OK
                       : kiln_session_append_tokens(session, tokens.data(), tokens.size());
    if (s != KILN_OK) {
      ReportError("prefill", s);
      break;
    }
    const double t1 = NowSeconds();
    kiln_generate_params gp;
    kiln_generate_params_init(&gp, sizeof gp);
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
    if (strategy != nullptr) {
      kiln_spec_metrics m;
      m.struct_size = sizeof m;
      if (kiln_session_get_spec_metrics(session, &m) == KILN_OK) {
        std::fprintf(stderr,
                     "speculative (%s): drafted %lld, accepted %lld (%.1f%%), mean accepted per "
                     "step %.2f, target passes per token %.3f\n",
                     strategy_name.c_str(), static_cast<long long>(m.drafted),
                     static_cast<long long>(m.accepted),
                     m.drafted > 0
                         ? 100.0 * static_cast<double>(m.accepted) / static_cast<double>(m.drafted)
                         : 0.0,
                     m.mean_accepted_per_step, m.target_passes_per_token);
        if (typical_acceptance) {
          std::fprintf(stderr, "speculative: %lld accepted by the lossy typical acceptance\n",
                       static_cast<long long>(m.accepted_lossy));
        }
      }
    }
    if (!save_state.empty()) {
      s = kiln_session_save_state_file(session, nullptr, save_state.c_str());
      if (s != KILN_OK) {
        ReportError("saving the session state", s);
        break;
      }
      if (!quiet) {
        std::fprintf(stderr, "kiln generate: saved %zu tokens to %s\n",
                     kiln_session_n_tokens(session), save_state.c_str());
      }
    }
    rc = 0;
  } while (false);
  kiln_session_destroy(session);
  kiln_strategy_destroy(strategy);
  kiln_sampler_destroy(sampler);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return rc;
}

}  // namespace kiln_cli
