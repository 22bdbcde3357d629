// kiln tokenize -m MODEL [--special] [--file F | TEXT]: token ids, space-separated, one line.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tools/kiln/commands.h"

namespace kiln_cli {

int RunTokenize(const std::vector<std::string>& args) {
  std::string model_path, file, text;
  bool special = false, have_text = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "-m" || a == "--model") && i + 1 < args.size()) {
      model_path = args[++i];
    } else if (a == "--file" && i + 1 < args.size()) {
      file = args[++i];
    } else if (a == "--special") {
      special = true;
    } else if (!have_text && (a.empty() || a[0] != '-')) {
      text = a;
      have_text = true;
    } else {
      std::fprintf(stderr, "kiln tokenize: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (model_path.empty() || (file.empty() == !have_text)) {
    std::fprintf(stderr, "usage: kiln tokenize -m MODEL [--special] [--file F | TEXT]\n");
    return 2;
  }
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "kiln tokenize: cannot read '%s'\n", file.c_str());
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  kiln_model* model = LoadModelOrReport(model_path);
  if (model == nullptr) return 1;
  uint32_t flags = KILN_TOKENIZE_ADD_SPECIAL | (special ? KILN_TOKENIZE_PARSE_SPECIAL : 0u);
  size_t n = 0;
  kiln_status s = kiln_tokenize(model, text.data(), text.size(), flags, nullptr, 0, &n);
  std::vector<int32_t> ids(n);
  if (s == KILN_ERR_BUFFER_TOO_SMALL) {
    s = kiln_tokenize(model, text.data(), text.size(), flags, ids.data(), ids.size(), &n);
  }
  kiln_model_destroy(model);
  if (s != KILN_OK) return ReportError("tokenize", s);
  std::string line;
  for (size_t i = 0; i < n; ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace kiln_cli
