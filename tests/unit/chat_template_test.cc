// Chat templates: every golden rendered by jinja2 (scripts/gen_chat_goldens.py) must come out of
// kiln's native renderer byte for byte, detection must find each template's family, and bad
// input must give InvalidArgument with a message naming what was wrong.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// A minimal JSON reader for goldens.json (objects, arrays, strings, booleans, null, numbers).

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool Has(const std::string& key) const { return object.count(key) != 0; }
  const Json& operator[](const std::string& key) const { return object.at(key); }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  // Parses the whole text; on error sets `error` (with the byte offset) and returns null.
  Json Parse(std::string* error) {
    Json value = Value();
    SkipSpace();
    if (error_.empty() && pos_ != text_.size()) Fail("trailing characters");
    *error = error_;
    return value;
  }

 private:
  void Fail(std::string_view what) {
    if (error_.empty()) error_ = std::string(what) + " at byte " + std::to_string(pos_);
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Consume(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  Json Value() {
    SkipSpace();
    Json v;
    if (pos_ >= text_.size()) {
      Fail("unexpected end");
      return v;
    }
    const char c = text_[pos_];
    if (c == '{') {
      v.kind = Json::Kind::kObject;
      ++pos_;
      SkipSpace();
      if (Consume("}")) return v;
      while (error_.empty()) {
        SkipSpace();
        std::string key = String();
        SkipSpace();
        if (!Consume(":")) Fail("expected ':'");
        v.object[key] = Value();
        SkipSpace();
        if (Consume("}")) break;
        if (!Consume(",")) Fail("expected ',' or '}'");
      }
    } else if (c == '[') {
      v.kind = Json::Kind::kArray;
      ++pos_;
      SkipSpace();
      if (Consume("]")) return v;
      while (error_.empty()) {
        v.array.push_back(Value());
        SkipSpace();
        if (Consume("]")) break;
        if (!Consume(",")) Fail("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind = Json::Kind::kString;
      v.string = String();
    } else if (Consume("true")) {
      v.kind = Json::Kind::kBool;
      v.boolean = true;
    } else if (Consume("false")) {
      v.kind = Json::Kind::kBool;
    } else if (Consume("null")) {
    } else {
      v.kind = Json::Kind::kNumber;
      size_t used = 0;
      try {
        v.number = std::stod(std::string(text_.substr(pos_, 32)), &used);
      } catch (...) {
        used = 0;
      }
      if (used == 0) Fail("unexpected character");
      pos_ += used;
    }
    return v;
  }
  uint32_t Hex4() {
    uint32_t value = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = pos_ < text_.size() ? text_[pos_++] : 'x';
      int d = (h >= '0' && h <= '9')   ? h - '0'
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                       : -1;
      if (d < 0) {
        Fail("bad \\u escape");
        d = 0;
      }
      value = value * 16 + static_cast<uint32_t>(d);
    }
    return value;
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  std::string String() {
    std::string out;
    if (!Consume("\"")) {
      Fail("expected string");
      return out;
    }
    while (error_.empty()) {
      if (pos_ >= text_.size()) {
        Fail("unterminated string");
        break;
      }
      const char c = text_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      const char e = pos_ < text_.size() ? text_[pos_++] : '\0';
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t cp = Hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && Consume("\\u")) {
            const uint32_t low = Hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, &out);
          break;
        }
        default:
          Fail("bad escape");
      }
    }
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string TemplatePath(const std::string& stem) {
  return testing::SourcePath("tests/data/chat/templates/" + stem + ".jinja");
}

// Escapes control characters so a failing comparison is readable.
std::string Visible(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Goldens.

class ChatGoldens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string text = ReadFile(testing::SourcePath("tests/data/chat/goldens.json"));
    ASSERT_FALSE(text.empty()) << "tests/data/chat/goldens.json is missing or empty";
    std::string error;
    goldens_ = std::make_unique<Json>(JsonParser(text).Parse(&error));
    ASSERT_TRUE(error.empty()) << "goldens.json: " << error;
  }
  static void TearDownTestSuite() { goldens_.reset(); }
  static std::unique_ptr<Json> goldens_;
};
std::unique_ptr<Json> ChatGoldens::goldens_;

TEST_F(ChatGoldens, EveryCaseMatchesJinja2) {
  ASSERT_NE(goldens_, nullptr);
  const Json& cases = (*goldens_)["cases"];
  ASSERT_GE(cases.array.size(), 200u);
  std::map<std::string, std::string> sources;
  size_t n_rendered = 0, n_errors = 0;
  for (const Json& c : cases.array) {
    const std::string& name = c["name"].string;
    const std::string& stem = c["template"].string;
    if (!sources.count(stem)) sources[stem] = ReadFile(TemplatePath(stem));
    const std::string& source = sources[stem];
    ASSERT_FALSE(source.empty()) << "template file for " << stem << " is missing";

    std::vector<ChatMessage> messages;
    for (const Json& m : c["messages"].array) {
      messages.push_back({m["role"].string, m["content"].string});
    }
    const ChatTemplateTokens tokens{c["bos_token"].string, c["eos_token"].string};

    absl::StatusOr<ChatTemplateFamily> family = DetectChatTemplate(source);
    ASSERT_TRUE(family.ok()) << name << ": " << family.status();
    EXPECT_EQ(ChatTemplateFamilyName(*family), c["family"].string) << name;

    absl::StatusOr<std::string> rendered =
        ApplyChatTemplate(source, messages, c["add_generation_prompt"].boolean, tokens);
    if (c.Has("error")) {
      ++n_errors;
      EXPECT_FALSE(rendered.ok()) << name << ": jinja2 raised '" << c["error"].string
                                  << "' but kiln rendered '" << Visible(rendered.value_or(""))
                                  << "'";
      if (!rendered.ok()) {
        EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument) << name;
      }
    } else {
      ++n_rendered;
      ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status();
      EXPECT_EQ(Visible(*rendered), Visible(c["expected"].string)) << name;
      EXPECT_EQ(*rendered, c["expected"].string) << name;
    }
  }
  EXPECT_GT(n_rendered, 200u);
  EXPECT_GT(n_errors, 20u);
}

// The same goldens through the family *name* give the same text, except where the template
// source carries a default system prompt that the bare name does not (SmolLM2, Qwen2).
TEST_F(ChatGoldens, FamilyNameRendersLikeOfficialTemplate) {
  ASSERT_NE(goldens_, nullptr);
  size_t checked = 0;
  for (const Json& c : (*goldens_)["cases"].array) {
    const std::string& stem = c["template"].string;
    if (stem == "smollm2" || stem == "qwen2" || c.Has("error")) continue;
    std::vector<ChatMessage> messages;
    for (const Json& m : c["messages"].array) {
      messages.push_back({m["role"].string, m["content"].string});
    }
    const ChatTemplateTokens tokens{c["bos_token"].string, c["eos_token"].string};
    absl::StatusOr<std::string> rendered =
        ApplyChatTemplate(c["family"].string, messages, c["add_generation_prompt"].boolean, tokens);
    ASSERT_TRUE(rendered.ok()) << c["name"].string << ": " << rendered.status();
    EXPECT_EQ(*rendered, c["expected"].string) << c["name"].string;
    ++checked;
  }
  EXPECT_GT(checked, 150u);
}

// ---------------------------------------------------------------------------------------------
// SmolLM2: the real model's template, its default system prompt extracted from the source.

TEST(ChatTemplate, SmolLM2DefaultSystemPromptComesFromTheTemplate) {
  const std::string source = ReadFile(TemplatePath("smollm2"));
  ASSERT_FALSE(source.empty());
  absl::StatusOr<ChatTemplate> parsed = ParseChatTemplate(source);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->family, ChatTemplateFamily::kChatML);
  ASSERT_TRUE(parsed->default_system_prompt.has_value());
  EXPECT_EQ(*parsed->default_system_prompt,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

  // A fine-tune that changes the text renders its own text (escaped "\n" form this time).
  const std::string custom =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are Kiln\\u2019s helper.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  absl::StatusOr<std::string> rendered = ApplyChatTemplate(custom, messages, true, {});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered,
            "<|im_start|>system\nYou are Kiln\xE2\x80\x99s helper.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, SmolLM2TemplateInTheModelMatchesTheStoredCopy) {
  const std::string model = testing::DefaultModelPath();
  if (model.empty()) GTEST_SKIP() << "default model missing (reported by DefaultModelPath)";
  // The stored copy was written by gen_chat_goldens.py from this model; the GGUF string is
  // found verbatim in the file (GGUF strings are stored as raw bytes after a length).
  const std::string stored = ReadFile(TemplatePath("smollm2"));
  std::ifstream in(model, std::ios::binary);
  std::string head(4 << 20, '\0');  // metadata lives at the front of the file
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  EXPECT_NE(head.find(stored), std::string::npos)
      << "tests/data/chat/templates/smollm2.jinja differs from the model's tokenizer.chat_template";
}

// ---------------------------------------------------------------------------------------------
// Detection.

TEST(ChatTemplate, FamilyNamesRoundTrip) {
  const std::vector<ChatTemplateFamily> all = {
      ChatTemplateFamily::kChatML,    ChatTemplateFamily::kLlama2,
      ChatTemplateFamily::kLlama3,    ChatTemplateFamily::kMistral,
      ChatTemplateFamily::kMistralV1, ChatTemplateFamily::kMistralV7,
      ChatTemplateFamily::kGemma,     ChatTemplateFamily::kGemma3,
      ChatTemplateFamily::kDeepSeek,  ChatTemplateFamily::kDeepSeekCoder,
      ChatTemplateFamily::kDeepSeek3, ChatTemplateFamily::kPhi3};
  for (ChatTemplateFamily f : all) {
    const std::string_view name = ChatTemplateFamilyName(f);
    absl::StatusOr<ChatTemplateFamily> detected = DetectChatTemplate(name);
    ASSERT_TRUE(detected.ok()) << name << ": " << detected.status();
    EXPECT_EQ(*detected, f) << name;
    EXPECT_THAT(SupportedChatTemplateNames(), HasSubstr(std::string(name)));
  }
}

TEST(ChatTemplate, DeepSeekCoderDefaultPromptExtractedAndNamed) {
  absl::StatusOr<ChatTemplate> from_source =
      ParseChatTemplate(ReadFile(TemplatePath("deepseek-coder")));
  ASSERT_TRUE(from_source.ok()) << from_source.status();
  absl::StatusOr<ChatTemplate> from_name = ParseChatTemplate("deepseek-coder");
  ASSERT_TRUE(from_name.ok()) << from_name.status();
  ASSERT_TRUE(from_source->default_system_prompt.has_value());
  EXPECT_EQ(from_source->default_system_prompt, from_name->default_system_prompt);
  EXPECT_THAT(*from_source->default_system_prompt,
              ::testing::StartsWith("You are an AI programming assistant"));
}

TEST(ChatTemplate, UnrecognisedTemplateListsSupportedFamilies) {
  absl::StatusOr<ChatTemplateFamily> family =
      DetectChatTemplate("{% for m in messages %}<<{{ m.role }}>> {{ m.content }}{% endfor %}");
  ASSERT_FALSE(family.ok());
  EXPECT_EQ(family.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(family.status().message(), HasSubstr("unrecognised"));
  EXPECT_THAT(family.status().message(), HasSubstr("chatml"));
  EXPECT_THAT(family.status().message(), HasSubstr("deepseek-coder"));

  absl::StatusOr<ChatTemplateFamily> empty = DetectChatTemplate("  \n");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));

  // A misspelt name is not a family name and not a template either.
  absl::StatusOr<ChatTemplateFamily> typo = DetectChatTemplate("llama-3");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, VariantsThatRenderDifferentlyAreRejectedByName) {
  struct Case {
    std::string source;
    std::string expected_words;
  };
  const std::vector<Case> cases = {
      {"{{- bos_token }}{%- set date_string = '26 Jul 2024' %}{{- '<|start_header_id|>system"
       "<|end_header_id|>\\n\\n' }}{{- 'Cutting Knowledge Date: December 2023\\n' }}",
       "Llama-3.1"},
      {"{% for m in messages %}{{'<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + "
       "'<|im_end|>'}}{% endfor %}",
       "Phi-4"},
      {"{{'<｜User｜>' + message['content']}}{% set content = content.split('</think>')[-1] %}",
       "DeepSeek-R1"},
      {"{{ '[AVAILABLE_TOOLS] [' }}{{ '[INST] ' + message['content'] + '[/INST]' }}", "Mistral v3"},
      {"{{ '<|im_start|>system\\nDefault.<|im_end|>' }}{{ '<|im_start|>' + m.role }}",
       "does not have the form"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ChatTemplateFamily> family = DetectChatTemplate(c.source);
    ASSERT_FALSE(family.ok()) << c.expected_words;
    EXPECT_EQ(family.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(family.status().message(), HasSubstr(c.expected_words));
  }
}

TEST(ChatTemplate, DetectsMarkersInMinimalSources) {
  const std::vector<std::pair<std::string, ChatTemplateFamily>> cases = {
      {"{{'<|im_start|>' + message['role']}}", ChatTemplateFamily::kChatML},
      {"{{'<|start_header_id|>' + message['role']}}", ChatTemplateFamily::kLlama3},
      {"{{ '[INST] <<SYS>>\\n' }}", ChatTemplateFamily::kLlama2},
      {"{{ '[INST] ' + message['content'] + ' [/INST]' }}", ChatTemplateFamily::kMistral},
      {"{{ '<start_of_turn>' + role }}", ChatTemplateFamily::kGemma},
      {"{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}", ChatTemplateFamily::kPhi3},
      {"{{ 'User: ' + message['content'] }}{{ 'Assistant:' }}", ChatTemplateFamily::kDeepSeek},
  };
  for (const auto& [source, family] : cases) {
    absl::StatusOr<ChatTemplateFamily> detected = DetectChatTemplate(source);
    ASSERT_TRUE(detected.ok()) << source << ": " << detected.status();
    EXPECT_EQ(*detected, family) << source;
  }
}

// ---------------------------------------------------------------------------------------------
// Errors from bad conversations.

TEST(ChatTemplate, EmptyConversationIsAnError) {
  for (std::string_view name : {"chatml", "llama2", "gemma", "phi3"}) {
    absl::StatusOr<std::string> rendered = ApplyChatTemplate(name, {}, true, {});
    ASSERT_FALSE(rendered.ok()) << name;
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rendered.status().message(), HasSubstr("no messages"));
  }
}

TEST(ChatTemplate, UnknownRoleIsNamedWithItsIndex) {
  const std::vector<ChatMessage> messages = {{"user", "Hi"}, {"tool", "42"}};
  for (std::string_view name : {"chatml", "llama3", "mistral-v7", "deepseek3"}) {
    absl::StatusOr<std::string> rendered = ApplyChatTemplate(name, messages, true, {});
    ASSERT_FALSE(rendered.ok()) << name;
    EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rendered.status().message(), HasSubstr("message 1 has role 'tool'"));
  }
}

TEST(ChatTemplate, AlternationAndSystemErrorsExplainThemselves) {
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  absl::StatusOr<std::string> llama2 = ApplyChatTemplate("llama2", two_users, false, {});
  ASSERT_FALSE(llama2.ok());
  EXPECT_THAT(llama2.status().message(), HasSubstr("alternate"));
  EXPECT_THAT(llama2.status().message(), HasSubstr("'user'"));

  const std::vector<ChatMessage> with_system = {{"system", "s"}, {"user", "u"}};
  absl::StatusOr<std::string> gemma = ApplyChatTemplate("gemma", with_system, true, {});
  ASSERT_FALSE(gemma.ok());
  EXPECT_THAT(gemma.status().message(), HasSubstr("System role not supported"));
  absl::StatusOr<std::string> gemma3 =
      ApplyChatTemplate("gemma3", with_system, true, {"<bos>", ""});
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(*gemma3, "<bos><start_of_turn>user\ns\n\nu<end_of_turn>\n<start_of_turn>model\n");
}

// ---------------------------------------------------------------------------------------------
// Python whitespace semantics (Jinja's trim).

TEST(ChatTemplate, StripMatchesPythonStrip) {
  EXPECT_EQ(StripPythonWhitespace(""), "");
  EXPECT_EQ(StripPythonWhitespace(" \t\n"), "");
  EXPECT_EQ(StripPythonWhitespace("  a b  "), "a b");
  // U+3000, U+00A0, U+2028, U+0085 and \x1c are whitespace to Python; U+200B is not.
  EXPECT_EQ(StripPythonWhitespace("\xE3\x80\x80\xC2\xA0x\xE2\x80\xA8\xC2\x85\x1C"), "x");
  EXPECT_EQ(StripPythonWhitespace("\xE2\x80\x8Bx\xE2\x80\x8B"), "\xE2\x80\x8Bx\xE2\x80\x8B");
  // Invalid UTF-8 is never stripped (and never read out of bounds).
  EXPECT_EQ(StripPythonWhitespace(" \xC2"), "\xC2");
  EXPECT_EQ(StripPythonWhitespace("\x80 "), "\x80");
  EXPECT_EQ(StripPythonWhitespace("\xE3\x80 "), "\xE3\x80");
}

}  // namespace
}  // namespace kiln
