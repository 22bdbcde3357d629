// Definitions of the opaque C handles. Only lib/c_api/ includes this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/model/model.h"

struct kiln_model {
  std::unique_ptr<kiln::Model> model;
  // Metadata rendered once at load so the C API can hand out stable const char*.
  std::vector<std::string> meta_keys;
  std::vector<std::string> meta_values;
};
