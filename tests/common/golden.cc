#include "tests/common/golden.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/common/test_util.h"

namespace kiln::testing {
namespace {

class JsonReader {
 public:
  explicit JsonReader(std::string text) : text_(std::move(text)) {}

  // False on malformed input; `error` then names the byte offset.
  bool Read(Json* out, std::string* error) {
    const bool ok = Value(out) && (SkipSpace(), pos_ == text_.size());
    if (!ok) *error = "malformed JSON at byte offset " + std::to_string(pos_);
    return ok;
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Consume(std::string_view word) {
    if (text_.compare(pos_, word.size(), word) != 0) return false;
    pos_ += word.size();
    return true;
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
      return;
    }
    int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    out->push_back(static_cast<char>(kLead[n] | (cp >> (6 * (n - 1)))));
    for (int i = n - 2; i >= 0; --i)
      out->push_back(static_cast<char>(0x80 | ((cp >> (6 * i)) & 0x3F)));
  }
  bool Hex4(uint32_t* value) {
    if (pos_ + 4 > text_.size()) return false;
    *value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      const int digit = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                        : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                        : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                                    : -1;
      if (digit < 0) return false;
      *value = *value * 16 + static_cast<uint32_t>(digit);
    }
    return true;
  }
  bool String(std::string* out) {
    if (!Consume("\"")) return false;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      const char c = text_[pos_++];
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return false;
      const char e = text_[pos_++];
      static const std::string kFrom = "nrtbf\"\\/", kTo = "\n\r\t\b\f\"\\/";
      if (const size_t k = kFrom.find(e); k != std::string::npos) {
        out->push_back(kTo[k]);
      } else if (e == 'u') {
        uint32_t cp;
        if (!Hex4(&cp)) return false;
        if (cp >= 0xD800 && cp < 0xDC00) {
          uint32_t low;
          if (!Consume("\\u") || !Hex4(&low)) return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        AppendUtf8(cp, out);
      } else {
        return false;
      }
    }
    return Consume("\"");
  }
  bool Value(Json* v) {
    SkipSpace();
    if (pos_ >= text_.size()) return false;
    const char c = text_[pos_];
    if (c == '{') {
      v->kind = Json::kObject;
      ++pos_;
      SkipSpace();
      if (Consume("}")) return true;
      do {
        SkipSpace();
        std::string key;
        if (!String(&key)) return false;
        SkipSpace();
        if (!Consume(":") || !Value(&v->fields[key])) return false;
        SkipSpace();
      } while (Consume(","));
      return Consume("}");
    }
    if (c == '[') {
      v->kind = Json::kArray;
      ++pos_;
      SkipSpace();
      if (Consume("]")) return true;
      do {
        v->items.emplace_back();
        if (!Value(&v->items.back())) return false;
        SkipSpace();
      } while (Consume(","));
      return Consume("]");
    }
    if (c == '"') {
      v->kind = Json::kString;
      return String(&v->str);
    }
    if (Consume("true") || Consume("false")) {
      v->kind = Json::kBool;
      v->boolean = text_[pos_ - 1] == 'e' && text_[pos_ - 2] == 'u';
      return true;
    }
    if (Consume("null")) return true;
    const char* begin = text_.c_str() + pos_;
    char* end = nullptr;
    v->number = std::strtod(begin, &end);
    if (end == begin) return false;
    v->kind = Json::kNumber;
    pos_ += static_cast<size_t>(end - begin);
    return true;
  }

  std::string text_;
  size_t pos_ = 0;
};

}  // namespace

bool ParseJson(std::string text, Json* out, std::string* error) {
  return JsonReader(std::move(text)).Read(out, error);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Json LoadGolden(const std::string& relative, const std::string& generator) {
  const std::string text = ReadFile(SourcePath(relative));
  EXPECT_FALSE(text.empty()) << relative << " is missing; run " << generator;
  Json json;
  std::string error;
  EXPECT_TRUE(ParseJson(text, &json, &error)) << relative << ": " << error;
  return json;
}

Top2 TopTwo(const float* row, int64_t n) {
  Top2 t;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > t.logit[0]) {
      t.id[1] = t.id[0];
      t.logit[1] = t.logit[0];
      t.id[0] = static_cast<int32_t>(i);
      t.logit[0] = row[i];
    } else if (row[i] > t.logit[1]) {
      t.id[1] = static_cast<int32_t>(i);
      t.logit[1] = row[i];
    }
  }
  return t;
}

}  // namespace kiln::testing
