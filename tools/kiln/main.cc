#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/kiln/commands.h"

namespace kiln_cli {

int ReportError(const std::string& what, kiln_status status) {
  std::fprintf(stderr, "kiln: %s: %s: %s\n", what.c_str(), kiln_status_name(status),
               kiln_last_error_message());
  return 1;
}

kiln_model* LoadModelOrReport(const std::string& path) {
  kiln_model_params params;
  kiln_model_params_init(&params, sizeof params);
  params.path = path.c_str();
  kiln_model* model = nullptr;
  kiln_status s = kiln_model_load(&params, &model);
  if (s != KILN_OK) {
    ReportError("loading " + path, s);
    return nullptr;
  }
  return model;
}

}  // namespace kiln_cli

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: kiln <command> [options]\n"
               "commands:\n"
               "  info MODEL                                   metadata summary\n"
               "  tokenize -m MODEL [--special] [--file F | TEXT]  token ids on one line\n"
               "  generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P]\n"
               "           [--min-p P] [--seed S] [--threads N] [--raw] [--quiet]\n"
               "                                               continue a prompt\n"
               "  chat -m MODEL [--system TEXT]                interactive chat\n"
               "  perplexity -m MODEL -f FILE [--ctx N]        llama.cpp-style perplexity\n"
               "  version                                      library version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage();
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "info") return kiln_cli::RunInfo(args);
  if (cmd == "tokenize") return kiln_cli::RunTokenize(args);
  if (cmd == "generate") return kiln_cli::RunGenerate(args);
  if (cmd == "chat") return kiln_cli::RunChat(args);
  if (cmd == "perplexity") return kiln_cli::RunPerplexity(args);
  if (cmd == "version" || cmd == "--version") {
    std::printf("kiln %s (abi %d)\n", kiln_version(), kiln_abi_version());
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    Usage();
    return 0;
  }
  std::fprintf(stderr, "kiln: unknown command '%s'\n", cmd.c_str());
  Usage();
  return 2;
}
