// Subcommands of the `kiln` program. Each returns the process exit code.
#pragma once

#include <kiln/kiln.h>

#include <string>
#include <vector>

namespace kiln_cli {

int RunInfo(const std::vector<std::string>& args);
int RunTokenize(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);
int RunChat(const std::vector<std::string>& args);
int RunPerplexity(const std::vector<std::string>& args);

// Prints "kiln: <what>: <status name>: <message>" to stderr and returns 1.
int ReportError(const std::string& what, kiln_status status);

// Loads a model with default parameters; on failure reports and returns nullptr.
kiln_model* LoadModelOrReport(const std::string& path);

}  // namespace kiln_cli
