#include "tokenizer/chat_template.h"

#include <array>
#include <concepts>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "lib/tokenizer/unicode.h"

namespace kiln {
namespace {

using Family = ChatTemplateFamily;

// String building. (This system's absl is built with its own absl::string_view, which
// absl::StrCat does not accept from std::string_view, so pieces are appended directly.)
void AppendPiece(std::string* out, std::string_view piece) { out->append(piece); }
template <std::integral N>
void AppendPiece(std::string* out, N number) {
  out->append(std::to_string(number));
}
template <typename... Pieces>
void Append(std::string* out, const Pieces&... pieces) {
  (AppendPiece(out, pieces), ...);
}
template <typename... Pieces>
std::string Cat(const Pieces&... pieces) {
  std::string out;
  Append(&out, pieces...);
  return out;
}
bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

constexpr std::array<std::pair<Family, std::string_view>, 12> kFamilyNames = {{
    {Family::kChatML, "chatml"},
    {Family::kLlama2, "llama2"},
    {Family::kLlama3, "llama3"},
    {Family::kMistral, "mistral"},
    {Family::kMistralV1, "mistral-v1"},
    {Family::kMistralV7, "mistral-v7"},
    {Family::kGemma, "gemma"},
    {Family::kGemma3, "gemma3"},
    {Family::kDeepSeek, "deepseek"},
    {Family::kDeepSeekCoder, "deepseek-coder"},
    {Family::kDeepSeek3, "deepseek3"},
    {Family::kPhi3, "phi3"},
}};

// deepseek-coder-instruct's official default system prompt (used when the caller names the
// family instead of passing the model's template; from source it is extracted instead).
constexpr std::string_view kDeepSeekCoderDefaultSystem =
    "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by "
    "Deepseek Company, and you only answer questions related to computer science. For politically "
    "sensitive questions, security and privacy issues, and other non-computer science questions, "
    "you will refuse to answer\n";

constexpr std::string_view kAlternationError =
    "Conversation roles must alternate user/assistant/user/assistant/...";

// ---------------------------------------------------------------------------------------------
// UTF-8 and Python whitespace.

bool IsPythonSpace(uint32_t cp) {
  if (cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x80) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the UTF-8 sequence at text[pos]; returns its length in bytes, or 0 when invalid.
size_t DecodeUtf8(std::string_view text, size_t pos, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  size_t len;
  uint32_t value;
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    len = 2;
    value = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
    value = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
    value = lead & 0x07;
  } else {
    return 0;
  }
  if (pos + len > text.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(pos + i) & 0x3F);
  }
  *cp = value;
  return len;
}

using unicode::AppendUtf8;

// ---------------------------------------------------------------------------------------------
// A minimal Jinja lexer: the string literals inside {{ }} and {% %} tags, unescaped as jinja2
// does (Python "unicode-escape" after normalising newlines). Enough to extract the default
// system prompts; no expression is evaluated.

struct JinjaLiteral {
  size_t offset;  // byte offset of the opening quote in the source
  std::string value;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Unescapes the body of a literal (between the quotes). Unknown escapes stay as written, as in
// Python.
std::string UnescapeJinjaLiteral(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c == '\r') {  // newline normalisation: \r\n and \r become \n
      out.push_back('\n');
      if (i + 1 < body.size() && body[i + 1] == '\n') ++i;
      continue;
    }
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\n':
        break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        bool ok = i + digits < body.size();  // the digits are body[i + 1 .. i + digits]
        for (size_t k = 1; ok && k <= digits; ++k) {
          const int h = HexValue(body[i + k]);
          if (h < 0) ok = false;
          cp = cp * 16 + static_cast<uint32_t>(h < 0 ? 0 : h);
        }
        if (ok && cp <= 0x10FFFF) {
          AppendUtf8(cp, &out);
          i += digits;
        } else {  // Python would reject the template; keep the text as written
          out.push_back('\\');
          out.push_back(e);
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          AppendUtf8(cp, &out);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

std::vector<JinjaLiteral> JinjaStringLiterals(std::string_view src) {
  std::vector<JinjaLiteral> literals;
  size_t pos = 0;
  while (pos + 1 < src.size()) {
    const size_t open = src.find('{', pos);
    if (open == std::string_view::npos || open + 1 >= src.size()) break;
    const char kind = src[open + 1];
    if (kind == '#') {  // comment: skip to its end
      const size_t close = src.find("#}", open + 2);
      if (close == std::string_view::npos) break;
      pos = close + 2;
      continue;
    }
    if (kind != '{' && kind != '%') {
      pos = open + 1;
      continue;
    }
    const std::string_view closer = kind == '{' ? "}}" : "%}";
    size_t i = open + 2;
    while (i < src.size() && src.substr(i, 2) != closer) {
      const char c = src[i];
      if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
        if (j >= src.size()) return literals;  // unterminated: stop scanning
        literals.push_back({i, UnescapeJinjaLiteral(src.substr(i + 1, j - i - 1))});
        i = j + 1;
      } else {
        ++i;
      }
    }
    pos = i + 2;
  }
  return literals;
}

// ---------------------------------------------------------------------------------------------
// Detection.

absl::Status Unsupported(std::string_view what) {
  return absl::InvalidArgumentError(Cat(
      "chat template: ", what, " is not supported; supported families: ",
      SupportedChatTemplateNames(), " (pass one of these names to choose a template explicitly)"));
}

// ChatML default system prompt: a literal "<|im_start|>system\n<text><|im_end|>\n".
absl::StatusOr<std::optional<std::string>> ChatMLDefaultSystem(std::string_view src) {
  constexpr std::string_view kHead = "<|im_start|>system\n";
  constexpr std::string_view kTail = "<|im_end|>\n";
  for (const JinjaLiteral& lit : JinjaStringLiterals(src)) {
    if (!lit.value.starts_with(kHead)) continue;
    if (!Contains(lit.value, "<|im_end|>")) continue;  // e.g. a head for message content
    if (!lit.value.ends_with(kTail) ||
        lit.value.find("<|im_end|>") != lit.value.size() - kTail.size()) {
      return absl::InvalidArgumentError(
          Cat("chat template: ChatML default system block at byte ", lit.offset,
              " does not have the form '<|im_start|>system\\n...<|im_end|>\\n'; it cannot be "
              "reproduced exactly"));
    }
    return std::optional<std::string>(
        lit.value.substr(kHead.size(), lit.value.size() - kHead.size() - kTail.size()));
  }
  return std::optional<std::string>();
}

// DeepSeek-Coder default system prompt: the first literal after the "not ns.found" test.
absl::StatusOr<std::optional<std::string>> DeepSeekCoderDefaultSystem(std::string_view src) {
  const size_t test = src.find("not ns.found");
  if (test == std::string_view::npos) return std::optional<std::string>();
  for (const JinjaLiteral& lit : JinjaStringLiterals(src)) {
    if (lit.offset > test) return std::optional<std::string>(lit.value);
  }
  return absl::InvalidArgumentError(
      "chat template: DeepSeek-Coder template tests 'not ns.found' but no default system prompt "
      "literal follows it");
}

absl::StatusOr<ChatTemplate> DetectFromSource(std::string_view src) {
  const auto has = [&](std::string_view marker) { return Contains(src, marker); };
  ChatTemplate result;
  if (has("<|start_header_id|>")) {
    if (has("Cutting Knowledge Date") || has("Environment: ipython")) {
      return Unsupported("the Llama-3.1+ template (date/tool preamble in the system turn)");
    }
    result.family = Family::kLlama3;
    return result;
  }
  if (has("<|im_start|>")) {
    if (has("<|im_sep|>")) return Unsupported("the Phi-4 template (<|im_sep|>)");
    result.family = Family::kChatML;
    KILN_ASSIGN_OR_RETURN(result.default_system_prompt, ChatMLDefaultSystem(src));
    return result;
  }
  if (has("<start_of_turn>")) {
    result.family = has("first_user_prefix") ? Family::kGemma3 : Family::kGemma;
    return result;
  }
  if (has("<｜User｜>")) {
    if (has("</think>") || has("<think>")) {
      return Unsupported("the DeepSeek-R1 template (<think> handling)");
    }
    result.family = Family::kDeepSeek3;
    return result;
  }
  if (has("### Instruction:") && has("### Response:")) {
    result.family = Family::kDeepSeekCoder;
    KILN_ASSIGN_OR_RETURN(result.default_system_prompt, DeepSeekCoderDefaultSystem(src));
    return result;
  }
  if (has("[INST]")) {
    if (has("<<SYS>>")) {
      result.family = Family::kLlama2;
    } else if (has("[SYSTEM_PROMPT]")) {
      result.family = Family::kMistralV7;
    } else if (has("[AVAILABLE_TOOLS]")) {
      return Unsupported("the Mistral v3 tool-calling template ([AVAILABLE_TOOLS])");
    } else if (has("system_message")) {
      result.family = Family::kMistralV1;
    } else {
      result.family = Family::kMistral;
    }
    return result;
  }
  if (has("<|user|>") && has("<|end|>")) {
    result.family = Family::kPhi3;
    return result;
  }
  if ((has("'User: '") || has("\"User: \"")) && has("Assistant:")) {
    result.family = Family::kDeepSeek;
    return result;
  }
  return Unsupported(
      "unrecognised template (no known family's markers such as <|im_start|>, "
      "<|start_header_id|>, [INST], <start_of_turn>, <|user|>, <｜User｜>, '### Instruction:' "
      "or 'User: ' were found)");
}

// ---------------------------------------------------------------------------------------------
// Rendering, one function per family. Each mirrors its reference template statement by statement.

using Messages = std::span<const ChatMessage>;

bool IsRole(const ChatMessage& m, std::string_view role) { return m.role == role; }

// The alternation test of the Llama-2/Mistral/Gemma templates:
// (role == 'user') != (index % 2 == 0) raises.
absl::Status CheckAlternation(Messages loop_messages, std::string_view error_text) {
  for (size_t i = 0; i < loop_messages.size(); ++i) {
    if (IsRole(loop_messages[i], "user") != (i % 2 == 0)) {
      return absl::InvalidArgumentError(Cat("chat template: ", error_text, " (message ", i,
                                            " of the turns has role '", loop_messages[i].role,
                                            "')"));
    }
  }
  return absl::OkStatus();
}

std::string RenderChatML(const ChatTemplate& t, Messages messages, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && t.default_system_prompt.has_value() && !IsRole(messages[0], "system")) {
      Append(&out, "<|im_start|>system\n", *t.default_system_prompt, "<|im_end|>\n");
    }
    Append(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

absl::StatusOr<std::string> RenderLlama2(Messages messages, const ChatTemplateTokens& tokens) {
  Messages loop_messages = messages;
  std::optional<std::string_view> system_message;
  if (IsRole(messages[0], "system")) {
    system_message = messages[0].content;
    loop_messages = messages.subspan(1);
  }
  std::string out;
  for (size_t i = 0; i < loop_messages.size(); ++i) {
    const ChatMessage& m = loop_messages[i];
    if (IsRole(m, "user") != (i % 2 == 0)) {
      KILN_RETURN_IF_ERROR(CheckAlternation(loop_messages, kAlternationError));
    }
    std::string content = m.content;
    if (i == 0 && system_message.has_value()) {
      content = Cat("<<SYS>>\n", *system_message, "\n<</SYS>>\n\n", m.content);
    }
    if (IsRole(m, "user")) {
      Append(&out, tokens.bos_token, "[INST] ", StripPythonWhitespace(content), " [/INST]");
    } else if (IsRole(m, "assistant")) {
      Append(&out, " ", StripPythonWhitespace(content), " ", tokens.eos_token);
    }
  }
  return out;
}

std::string RenderLlama3(Messages messages, bool add_generation_prompt,
                         const ChatTemplateTokens& tokens) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += tokens.bos_token;
    Append(&out, "<|start_header_id|>", messages[i].role, "<|end_header_id|>\n\n",
           StripPythonWhitespace(messages[i].content), "<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

absl::StatusOr<std::string> RenderMistral(Messages messages, const ChatTemplateTokens& tokens) {
  std::string out = tokens.bos_token;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (IsRole(m, "user") != (i % 2 == 0)) {
      KILN_RETURN_IF_ERROR(CheckAlternation(messages, kAlternationError));
    }
    if (IsRole(m, "user")) {
      Append(&out, "[INST] ", m.content, " [/INST]");
    } else if (IsRole(m, "assistant")) {
      Append(&out, m.content, tokens.eos_token);
    } else {
      return absl::InvalidArgumentError(
          Cat("chat template: Only user and assistant roles are supported! (message ", i,
              " has role '", m.role, "'; the mistral family has no system role)"));
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderMistralV1(Messages messages, const ChatTemplateTokens& tokens) {
  Messages loop_messages = messages;
  std::optional<std::string_view> system_message;
  if (IsRole(messages[0], "system")) {
    system_message = messages[0].content;
    loop_messages = messages.subspan(1);
  }
  std::string out = tokens.bos_token;
  for (size_t i = 0; i < loop_messages.size(); ++i) {
    const ChatMessage& m = loop_messages[i];
    if (IsRole(m, "user") != (i % 2 == 0)) {
      KILN_RETURN_IF_ERROR(
          CheckAlternation(loop_messages,
                           "After the optional system message, conversation roles must alternate "
                           "user/assistant/user/assistant/..."));
    }
    if (IsRole(m, "user")) {
      if (i == 0 && system_message.has_value()) {
        Append(&out, " [INST] ", *system_message, "\n\n", m.content, " [/INST]");
      } else {
        Append(&out, " [INST] ", m.content, " [/INST]");
      }
    } else if (IsRole(m, "assistant")) {
      Append(&out, " ", m.content, tokens.eos_token);
    } else {
      return absl::InvalidArgumentError(Cat(
          "chat template: Only user and assistant roles are supported, with the exception of an "
          "initial optional system message! (message ",
          i + (system_message.has_value() ? 1 : 0), " has role '", m.role, "')"));
    }
  }
  return out;
}

std::string RenderMistralV7(Messages messages, const ChatTemplateTokens& tokens) {
  std::string out = tokens.bos_token;
  for (const ChatMessage& m : messages) {
    if (IsRole(m, "user")) {
      Append(&out, "[INST] ", m.content, "[/INST]");
    } else if (IsRole(m, "system")) {
      Append(&out, "[SYSTEM_PROMPT] ", m.content, "[/SYSTEM_PROMPT]");
    } else {  // assistant (roles were validated up front)
      Append(&out, " ", m.content, tokens.eos_token);
    }
  }
  return out;
}

// Gemma 1/2 (`gemma3` = false) and Gemma 3 (`gemma3` = true).
absl::StatusOr<std::string> RenderGemma(Messages messages, bool add_generation_prompt,
                                        const ChatTemplateTokens& tokens, bool gemma3) {
  Messages loop_messages = messages;
  std::string first_user_prefix;
  if (IsRole(messages[0], "system")) {
    if (!gemma3) {
      return absl::InvalidArgumentError(
          "chat template: System role not supported (the gemma family has no system role; "
          "message 0 is a system message — gemma3 prepends it to the first user turn instead)");
    }
    first_user_prefix = Cat(messages[0].content, "\n\n");
    loop_messages = messages.subspan(1);
  }
  std::string out = tokens.bos_token;
  for (size_t i = 0; i < loop_messages.size(); ++i) {
    const ChatMessage& m = loop_messages[i];
    if (IsRole(m, "user") != (i % 2 == 0)) {
      KILN_RETURN_IF_ERROR(CheckAlternation(loop_messages, kAlternationError));
    }
    const std::string_view role =
        IsRole(m, "assistant") ? std::string_view("model") : std::string_view(m.role);
    Append(&out, "<start_of_turn>", role, "\n", i == 0 ? first_user_prefix : "",
           StripPythonWhitespace(m.content), "<end_of_turn>\n");
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string RenderDeepSeek(Messages messages, bool add_generation_prompt,
                           const ChatTemplateTokens& tokens) {
  std::string out = tokens.bos_token;
  for (const ChatMessage& m : messages) {
    if (IsRole(m, "user")) {
      Append(&out, "User: ", m.content, "\n\n");
    } else if (IsRole(m, "assistant")) {
      Append(&out, "Assistant: ", m.content, tokens.eos_token);
    } else {
      Append(&out, m.content, "\n\n");
    }
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

std::string RenderDeepSeekCoder(const ChatTemplate& t, Messages messages,
                                bool add_generation_prompt, const ChatTemplateTokens& tokens) {
  bool has_system = false;
  for (const ChatMessage& m : messages) has_system = has_system || IsRole(m, "system");
  std::string out = tokens.bos_token;
  if (!has_system && t.default_system_prompt.has_value()) out += *t.default_system_prompt;
  for (const ChatMessage& m : messages) {
    if (IsRole(m, "system")) {
      out += m.content;
    } else if (IsRole(m, "user")) {
      Append(&out, "### Instruction:\n", m.content, "\n");
    } else {
      Append(&out, "### Response:\n", m.content, "\n<|EOT|>\n");
    }
  }
  if (add_generation_prompt) out += "### Response:\n";
  return out;
}

std::string RenderDeepSeek3(Messages messages, bool add_generation_prompt,
                            const ChatTemplateTokens& tokens) {
  std::string system_prompt;
  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (!IsRole(m, "system")) continue;
    if (!first_system) system_prompt += "\n\n";
    system_prompt += m.content;
    first_system = false;
  }
  std::string out = Cat(tokens.bos_token, system_prompt);
  for (const ChatMessage& m : messages) {
    if (IsRole(m, "user")) {
      Append(&out, "<｜User｜>", m.content);
    } else if (IsRole(m, "assistant")) {
      // The reference template writes the EOS text literally, not eos_token.
      Append(&out, "<｜Assistant｜>", m.content, "<｜end▁of▁sentence｜>");
    }
  }
  if (add_generation_prompt) out += "<｜Assistant｜>";
  return out;
}

std::string RenderPhi3(Messages messages, bool add_generation_prompt,
                       const ChatTemplateTokens& tokens) {
  std::string out;
  for (const ChatMessage& m : messages) {
    Append(&out, "<|", m.role, "|>\n", m.content, "<|end|>\n");
  }
  out += add_generation_prompt ? std::string_view("<|assistant|>\n")
                               : std::string_view(tokens.eos_token);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API.

std::string_view StripPythonWhitespace(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text, begin, &cp);
    if (len == 0 || !IsPythonSpace(cp)) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    // Find the start of the last code point: step back over up to 3 continuation bytes.
    size_t start = end - 1;
    while (start > begin && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(text, start, &cp);
    if (len != end - start || !IsPythonSpace(cp)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

std::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  for (const auto& [f, name] : kFamilyNames) {
    if (f == family) return name;
  }
  return "unknown";
}

std::string SupportedChatTemplateNames() {
  std::string names;
  for (const auto& entry : kFamilyNames) Append(&names, names.empty() ? "" : ", ", entry.second);
  return names;
}

absl::StatusOr<ChatTemplate> ParseChatTemplate(std::string_view template_source_or_name) {
  for (const auto& [family, name] : kFamilyNames) {
    if (template_source_or_name != name) continue;
    ChatTemplate result;
    result.family = family;
    if (family == Family::kDeepSeekCoder) {
      result.default_system_prompt = std::string(kDeepSeekCoderDefaultSystem);
    }
    return result;
  }
  if (StripPythonWhitespace(template_source_or_name).empty()) {
    return absl::InvalidArgumentError(Cat(
        "chat template: the template is empty; pass the model's tokenizer.chat_template or one of "
        "the family names: ",
        SupportedChatTemplateNames()));
  }
  return DetectFromSource(template_source_or_name);
}

absl::StatusOr<ChatTemplateFamily> DetectChatTemplate(std::string_view template_source_or_name) {
  KILN_ASSIGN_OR_RETURN(ChatTemplate parsed, ParseChatTemplate(template_source_or_name));
  return parsed.family;
}

absl::StatusOr<std::string> RenderChatTemplate(const ChatTemplate& chat_template,
                                               std::span<const ChatMessage> messages,
                                               bool add_generation_prompt,
                                               const ChatTemplateTokens& tokens) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("chat template: the conversation has no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          Cat("chat template: message ", i, " has role '", role,
              "'; only 'system', 'user' and 'assistant' are supported"));
    }
  }
  const bool gp = add_generation_prompt;
  switch (chat_template.family) {
    case Family::kChatML:
      return RenderChatML(chat_template, messages, gp);
    case Family::kLlama2:
      return RenderLlama2(messages, tokens);
    case Family::kLlama3:
      return RenderLlama3(messages, gp, tokens);
    case Family::kMistral:
      return RenderMistral(messages, tokens);
    case Family::kMistralV1:
      return RenderMistralV1(messages, tokens);
    case Family::kMistralV7:
      return RenderMistralV7(messages, tokens);
    case Family::kGemma:
      return RenderGemma(messages, gp, tokens, /*gemma3=*/false);
    case Family::kGemma3:
      return RenderGemma(messages, gp, tokens, /*gemma3=*/true);
    case Family::kDeepSeek:
      return RenderDeepSeek(messages, gp, tokens);
    case Family::kDeepSeekCoder:
      return RenderDeepSeekCoder(chat_template, messages, gp, tokens);
    case Family::kDeepSeek3:
      return RenderDeepSeek3(messages, gp, tokens);
    case Family::kPhi3:
      return RenderPhi3(messages, gp, tokens);
  }
  return absl::InvalidArgumentError(
      Cat("chat template: invalid family value ", static_cast<int>(chat_template.family)));
}

absl::StatusOr<std::string> ApplyChatTemplate(std::string_view template_source_or_name,
                                              std::span<const ChatMessage> messages,
                                              bool add_generation_prompt,
                                              const ChatTemplateTokens& tokens) {
  KILN_ASSIGN_OR_RETURN(ChatTemplate parsed, ParseChatTemplate(template_source_or_name));
  return RenderChatTemplate(parsed, messages, add_generation_prompt, tokens);
}

}  // namespace kiln
