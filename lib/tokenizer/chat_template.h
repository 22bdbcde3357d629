// Chat templates: turning a conversation (role, content messages) into the prompt text a chat
// model was trained on.
//
// A GGUF model carries its template as Jinja source (`tokenizer.chat_template`, copied from the
// model's Hugging Face tokenizer_config.json). kiln does not interpret Jinja. It recognises the
// template's *family* from distinctive markers in the source and renders that family natively,
// reproducing byte for byte what the family's reference template renders under Hugging Face
// transformers' apply_chat_template (jinja2 with trim_blocks and lstrip_blocks). The golden test
// (tests/unit/chat_template_test.cc, data from scripts/gen_chat_goldens.py) checks every family
// against jinja2 itself.
//
// Terms:
//   family        one of ChatTemplateFamily: a reference template and its exact rendering rules.
//   default system prompt
//                 text some templates inject when the conversation has no system message
//                 (SmolLM2 and Qwen2 ChatML templates; DeepSeek-Coder). It is extracted from the
//                 template source, so a fine-tune that changes it renders its own text.
//   bos/eos text  the model's BOS/EOS token *text* (e.g. "<s>", "<|begin_of_text|>"), which some
//                 templates write into the prompt. The rendered text therefore may already begin
//                 with the BOS text: tokenize it with special-token parsing and without adding a
//                 second BOS (the same contract as apply_chat_template + add_special_tokens=False).
//
// Thread-safety: every function here is pure (no shared state); call from any thread.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln {

// One turn of a conversation. `role` must be "system", "user" or "assistant"; `content` is any
// UTF-8 text (it is copied into the prompt as is, except where a family's template trims it).
struct ChatMessage {
  std::string role;
  std::string content;
};

// Text of the model's special tokens that templates may reference (`bos_token`, `eos_token`).
// Either may be empty.
struct ChatTemplateTokens {
  std::string bos_token;
  std::string eos_token;
};

// The supported template families. Each names the reference template it reproduces.
enum class ChatTemplateFamily {
  kChatML,     // "<|im_start|>role\n...<|im_end|>\n" (OpenHermes, Qwen2, SmolLM2; optional
               // default system prompt taken from the template source)
  kLlama2,     // Llama-2-chat: "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>"
  kLlama3,     // Meta-Llama-3-Instruct: "<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>"
  kMistral,    // Mistral-7B-Instruct v0.1/v0.2 (original): "[INST] u [/INST]a</s>", no system
  kMistralV1,  // Mistral v1 template with a system prompt: " [INST] sys\n\nu [/INST] a</s>"
  kMistralV7,  // Mistral-Large-2411 "v7": "[SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] a</s>"
  kGemma,      // Gemma 1/2 "<start_of_turn>user\n...<end_of_turn>\n"; a system role is an error
  kGemma3,     // Gemma 3: as Gemma, the system prompt is prepended to the first user turn
  kDeepSeek,   // DeepSeek-LLM-chat / DeepSeek-V2-chat: "User: u\n\nAssistant: a<eos>"
  kDeepSeekCoder,  // deepseek-coder-instruct: "### Instruction:\nu\n### Response:\na\n<|EOT|>\n"
  kDeepSeek3,      // DeepSeek-V3: "<｜User｜>u<｜Assistant｜>a<｜end▁of▁sentence｜>"
  kPhi3,           // Phi-3/3.5-mini: "<|user|>\nu<|end|>\n<|assistant|>\n"
};

// Lower-case name of a family ("chatml", "llama3", "mistral-v7", "deepseek-coder", ...).
std::string_view ChatTemplateFamilyName(ChatTemplateFamily family);

// "chatml, llama2, ..." — every accepted family name, for messages and help text.
std::string SupportedChatTemplateNames();

// A recognised template: its family plus what was extracted from the source.
struct ChatTemplate {
  ChatTemplateFamily family = ChatTemplateFamily::kChatML;
  // Text the template injects when the conversation lacks a system message, or nullopt.
  //   kChatML:        the system *content* (rendered "<|im_start|>system\n" + it + "<|im_end|>\n")
  //                   injected before the first message when that message is not a system one.
  //   kDeepSeekCoder: the text written verbatim after BOS when no message at all is a system one
  //                   (the official text ends with "\n").
  std::optional<std::string> default_system_prompt;
};

// Recognises `template_source_or_name`: either a family name exactly as ChatTemplateFamilyName
// spells it (a caller's choice of template; names carry the family's official default system
// prompt, i.e. none for "chatml"), or Jinja source, recognised by the family's markers.
// Errors (InvalidArgument): an unrecognised template (the message lists the supported families);
// a recognised family in a variant whose rendering differs (e.g. Llama-3.1's date preamble,
// DeepSeek-R1's <think> handling, Phi-4's <|im_sep|>): the message names the variant.
absl::StatusOr<ChatTemplate> ParseChatTemplate(std::string_view template_source_or_name);

// The family of `template_source_or_name` (ParseChatTemplate(...)->family).
absl::StatusOr<ChatTemplateFamily> DetectChatTemplate(std::string_view template_source_or_name);

// Renders `messages` as `chat_template`'s reference template does. `add_generation_prompt`
// appends the header that makes the model answer as the assistant (families whose template
// always ends with a prompt — Llama-2, Mistral — ignore it).
// Errors (InvalidArgument): an empty message list; a role other than system/user/assistant (the
// message names it and its index); whatever the reference template itself rejects, e.g. roles
// that do not alternate user/assistant in Llama-2/Mistral/Gemma, a system message in Gemma 1/2.
absl::StatusOr<std::string> RenderChatTemplate(const ChatTemplate& chat_template,
                                               std::span<const ChatMessage> messages,
                                               bool add_generation_prompt,
                                               const ChatTemplateTokens& tokens);

// ParseChatTemplate + RenderChatTemplate.
absl::StatusOr<std::string> ApplyChatTemplate(std::string_view template_source_or_name,
                                              std::span<const ChatMessage> messages,
                                              bool add_generation_prompt,
                                              const ChatTemplateTokens& tokens);

// Python's str.strip() (what Jinja's `trim` filter and `.strip()` do): removes leading and
// trailing Unicode whitespace (str.isspace: ASCII \t\n\v\f\r space, \x1c-\x1f, U+0085, U+00A0,
// U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) from UTF-8 text. Bytes that
// are not valid UTF-8 are never stripped.
std::string_view StripPythonWhitespace(std::string_view text);

}  // namespace kiln
