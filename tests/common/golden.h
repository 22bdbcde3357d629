// Helpers of the tests that compare kiln against goldens written by Python (scripts/gen_*.py):
// a small JSON reader (objects, arrays, numbers as double, strings with \u escapes, bools, null:
// enough for what Python's json.dump writes) and the top two logits of a row.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::testing {

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& key) const {
    static const Json kMissing;
    auto it = fields.find(key);
    return it == fields.end() ? kMissing : it->second;
  }
  std::vector<int32_t> Ints() const {
    std::vector<int32_t> out;
    for (const Json& item : items) out.push_back(static_cast<int32_t>(item.number));
    return out;
  }
};

// Parses `text`; false on malformed input, `error` then names the byte offset.
bool ParseJson(std::string text, Json* out, std::string* error);

// The whole file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Reads and parses tests/... `relative` to the source tree; a missing or malformed file fails the
// calling test, naming `generator` (the script that writes it).
Json LoadGolden(const std::string& relative, const std::string& generator);

// Top two logits of a row; ties go to the lowest id (as in the goldens).
struct Top2 {
  int32_t id[2] = {-1, -1};
  float logit[2] = {-INFINITY, -INFINITY};
};
Top2 TopTwo(const float* row, int64_t n);

}  // namespace kiln::testing
