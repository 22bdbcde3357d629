// kiln chat -m MODEL [--system TEXT] [sampling flags]: an interactive conversation on
// stdin/stdout with the model's chat template (sampling flags: ParseGenFlag, gen_common.h). Each
// turn renders the whole conversation, keeps the longest prefix the session already holds and
// appends only the rest. "/exit" or EOF ends.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tools/kiln/commands.h"
#include "tools/kiln/gen_common.h"

namespace kiln_cli {
namespace {

constexpr int32_t kChatDefaultNPredict = 512;  // per answer

GenFlags ChatDefaults() {
  GenFlags flags;
  flags.n_predict = kChatDefaultNPredict;
  return flags;
}

void ChatUsage() {
  std::fprintf(stderr,
               "usage: kiln chat -m MODEL [options]   (type /exit or EOF to quit)\n"
               "  --system TEXT       a system message first\n%s",
               GenFlagsHelp(ChatDefaults(), "per answer").c_str());
}

struct Answer {
  std::string text;
};

int Stream(int32_t, const char* piece, size_t len, void* user_data) {
  static_cast<Answer*>(user_data)->text.append(piece, len);
  std::fwrite(piece, 1, len, stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int RunChat(const std::vector<std::string>& args) {
  GenFlags flags = ChatDefaults();
  std::string system;
  for (size_t i = 0; i < args.size(); ++i) {
    const int r = ParseGenFlag(args, &i, &flags);
    if (r < 0) return 2;
    if (r > 0) continue;
    if (args[i] == "--system") {
      if (!TakeFlagValue(args, &i, &system)) return 2;
    } else {
      std::fprintf(stderr, "kiln chat: unexpected argument '%s'\n", args[i].c_str());
      ChatUsage();
      return 2;
    }
  }
  if (flags.model_path.empty()) {
    ChatUsage();
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
    kiln_status s = kiln_session_create(model, cache, sampler, &session);
    if (s != KILN_OK) {
      ReportError("creating the session", s);
      break;
    }
    // Owned message texts; kiln_chat_message points into them.
    std::vector<std::pair<std::string, std::string>> conversation;
    if (!system.empty()) conversation.emplace_back("system", system);
    std::string line;
    bool failed = false;
    while (true) {
      std::printf("> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line.empty()) continue;
      conversation.emplace_back("user", line);
      std::vector<kiln_chat_message> msgs;
      for (const auto& [role, content] : conversation)
        msgs.push_back({role.c_str(), content.c_str()});
      std::string rendered;
      std::vector<int32_t> tokens;
      if (!RenderChat(model, msgs, true, &rendered) ||
          !Tokenize(model, rendered, KILN_TOKENIZE_PARSE_SPECIAL, &tokens)) {
        failed = true;
        break;
      }
      // Keep what the session already holds in common with the new rendering.
      size_t held = 0;
      std::vector<int32_t> have(kiln_session_n_tokens(session));
      s = kiln_session_get_tokens(session, have.data(), have.size(), &held);
      if (s != KILN_OK) {
        ReportError("reading the session", s);
        failed = true;
        break;
      }
      size_t common = 0;
      while (common < held && common < tokens.size() && have[common] == tokens[common]) ++common;
      if (common == tokens.size()) --common;  // recompute the last token for fresh logits
      s = kiln_session_rewind(session, held - common);
      if (s == KILN_OK) {
        s = kiln_session_append_tokens(session, tokens.data() + common, tokens.size() - common);
      }
      if (s != KILN_OK) {
        ReportError("prompt", s);
        failed = true;
        break;
      }
      Answer answer;
      kiln_generate_params gp;
      kiln_generate_params_init(&gp, sizeof gp);
      gp.max_tokens = flags.n_predict;
      gp.callback = Stream;
      gp.user_data = &answer;
      kiln_generate_result result;
      result.struct_size = sizeof result;
      const double t0 = NowSeconds();
      s = kiln_session_generate(session, &gp, &result);
      const double t1 = NowSeconds();
      std::printf("\n");
      if (s != KILN_OK) {
        ReportError("generate", s);
        failed = true;
        break;
      }
      std::fprintf(stderr, "[%zu new prompt tokens (%zu reused), %d tokens, %.1f tok/s]\n",
                   tokens.size() - common, common, result.n_tokens, result.n_tokens / (t1 - t0));
      conversation.emplace_back("assistant", answer.text);
    }
    if (!failed) rc = 0;
  } while (false);
  kiln_session_destroy(session);
  kiln_sampler_destroy(sampler);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return rc;
}

}  // namespace kiln_cli
