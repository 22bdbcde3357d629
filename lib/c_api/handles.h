// Definitions of the opaque C handles. Only lib/c_api/ includes this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/gguf/gguf.h"
#include "lib/model/model.h"

struct kiln_model {
  std::unique_ptr<kiln::Model> model;
  // Metadata rendered once at load so the C API can hand out stable const char*.
  std::vector<std::string> meta_keys;
  std::vector<std::string> meta_values;
};

struct kiln_gguf {
  std::unique_ptr<kiln::gguf::GgufFile> file;
  std::vector<std::string> meta_keys;
  std::vector<std::string> meta_values;
  std::string unsupported;  // Model::Unsupported, one problem per line
};

#include "lib/sample/sampler.h"
#include "lib/session/session.h"

struct kiln_cache {
  const kiln_model* model = nullptr;
  std::unique_ptr<kiln::Engine> engine;
};

struct kiln_sampler {
  kiln::sample::SamplerParams params;
  uint64_t seed = 0;
};

struct kiln_session {
  const kiln_model* model = nullptr;
  kiln_cache* cache = nullptr;
  std::unique_ptr<kiln::Session> session;
};

#include "lib/engine/strategy.h"

struct kiln_strategy {
  std::unique_ptr<kiln::spec::Strategy> strategy;
};
