// kiln-chat: a desktop chat app (Dear ImGui on SDL2 + OpenGL 3) on kiln's public C API only.
//
// Each conversation is one kiln session on a shared cache whose worker thread
// (kiln_cache_start_worker) runs the forward passes. The UI thread never waits on generation: a
// send renders the conversation with the model's chat template (kiln_chat_apply_template),
// submits the part of its tokens the session does not hold yet (kiln_session_submit), and every
// frame polls the session for new text (kiln_session_poll). Stop is kiln_session_cancel, "branch
// from here" is kiln_session_fork, the strategy picker attaches an n-gram, Medusa or EAGLE
// strategy (kiln_session_set_strategy) whose metrics give the acceptance rate, and conversations
// are saved and reopened through the session-state API (kiln_session_save_state_file/
// load_state_file) next to a small text file with their messages. Models load on a background
// thread (ModelLoad) whose progress callback feeds a progress bar and carries the cancel button's
// request.
//
// --script FILE drives the same actions the buttons do (samples/chat-desktop/tests/run_test.py
// uses it under Xvfb); --reference FILE recomputes every answer of a transcript with the blocking
// API in a fresh session, which the test compares with what the UI produced.
#include <SDL.h>
#include <backends/imgui_impl_opengl3.h>
#include <backends/imgui_impl_sdl.h>
#include <imgui.h>
#include <imgui_stdlib.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string HomeCacheDir() {
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/kiln";
}

enum class StrategyKind { kNone = 0, kNgram = 1, kMedusa = 2, kEagle = 3 };
constexpr int kStrategyKinds = 4;
const char* const kStrategyNames[] = {"none", "n-gram", "medusa", "eagle"};       // the picker's
const char* const kStrategyScriptNames[] = {"none", "ngram", "medusa", "eagle"};  // `strategy X`

// The strategies that draft with a trained head file, in StrategyKind order from kMedusa: the
// name in their flag (--NAME FILE), the load line (NAME=ok) and errors, and what follows the
// model's name in their head file's name (HeadFileFor).
struct HeadKind {
  const char* name;
  const char* suffix;
};
constexpr HeadKind kHeadKinds[] = {{"medusa", ".medusa.gguf"}, {"eagle", ".eagle.gguf"}};
constexpr size_t kHeads = std::size(kHeadKinds);

// kHeadKinds' index of a head strategy (kMedusa, kEagle).
size_t HeadIndex(StrategyKind kind) {
  return static_cast<size_t>(kind) - static_cast<size_t>(StrategyKind::kMedusa);
}

struct Options {
  std::string model_path = HomeCacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string model_dir = HomeCacheDir();            // where the model picker lists .gguf files
  std::string save_dir = HomeCacheDir() + "/chats";  // saved conversations
  // --medusa FILE, --eagle FILE (kHeadKinds' order); empty: HeadFileFor(the model) when it exists
  std::string head_files[kHeads];
  int max_tokens = 256;  // per answer
  int n_ctx = 2048;
  int threads = 0;  // 0: kiln's default (physical cores)
  int width = 1000;
  int height = 680;
  std::string script;     // --script FILE: scripted UI actions, then quit
  std::string reference;  // --reference FILE: recompute a transcript's answers, no window
};

std::string KilnError(const char* what, kiln_status s) {
  return std::string(what) + ": " + kiln_status_name(s) + ": " + kiln_last_error_message();
}

// ---------------------------------------------------------------- messages and their text form

struct Message {
  std::string role;  // "user" or "assistant"
  std::string content;
};

// One message per line in transcripts and .chat files: "role: content" with '\' and newlines
// escaped, so a message never spans lines.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      out += s[i + 1] == 'n' ? '\n' : s[i + 1];
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool ParseMessageLine(const std::string& line, Message* out) {
  size_t colon = line.find(": ");
  if (colon == std::string::npos) return false;
  out->role = line.substr(0, colon);
  if (out->role != "user" && out->role != "assistant" && out->role != "system") return false;
  out->content = Unescape(line.substr(colon + 2));
  return true;
}

// A transcript block: "--- conversation TITLE", one line per message, "--- end".
std::string FormatConversation(const std::string& title, const std::vector<Message>& messages) {
  std::string out = "--- conversation " + title + "\n";
  for (const Message& m : messages) out += m.role + ": " + Escape(m.content) + "\n";
  return out + "--- end\n";
}

// The conversation rendered with the model's chat template, ending with the assistant header.
bool RenderPrompt(const kiln_model* model, const std::vector<Message>& messages, std::string* out,
                  std::string* error) {
  std::vector<kiln_chat_message> chat;
  for (const Message& m : messages) chat.push_back({m.role.c_str(), m.content.c_str()});
  size_t len = 0;
  kiln_status s =
      kiln_chat_apply_template(model, nullptr, chat.data(), chat.size(), 1, nullptr, 0, &len);
  if (s != KILN_OK && s != KILN_ERR_BUFFER_TOO_SMALL) {
    *error = KilnError("chat template", s);
    return false;
  }
  out->resize(len);
  s = kiln_chat_apply_template(model, nullptr, chat.data(), chat.size(), 1, out->data(),
                               out->size(), &len);
  if (s != KILN_OK) {
    *error = KilnError("chat template", s);
    return false;
  }
  out->resize(len);
  return true;
}

bool Tokenize(const kiln_model* model, const std::string& text, std::vector<int32_t>* tokens,
              std::string* error) {
  size_t n = 0;
  // The template writes the control tokens ("<|im_start|>") and any BOS itself.
  const uint32_t flags = KILN_TOKENIZE_PARSE_SPECIAL;
  kiln_status s = kiln_tokenize(model, text.data(), text.size(), flags, nullptr, 0, &n);
  if (s != KILN_OK && s != KILN_ERR_BUFFER_TOO_SMALL) {
    *error = KilnError("tokenize", s);
    return false;
  }
  tokens->resize(n);
  s = kiln_tokenize(model, text.data(), text.size(), flags, tokens->data(), tokens->size(), &n);
  if (s != KILN_OK) {
    *error = KilnError("tokenize", s);
    return false;
  }
  return true;
}

const char* StopReasonName(kiln_stop_reason reason) {
  switch (reason) {
    case KILN_STOP_EOG:
      return "eog";
    case KILN_STOP_MAX_TOKENS:
      return "max_tokens";
    case KILN_STOP_STRING:
      return "string";
    case KILN_STOP_CALLBACK:
      return "callback";
    case KILN_STOP_CANCELLED:
      return "cancelled";
    case KILN_STOP_CONTEXT_FULL:
      return "context_full";
  }
  return "unknown";
}

// ---------------------------------------------------------------- conversations

// The trained head that goes with a model: "<dir>/<name up to its first dot><suffix>"
// (SmolLM2-135M-Instruct.Q4_1.gguf, ".medusa.gguf" -> SmolLM2-135M-Instruct.medusa.gguf), in
// the model's directory or else in the repository's models/ (KILN_CHAT_HEAD_DIR, set by the
// build).
std::string HeadFileFor(const std::string& model_path, const char* suffix) {
  const std::string stem = fs::path(model_path).filename().string();
  const std::string name = stem.substr(0, stem.find('.')) + suffix;
  std::error_code ec;
  fs::path beside = fs::path(model_path).parent_path() / name;
  if (fs::exists(beside, ec)) return beside.string();
#ifdef KILN_CHAT_HEAD_DIR
  fs::path in_repo = fs::path(KILN_CHAT_HEAD_DIR) / name;
  if (fs::exists(in_repo, ec)) return in_repo.string();
#endif
  return "";
}

// A head file for a model and whether it fits it.
struct Head {
  std::string file;   // "" when there is none to try
  std::string error;  // why it does not fit the model ("" when it does, or was not tried)
};

// The strategy of kHeadKinds[head] from `file` for `model`, with kiln's defaults; NULL, with
// kiln's error (naming the file, and for a head trained for another model what differs) in
// `error`, when it does not fit.
kiln_strategy* CreateHeadStrategy(const kiln_model* model, size_t head, const std::string& file,
                                  std::string* error) {
  kiln_strategy* strategy = nullptr;
  kiln_status s;
  if (head == HeadIndex(StrategyKind::kMedusa)) {
    kiln_medusa_params params;
    kiln_medusa_params_init(&params, sizeof params);
    s = kiln_strategy_create_medusa(model, file.c_str(), &params, &strategy);
  } else {
    kiln_eagle_params params;
    kiln_eagle_params_init(&params, sizeof params);
    s = kiln_strategy_create_eagle(model, file.c_str(), &params, &strategy);
  }
  if (s != KILN_OK) {
    *error = KilnError((std::string(kHeadKinds[head].name) + " head " + file).c_str(), s);
  }
  return strategy;
}

struct Conversation {
  std::string title;
  std::vector<Message> messages;
  kiln_session* session = nullptr;
  kiln_strategy* strategy = nullptr;  // owned; NULL also for a fork, whose clone the session owns
  StrategyKind strategy_kind = StrategyKind::kNone;
  bool generating = false;
  Clock::time_point first_token_time;
  int32_t n_generated = 0;         // tokens of the answer in flight (or the last one)
  double tokens_per_s = 0;         // decode speed of the answer in flight (or the last one)
  kiln_spec_metrics metrics = {};  // cumulative, read when an answer ends
  std::string error;               // the last failure, shown under the messages
  bool answer_finished = false;    // set when an answer ends; the script's `wait` consumes it

  ~Conversation() {
    kiln_session_destroy(session);  // cancels a request in flight first
    kiln_strategy_destroy(strategy);
  }
};

// What a load takes off the UI thread to destroy: the old model with its cache and sessions.
struct RetiredModel {
  std::vector<std::unique_ptr<Conversation>> conversations;
  kiln_cache* cache = nullptr;
  kiln_model* model = nullptr;

  void Destroy() {
    conversations.clear();  // sessions before their cache, the cache before its model
    kiln_cache_destroy(cache);
    kiln_model_destroy(model);
    cache = nullptr;
    model = nullptr;
  }
};

// A model load on its own thread, so that the UI thread never waits on one: it retires the
// previous model (its conversations, cache and model, whose destruction waits for the cache's
// worker), loads the file with a progress callback that feeds the progress bar and carries the
// cancel request, creates the cache and starts its worker, and tries the trained heads (Medusa,
// EAGLE) on the new model. The UI thread reads `progress` every frame and takes the result once
// `done` is set.
struct ModelLoad {
  // Set before the thread starts, then read only (but for the heads' errors, below).
  std::string path;
  Head heads[kHeads];  // their files; the thread sets the errors of those that do not fit
  int n_ctx = 0;
  int threads = 0;

  std::atomic<float> progress{0};  // the last value kiln_model_load reported, in [0, 1]
  std::atomic<int> progress_calls{0};
  std::atomic<bool> cancel{false};  // set by the UI; the next progress call returns non-zero
  std::atomic<bool> done{false};    // set last by the thread (release)

  // The result: written by the thread before `done`, read by the UI thread after it.
  kiln_model* model = nullptr;
  kiln_cache* cache = nullptr;
  kiln_status status = KILN_OK;
  std::string error;  // names the file on failure

  // UI thread only.
  Clock::time_point start = Clock::now();
  int frames = 0;  // frames that found the load still running
  std::thread thread;

  static int OnProgress(float value, void* user_data) {
    auto* load = static_cast<ModelLoad*>(user_data);
    load->progress.store(value, std::memory_order_relaxed);
    load->progress_calls.fetch_add(1, std::memory_order_relaxed);
    return load->cancel.load(std::memory_order_relaxed) ? 1 : 0;
  }

  void Run(RetiredModel retired) {
    retired.Destroy();
    kiln_model_params mp;
    kiln_model_params_init(&mp, sizeof mp);
    mp.path = path.c_str();
    mp.progress = &ModelLoad::OnProgress;
    mp.progress_user_data = this;
    status = kiln_model_load(&mp, &model);
    if (status != KILN_OK) {
      error = KilnError(("load " + path).c_str(), status);
    } else if (cancel.load()) {  // after the last progress call: nothing else to wait for
      status = KILN_ERR_CANCELLED;
      error = "load " + path + ": cancelled";
    } else {
      kiln_cache_params cp;
      kiln_cache_params_init(&cp, sizeof cp);
      cp.n_ctx = n_ctx;
      cp.n_threads = threads;
      if ((status = kiln_cache_create(model, &cp, &cache)) != KILN_OK ||
          (status = kiln_cache_start_worker(cache)) != KILN_OK) {
        error = KilnError(("create the cache for " + path).c_str(), status);
      }
    }
    for (size_t i = 0; i < kHeads && status == KILN_OK; ++i) {
      // Tried once here (it reads the head file); a conversation that picks it creates its own.
      if (!heads[i].file.empty()) {
        kiln_strategy_destroy(CreateHeadStrategy(model, i, heads[i].file, &heads[i].error));
      }
    }
    if (status != KILN_OK) {
      kiln_cache_destroy(cache);
      kiln_model_destroy(model);
      cache = nullptr;
      model = nullptr;
    }
    done.store(true, std::memory_order_release);
  }
};

struct App {
  Options opt;
  kiln_model* model = nullptr;
  kiln_cache* cache = nullptr;
  std::string model_error;
  std::unique_ptr<ModelLoad> load;  // the load in flight, if any
  Head heads[kHeads];               // the head files tried on the model
  std::vector<std::unique_ptr<Conversation>> conversations;
  size_t current = 0;
  std::string input;
  std::string model_path_field;
  std::string save_name = "chat";
  int next_chat_number = 1;
  bool request_scroll = false;

  ~App() {
    // Closing the window during a load: the load stops at its next progress call (or after the
    // cache it is creating) and is waited for here, at exit only.
    if (load != nullptr) {
      load->cancel = true;
      load->thread.join();
      kiln_cache_destroy(load->cache);
      kiln_model_destroy(load->model);
    }
    RetiredModel{std::move(conversations), cache, model}.Destroy();
  }

  Conversation* Current() {
    return current < conversations.size() ? conversations[current].get() : nullptr;
  }

  bool Loading() const { return load != nullptr; }

  // Starts loading `path` on a background thread and returns at once. Every open conversation
  // belongs to the old model's cache, so they close now (saved ones stay on disk) and the load's
  // thread destroys them with the old model. Until the load ends there is no model.
  bool StartLoad(const std::string& path) {
    if (Loading()) {
      model_error = "load " + path + ": another load is in progress";
      return false;
    }
    model_error.clear();
    opt.model_path = path;
    model_path_field = path;
    load = std::make_unique<ModelLoad>();
    load->path = path;
    for (size_t i = 0; i < kHeads; ++i) {
      load->heads[i].file =
          !opt.head_files[i].empty() ? opt.head_files[i] : HeadFileFor(path, kHeadKinds[i].suffix);
      heads[i] = {load->heads[i].file, ""};
    }
    load->n_ctx = opt.n_ctx;
    load->threads = opt.threads;
    RetiredModel retired{std::move(conversations), cache, model};
    conversations.clear();
    current = 0;
    cache = nullptr;
    model = nullptr;
    load->thread =
        std::thread([l = load.get(), r = std::move(retired)]() mutable { l->Run(std::move(r)); });
    return true;
  }

  void CancelLoad() {
    if (load != nullptr) load->cancel = true;
  }

  // Called every frame: counts the frame, and takes the model once the load is done (the join
  // then waits only for the thread to return).
  void PollLoad() {
    if (load == nullptr) return;
    if (!load->done.load(std::memory_order_acquire)) {
      ++load->frames;
      return;
    }
    load->thread.join();
    std::unique_ptr<ModelLoad> finished = std::move(load);
    const double seconds = std::chrono::duration<double>(Clock::now() - finished->start).count();
    std::string fits;  // " medusa=ok eagle=none"
    for (size_t i = 0; i < kHeads; ++i) {
      const Head& head = finished->heads[i];
      fits += std::string(" ") + kHeadKinds[i].name + "=" +
              (head.file.empty()             ? "none"
               : finished->status != KILN_OK ? "untried"
               : head.error.empty()          ? "ok"
                                             : "unfit");
    }
    std::printf("--- load status=%s frames=%d progress_calls=%d seconds=%.2f%s\n",
                kiln_status_name(finished->status), finished->frames,
                finished->progress_calls.load(), seconds, fits.c_str());
    std::fflush(stdout);
    if (finished->status != KILN_OK) {
      model_error = finished->error;
      std::printf("--- load error: %s\n", model_error.c_str());
      std::fflush(stdout);
      return;
    }
    model = finished->model;
    cache = finished->cache;
    for (size_t i = 0; i < kHeads; ++i) heads[i].error = finished->heads[i].error;
    NewConversation();
  }

  // The picker offers none and n-gram always, and a head strategy (Medusa, EAGLE) when a head
  // file exists for the model and fits it (the load tried it); for one that does not fit, the bar
  // shows kiln's error instead.
  bool Offered(StrategyKind kind) const {
    if (kind == StrategyKind::kNone || kind == StrategyKind::kNgram) return true;
    const Head& head = heads[HeadIndex(kind)];
    return model != nullptr && !head.file.empty() && head.error.empty();
  }

  Conversation* AddConversation(std::unique_ptr<Conversation> conv) {
    conversations.push_back(std::move(conv));
    current = conversations.size() - 1;
    request_scroll = true;
    return conversations.back().get();
  }

  Conversation* NewConversation() {
    if (model == nullptr) return nullptr;
    auto conv = std::make_unique<Conversation>();
    kiln_status s = kiln_session_create(model, cache, nullptr, &conv->session);  // greedy
    if (s != KILN_OK) {
      model_error = KilnError("create session", s);
      return nullptr;
    }
    conv->title = "Chat " + std::to_string(next_chat_number++);
    return AddConversation(std::move(conv));
  }

  // Starts the answer to `text` and returns at once. The session keeps the tokens of the
  // conversation so far; the new prompt is the whole conversation rendered again, and only what
  // follows the longest common prefix with the session's tokens is submitted (after rewinding
  // the rest), so each turn computes just its new tokens and the answer is the one a fresh
  // session would give for the whole prompt.
  bool Send(Conversation* conv, const std::string& text) {
    if (conv == nullptr || conv->generating || text.empty()) return false;
    conv->error.clear();
    std::vector<Message> messages = conv->messages;
    messages.push_back({"user", text});
    std::string prompt;
    std::vector<int32_t> prompt_tokens;
    if (!RenderPrompt(model, messages, &prompt, &conv->error) ||
        !Tokenize(model, prompt, &prompt_tokens, &conv->error)) {
      return false;
    }
    size_t n_held = 0;
    kiln_status s = kiln_session_get_tokens(conv->session, nullptr, 0, &n_held);
    std::vector<int32_t> held(n_held);
    if (s == KILN_ERR_BUFFER_TOO_SMALL) {
      s = kiln_session_get_tokens(conv->session, held.data(), held.size(), &n_held);
    }
    if (s != KILN_OK) {
      conv->error = KilnError("session tokens", s);
      return false;
    }
    size_t common = 0;
    // At least one prompt token is submitted so the request has a prompt to compute logits from.
    while (common < held.size() && common + 1 < prompt_tokens.size() &&
           held[common] == prompt_tokens[common]) {
      ++common;
    }
    if ((s = kiln_session_rewind(conv->session, held.size() - common)) != KILN_OK) {
      conv->error = KilnError("rewind", s);
      return false;
    }
    kiln_request_params rp;
    kiln_request_params_init(&rp, sizeof rp);
    rp.tokens = prompt_tokens.data() + common;
    rp.n_tokens = prompt_tokens.size() - common;
    rp.max_tokens = opt.max_tokens;
    if ((s = kiln_session_submit(conv->session, &rp)) != KILN_OK) {
      conv->error = KilnError("submit", s);
      return false;
    }
    conv->messages = std::move(messages);
    conv->messages.push_back({"assistant", ""});
    conv->generating = true;
    conv->answer_finished = false;
    conv->n_generated = 0;
    conv->tokens_per_s = 0;
    request_scroll = true;
    return true;
  }

  // Moves the session's new text into the answer; called every frame for every conversation.
  void Poll(Conversation* conv) {
    if (!conv->generating) return;
    char text[4096];
    kiln_poll_result r;
    r.struct_size = sizeof r;
    do {
      kiln_status s = kiln_session_poll(conv->session, text, sizeof text, nullptr, 0, &r);
      if (s != KILN_OK) {
        conv->error = KilnError("poll", s);
        conv->generating = false;
        return;
      }
      conv->messages.back().content.append(text, r.text_len);
      if (r.text_len > 0) request_scroll = true;
    } while (r.text_left > 0);
    Clock::time_point now = Clock::now();
    if (conv->n_generated == 0 && r.n_tokens > 0) conv->first_token_time = now;
    conv->n_generated = r.n_tokens;
    double seconds = std::chrono::duration<double>(now - conv->first_token_time).count();
    // Decode speed: tokens after the first (whose time includes the prompt) over their time.
    if (conv->n_generated > 1 && seconds > 0)
      conv->tokens_per_s = (conv->n_generated - 1) / seconds;
    if (!r.done) return;
    conv->generating = false;
    conv->answer_finished = true;
    if (r.status != KILN_OK) {
      // Ended before the prompt was computed (a stop during the prefill, or an error): the
      // session is as before the submit, so the turn is taken back and its text returned to the
      // input field.
      if (r.status != KILN_ERR_CANCELLED) conv->error = KilnError("answer", r.status);
      conv->messages.pop_back();
      input = conv->messages.back().content;
      conv->messages.pop_back();
      std::printf("--- stopped before the answer: %s\n", kiln_status_name(r.status));
      std::fflush(stdout);
      return;
    }
    conv->metrics.struct_size = sizeof conv->metrics;
    kiln_session_get_spec_metrics(conv->session, &conv->metrics);
    // The transcript on stdout: the conversation after each answer, then the answer's figures.
    std::fputs(FormatConversation(conv->title, conv->messages).c_str(), stdout);
    std::printf("--- stats stop=%s tokens=%d tokens_per_s=%.1f drafted=%lld accepted=%lld\n",
                StopReasonName(r.stop_reason), conv->n_generated, conv->tokens_per_s,
                static_cast<long long>(conv->metrics.drafted),
                static_cast<long long>(conv->metrics.accepted));
    std::fflush(stdout);
  }

  void Stop(Conversation* conv) {
    if (conv != nullptr && conv->generating) kiln_session_cancel(conv->session);
  }

  // A new conversation holding the messages up to `index` and a fork of the session (its cache
  // blocks shared copy-on-write). Branching at a user message keeps the messages before it and
  // puts its text into the input field, to be edited and sent again.
  Conversation* Branch(Conversation* conv, size_t index) {
    if (conv == nullptr || conv->generating) return nullptr;
    if (index >= conv->messages.size()) {
      conv->error = "branch: no message " + std::to_string(index + 1) + " (the conversation has " +
                    std::to_string(conv->messages.size()) + ")";
      return nullptr;
    }
    auto branch = std::make_unique<Conversation>();
    kiln_status s = kiln_session_fork(conv->session, &branch->session);
    if (s != KILN_OK) {
      conv->error = KilnError("fork", s);
      return nullptr;
    }
    size_t keep = index + 1;
    if (conv->messages[index].role == "user") {
      input = conv->messages[index].content;
      keep = index;
    }
    branch->messages.assign(conv->messages.begin(), conv->messages.begin() + keep);
    branch->strategy_kind = conv->strategy_kind;  // the fork carries its own clone of it
    branch->title = conv->title + " / branch " + std::to_string(index + 1);
    return AddConversation(std::move(branch));
  }

  bool SetStrategy(Conversation* conv, StrategyKind kind) {
    if (conv == nullptr || conv->generating) return false;
    kiln_strategy* strategy = nullptr;
    if (kind == StrategyKind::kNgram) {
      kiln_ngram_params np;
      kiln_ngram_params_init(&np, sizeof np);
      kiln_status s = kiln_strategy_create_ngram(&np, &strategy);
      if (s != KILN_OK) {
        conv->error = KilnError("n-gram strategy", s);
        return false;
      }
    } else if (kind != StrategyKind::kNone) {
      const size_t i = HeadIndex(kind);
      if (!heads[i].error.empty()) {
        conv->error = heads[i].error;
        return false;
      }
      if (!Offered(kind)) {
        conv->error = std::string(kHeadKinds[i].name) + " strategy: no head file for " +
                      opt.model_path + " (--" + kHeadKinds[i].name + " FILE, or " +
                      fs::path(opt.model_path).filename().string() +
                      "'s name up to its first dot + " + kHeadKinds[i].suffix + " next to it)";
        return false;
      }
      strategy = CreateHeadStrategy(model, i, heads[i].file, &conv->error);
      if (strategy == nullptr) return false;
    }
    kiln_status s = kiln_session_set_strategy(conv->session, strategy);
    if (s != KILN_OK) {
      conv->error = KilnError("set strategy", s);
      kiln_strategy_destroy(strategy);
      return false;
    }
    kiln_strategy_destroy(conv->strategy);  // detached by the set above
    conv->strategy = strategy;
    conv->strategy_kind = kind;
    return true;
  }

  std::string SavePath(const std::string& name, const char* ext) const {
    return opt.save_dir + "/" + name + ext;
  }

  // NAME.state: the session (tokens and K/V) through the session-state API; NAME.chat: the
  // messages, one per line. The strategy's state is left out: a reopened conversation starts it
  // afresh, which changes no greedy token.
  bool Save(Conversation* conv, const std::string& name) {
    if (conv == nullptr || conv->generating || name.empty()) return false;
    std::error_code ec;
    fs::create_directories(opt.save_dir, ec);
    kiln_state_params sp;
    kiln_state_params_init(&sp, sizeof sp);
    sp.strategy = 0;
    kiln_status s =
        kiln_session_save_state_file(conv->session, &sp, SavePath(name, ".state").c_str());
    if (s != KILN_OK) {
      conv->error = KilnError("save", s);
      return false;
    }
    std::ofstream chat(SavePath(name, ".chat"));
    for (const Message& m : conv->messages) chat << m.role << ": " << Escape(m.content) << "\n";
    if (!chat.good()) {
      conv->error = "save: cannot write " + SavePath(name, ".chat");
      return false;
    }
    return true;
  }

  Conversation* Open(const std::string& name) {
    if (model == nullptr) return nullptr;
    auto conv = std::make_unique<Conversation>();
    conv->title = name;
    std::ifstream chat(SavePath(name, ".chat"));
    std::string line;
    Message m;
    while (std::getline(chat, line)) {
      if (ParseMessageLine(line, &m)) conv->messages.push_back(m);
    }
    kiln_status s = kiln_session_create(model, cache, nullptr, &conv->session);
    if (s == KILN_OK) {
      s = kiln_session_load_state_file(conv->session, SavePath(name, ".state").c_str());
    }
    if (!chat.eof() || s != KILN_OK) {
      model_error = chat.eof() ? KilnError(("open " + name).c_str(), s)
                               : "open " + name + ": cannot read " + SavePath(name, ".chat");
      return nullptr;
    }
    return AddConversation(std::move(conv));
  }

  std::vector<std::string> SavedNames() const {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(opt.save_dir, ec)) {
      if (entry.path().extension() == ".chat") names.push_back(entry.path().stem().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::vector<std::string> ModelFiles() const {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(opt.model_dir, ec)) {
      if (entry.path().extension() == ".gguf") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }
};

// ---------------------------------------------------------------- the window

// The few GL entry points the app calls itself, looked up through SDL (ImGui's renderer loads
// its own), so the program needs no GL library at link time.
struct GlFunctions {
  void (*Viewport)(int, int, int, int);
  void (*ClearColor)(float, float, float, float);
  void (*Clear)(unsigned);
  void (*PixelStorei)(unsigned, int);
  void (*ReadPixels)(int, int, int, int, unsigned, unsigned, void*);
};
constexpr unsigned kGlColorBufferBit = 0x4000, kGlPackAlignment = 0x0D05, kGlRgba = 0x1908,
                   kGlUnsignedByte = 0x1401;

bool LoadGl(GlFunctions* gl) {
  gl->Viewport = reinterpret_cast<decltype(gl->Viewport)>(SDL_GL_GetProcAddress("glViewport"));
  gl->ClearColor =
      reinterpret_cast<decltype(gl->ClearColor)>(SDL_GL_GetProcAddress("glClearColor"));
  gl->Clear = reinterpret_cast<decltype(gl->Clear)>(SDL_GL_GetProcAddress("glClear"));
  gl->PixelStorei =
      reinterpret_cast<decltype(gl->PixelStorei)>(SDL_GL_GetProcAddress("glPixelStorei"));
  gl->ReadPixels =
      reinterpret_cast<decltype(gl->ReadPixels)>(SDL_GL_GetProcAddress("glReadPixels"));
  return gl->Viewport && gl->ClearColor && gl->Clear && gl->PixelStorei && gl->ReadPixels;
}

// Writes the back buffer (just rendered, not yet swapped) as a 32-bit BMP (SDL saves only BMP;
// scripts/bmp_to_png.py converts it).
bool SaveScreenshot(const GlFunctions& gl, int width, int height, const std::string& path) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 4);
  gl.PixelStorei(kGlPackAlignment, 1);
  gl.ReadPixels(0, 0, width, height, kGlRgba, kGlUnsignedByte, pixels.data());
  // GL's rows run bottom-up.
  const size_t stride = static_cast<size_t>(width) * 4;
  for (int y = 0; y < height / 2; ++y) {
    std::swap_ranges(pixels.begin() + y * stride, pixels.begin() + (y + 1) * stride,
                     pixels.begin() + (height - 1 - y) * stride);
  }
  SDL_Surface* surface = SDL_CreateRGBSurfaceWithFormatFrom(
      pixels.data(), width, height, 32, static_cast<int>(stride), SDL_PIXELFORMAT_ABGR8888);
  if (surface == nullptr) return false;
  bool ok = SDL_SaveBMP(surface, path.c_str()) == 0;
  SDL_FreeSurface(surface);
  return ok;
}

const ImVec4 kUserColor(0.55f, 0.8f, 1.0f, 1.0f);
const ImVec4 kAssistantColor(0.6f, 1.0f, 0.6f, 1.0f);
const ImVec4 kErrorColor(1.0f, 0.45f, 0.4f, 1.0f);

void DrawSidebar(App& app) {
  if (ImGui::Button("New chat", ImVec2(-1, 0))) app.NewConversation();
  ImGui::Separator();
  ImGui::TextDisabled("Open");
  for (size_t i = 0; i < app.conversations.size(); ++i) {
    const Conversation& conv = *app.conversations[i];
    std::string label = conv.title + (conv.generating ? " ..." : "") + "##conv" + std::to_string(i);
    if (ImGui::Selectable(label.c_str(), i == app.current)) app.current = i;
  }
  ImGui::Separator();
  ImGui::TextDisabled("Saved (%s)", app.opt.save_dir.c_str());
  ImGui::SetNextItemWidth(-60);
  ImGui::InputText("##savename", &app.save_name);
  ImGui::SameLine();
  Conversation* conv = app.Current();
  ImGui::BeginDisabled(conv == nullptr || conv->generating);
  if (ImGui::Button("Save", ImVec2(-1, 0))) app.Save(conv, app.save_name);
  ImGui::EndDisabled();
  for (const std::string& name : app.SavedNames()) {
    if (ImGui::Selectable((name + "##saved").c_str())) app.Open(name);
  }
}

void DrawTopBar(App& app) {
  ImGui::BeginDisabled(app.Loading());
  ImGui::SetNextItemWidth(250);
  if (ImGui::BeginCombo("##models", fs::path(app.opt.model_path).filename().c_str())) {
    for (const std::string& file : app.ModelFiles()) {
      if (ImGui::Selectable(fs::path(file).filename().c_str(), file == app.opt.model_path)) {
        app.StartLoad(file);
      }
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(220);
  ImGui::InputText("##modelpath", &app.model_path_field);
  ImGui::SameLine();
  if (ImGui::Button("Load")) app.StartLoad(app.model_path_field);
  ImGui::EndDisabled();

  if (app.Loading()) {
    const float progress = app.load->progress.load(std::memory_order_relaxed);
    const std::string label = "loading " + fs::path(app.load->path).filename().string() + "  " +
                              std::to_string(static_cast<int>(progress * 100)) + "%";
    ImGui::ProgressBar(progress, ImVec2(-80, 0), label.c_str());
    ImGui::SameLine();
    ImGui::BeginDisabled(app.load->cancel.load());
    if (ImGui::Button("Cancel", ImVec2(-1, 0))) app.CancelLoad();
    ImGui::EndDisabled();
    return;
  }

  Conversation* conv = app.Current();
  if (conv == nullptr) return;
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  const int current = static_cast<int>(conv->strategy_kind);
  ImGui::BeginDisabled(conv->generating);
  // Only the offered strategies are listed: either head may be missing or unfit without the other.
  if (ImGui::BeginCombo("strategy", kStrategyNames[current])) {
    for (int kind = 0; kind < kStrategyKinds; ++kind) {
      if (app.Offered(static_cast<StrategyKind>(kind)) &&
          ImGui::Selectable(kStrategyNames[kind], kind == current)) {
        app.SetStrategy(conv, static_cast<StrategyKind>(kind));
      }
    }
    ImGui::EndCombo();
  }
  ImGui::EndDisabled();
  for (size_t i = 0; i < kHeads; ++i) {
    if (app.heads[i].error.empty()) continue;
    ImGui::SameLine();
    ImGui::TextColored(kErrorColor, "(no %s)", kHeadKinds[i].name);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", app.heads[i].error.c_str());
  }
  ImGui::Text("%.1f tokens/s  |  %d tokens", conv->tokens_per_s, conv->n_generated);
  ImGui::SameLine();
  if (conv->metrics.drafted > 0) {
    ImGui::Text(
        "|  acceptance %.0f%% (%lld of %lld drafted, %.2f accepted/step, %.2f passes/token)",
        100.0 * conv->metrics.accepted / conv->metrics.drafted,
        static_cast<long long>(conv->metrics.accepted),
        static_cast<long long>(conv->metrics.drafted), conv->metrics.mean_accepted_per_step,
        conv->metrics.target_passes_per_token);
  } else {
    ImGui::TextDisabled("|  acceptance: no drafts yet");
  }
}

void DrawConversation(App& app) {
  Conversation* conv = app.Current();
  const float input_height = ImGui::GetFrameHeightWithSpacing() * 3;
  ImGui::BeginChild("messages", ImVec2(0, -input_height), true);
  if (conv != nullptr) {
    for (size_t i = 0; i < conv->messages.size(); ++i) {
      const Message& m = conv->messages[i];
      ImGui::PushID(static_cast<int>(i));
      ImGui::TextColored(m.role == "user" ? kUserColor : kAssistantColor, "%s", m.role.c_str());
      if (!conv->generating) {
        ImGui::SameLine();
        if (ImGui::SmallButton("branch from here")) app.Branch(conv, i);
      }
      ImGui::TextWrapped("%s", m.content.c_str());
      ImGui::Spacing();
      ImGui::PopID();
    }
    if (!conv->error.empty()) ImGui::TextColored(kErrorColor, "%s", conv->error.c_str());
  }
  if (!app.model_error.empty()) ImGui::TextColored(kErrorColor, "%s", app.model_error.c_str());
  if (app.request_scroll) {
    ImGui::SetScrollHereY(1.0f);
    app.request_scroll = false;
  }
  ImGui::EndChild();

  ImGui::SetNextItemWidth(-80);
  bool enter = ImGui::InputTextMultiline(
      "##input", &app.input, ImVec2(-80, input_height - ImGui::GetStyle().ItemSpacing.y * 2),
      ImGuiInputTextFlags_EnterReturnsTrue | ImGuiInputTextFlags_CtrlEnterForNewLine);
  ImGui::SameLine();
  if (conv != nullptr && conv->generating) {
    if (ImGui::Button("Stop", ImVec2(-1, 0))) app.Stop(conv);
  } else if ((ImGui::Button("Send", ImVec2(-1, 0)) || enter) && app.Send(conv, app.input)) {
    app.input.clear();
  }
}

void DrawFrame(App& app) {
  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(viewport->Pos);
  ImGui::SetNextWindowSize(viewport->Size);
  ImGui::Begin("kiln chat", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                   ImGuiWindowFlags_NoBringToFrontOnFocus);
  ImGui::BeginChild("sidebar", ImVec2(220, 0), true);
  DrawSidebar(app);
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginGroup();
  DrawTopBar(app);
  DrawConversation(app);
  ImGui::EndGroup();
  ImGui::End();
}

// ---------------------------------------------------------------- scripted input

// One action per line, run one per frame through the same App calls the buttons make:
//   type TEXT | send | wait | stop | new | branch N (1-based message) | save NAME | open NAME |
//   strategy none|ngram|medusa|eagle | model PATH | wait-load | cancel-load | screenshot FILE.bmp |
//   print | quit
// `wait` holds the script (not the UI) until the current answer ends. `model` starts a load and
// returns; while a load is in flight every action but cancel-load, screenshot and quit holds
// (wait-load does nothing else), so the frames keep coming. A failed action is reported and
// makes the program exit with status 1.
struct Script {
  std::vector<std::string> lines;
  size_t next = 0;
  bool failed = false;
  std::string screenshot;  // set by `screenshot`: taken after this frame is rendered

  bool Load(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] != '#') lines.push_back(line);
    }
    return in.eof();
  }

  // Runs the next action; returns false when the script asks to quit or is over.
  bool Step(App& app) {
    if (next >= lines.size()) return false;
    const std::string& line = lines[next];
    size_t space = line.find(' ');
    std::string verb = line.substr(0, space);
    std::string arg = space == std::string::npos ? "" : line.substr(space + 1);
    if (app.Loading() && verb != "cancel-load" && verb != "screenshot" && verb != "quit") {
      return true;  // again next frame
    }
    Conversation* conv = app.Current();
    bool ok = true;
    if (verb == "wait-load") {
      // The load's outcome is on stdout ("--- load ..."); a failed one fails what needs a model.
    } else if (verb == "cancel-load") {
      app.CancelLoad();
    } else if (verb == "wait") {
      if (conv != nullptr && conv->generating) return true;  // again next frame
      ok = conv != nullptr && conv->answer_finished && conv->error.empty();
    } else if (verb == "type") {
      app.input = Unescape(arg);
    } else if (verb == "send") {
      ok = app.Send(conv, app.input);
      if (ok) app.input.clear();
    } else if (verb == "stop") {
      app.Stop(conv);
    } else if (verb == "new") {
      ok = app.NewConversation() != nullptr;
    } else if (verb == "branch") {
      ok = app.Branch(conv, std::strtoul(arg.c_str(), nullptr, 10) - 1) != nullptr;
    } else if (verb == "save") {
      ok = app.Save(conv, arg);
    } else if (verb == "open") {
      ok = app.Open(arg) != nullptr;
    } else if (verb == "strategy") {
      const auto* names = std::begin(kStrategyScriptNames);
      const auto* name = std::find(names, std::end(kStrategyScriptNames), arg);
      ok = name != std::end(kStrategyScriptNames) &&
           app.SetStrategy(conv, static_cast<StrategyKind>(name - names));
    } else if (verb == "model") {
      ok = app.StartLoad(arg);
    } else if (verb == "screenshot") {
      screenshot = arg;
    } else if (verb == "print") {
      ok = conv != nullptr;
      if (ok) std::fputs(FormatConversation(conv->title, conv->messages).c_str(), stdout);
    } else if (verb == "quit") {
      return false;
    } else {
      ok = false;
    }
    if (!ok) {
      std::string why = conv != nullptr && !conv->error.empty() ? conv->error : app.model_error;
      std::fprintf(stderr, "script: '%s' failed%s%s\n", line.c_str(), why.empty() ? "" : ": ",
                   why.c_str());
      failed = true;
      return false;
    }
    ++next;
    return true;
  }
};

// ---------------------------------------------------------------- reference mode

// Recomputes the last (assistant) message of every conversation block in `path` with the
// blocking API in a fresh session and prints the blocks with the recomputed answers: for a
// greedy model, the same text the UI produced.
int RunReference(const Options& opt) {
  std::ifstream in(opt.reference);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", opt.reference.c_str());
    return 1;
  }
  kiln_model_params mp;
  kiln_model_params_init(&mp, sizeof mp);
  mp.path = opt.model_path.c_str();
  kiln_model* model = nullptr;
  kiln_cache* cache = nullptr;
  kiln_status s = kiln_model_load(&mp, &model);
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  cp.n_ctx = opt.n_ctx;
  cp.n_threads = opt.threads;
  if (s == KILN_OK) s = kiln_cache_create(model, &cp, &cache);
  if (s != KILN_OK) {
    std::fprintf(stderr, "%s\n", KilnError("load", s).c_str());
    kiln_model_destroy(model);
    return 1;
  }
  int status = 0;
  std::string line, title, error;
  std::vector<Message> messages;
  while (status == 0 && std::getline(in, line)) {
    Message m;
    if (line.rfind("--- conversation ", 0) == 0) {
      title = line.substr(17);
      messages.clear();
    } else if (ParseMessageLine(line, &m)) {
      messages.push_back(m);
    } else if (line == "--- end" && !messages.empty() && messages.back().role == "assistant") {
      messages.pop_back();
      std::string prompt, answer;
      kiln_session* session = nullptr;
      if (!RenderPrompt(model, messages, &prompt, &error)) {
        std::fprintf(stderr, "%s\n", error.c_str());
        status = 1;
        break;
      }
      kiln_generate_params gp;
      kiln_generate_params_init(&gp, sizeof gp);
      gp.max_tokens = opt.max_tokens;
      gp.user_data = &answer;
      gp.callback = [](int32_t, const char* piece, size_t len, void* user_data) {
        static_cast<std::string*>(user_data)->append(piece, len);
        return 0;
      };
      kiln_generate_result gr;
      gr.struct_size = sizeof gr;
      if ((s = kiln_session_create(model, cache, nullptr, &session)) != KILN_OK ||
          (s = kiln_session_append_text(session, prompt.data(), prompt.size(),
                                        KILN_TOKENIZE_PARSE_SPECIAL)) != KILN_OK ||
          (s = kiln_session_generate(session, &gp, &gr)) != KILN_OK) {
        std::fprintf(stderr, "%s\n", KilnError("generate", s).c_str());
        status = 1;
      }
      kiln_session_destroy(session);
      messages.push_back({"assistant", answer});
      std::fputs(FormatConversation(title, messages).c_str(), stdout);
    }
  }
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return status;
}

// ---------------------------------------------------------------- main

void Usage() {
  std::fprintf(stderr,
               "usage: kiln-chat [--model FILE.gguf] [--medusa HEAD.gguf] [--eagle HEAD.gguf]\n"
               "  [--model-dir DIR] [--save-dir DIR]\n"
               "  [--max-tokens N] [--ctx N] [--threads N] [--size WxH]\n"
               "  [--script FILE] [--reference TRANSCRIPT]\n");
}

bool ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: missing value (or unknown option)\n", arg.c_str());
      return false;
    }
    std::string value = argv[++i];
    char* end = nullptr;
    long number = std::strtol(value.c_str(), &end, 10);
    bool is_number = !value.empty() && *end == '\0' && number >= 0 && number < (1l << 30);
    if (arg == "--model") {
      opt->model_path = value;
    } else if (arg == "--medusa") {
      opt->head_files[HeadIndex(StrategyKind::kMedusa)] = value;
    } else if (arg == "--eagle") {
      opt->head_files[HeadIndex(StrategyKind::kEagle)] = value;
    } else if (arg == "--model-dir") {
      opt->model_dir = value;
    } else if (arg == "--save-dir") {
      opt->save_dir = value;
    } else if (arg == "--script") {
      opt->script = value;
    } else if (arg == "--reference") {
      opt->reference = value;
    } else if (arg == "--size") {
      if (std::sscanf(value.c_str(), "%dx%d", &opt->width, &opt->height) != 2 || opt->width < 320 ||
          opt->height < 240) {
        std::fprintf(stderr, "--size: expected WxH of at least 320x240, got '%s'\n", value.c_str());
        return false;
      }
    } else if (arg == "--max-tokens" || arg == "--ctx" || arg == "--threads") {
      if (!is_number) {
        std::fprintf(stderr, "%s: expected a non-negative integer, got '%s'\n", arg.c_str(),
                     value.c_str());
        return false;
      }
      (arg == "--max-tokens" ? opt->max_tokens
       : arg == "--ctx"      ? opt->n_ctx
                             : opt->threads) = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

int RunWindow(App& app, Script* script) {
  if (SDL_Init(SDL_INIT_VIDEO) != 0) {
    std::fprintf(stderr, "SDL_Init: %s\n", SDL_GetError());
    return 1;
  }
  SDL_GL_SetAttribute(SDL_GL_CONTEXT_PROFILE_MASK, SDL_GL_CONTEXT_PROFILE_CORE);
  SDL_GL_SetAttribute(SDL_GL_CONTEXT_MAJOR_VERSION, 3);
  SDL_GL_SetAttribute(SDL_GL_CONTEXT_MINOR_VERSION, 2);
  SDL_GL_SetAttribute(SDL_GL_DOUBLEBUFFER, 1);
  SDL_Window* window =
      SDL_CreateWindow("kiln chat", SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED, app.opt.width,
                       app.opt.height, SDL_WINDOW_OPENGL | SDL_WINDOW_RESIZABLE);
  SDL_GLContext context = window != nullptr ? SDL_GL_CreateContext(window) : nullptr;
  GlFunctions gl;
  if (context == nullptr || !LoadGl(&gl)) {
    std::fprintf(stderr, "no OpenGL 3.2 window: %s\n", SDL_GetError());
    if (window != nullptr) SDL_DestroyWindow(window);
    SDL_Quit();
    return 1;
  }
  SDL_GL_SetSwapInterval(1);
  ImGui::CreateContext();
  ImGui::GetIO().IniFilename = nullptr;  // the layout is fixed; no imgui.ini next to the binary
  ImGui::StyleColorsDark();
  ImGui_ImplSDL2_InitForOpenGL(window, context);
  ImGui_ImplOpenGL3_Init("#version 150");

  // The first load starts with the window up, so that its progress is drawn.
  app.StartLoad(app.opt.model_path);
  int status = 0;
  constexpr auto kFrameTime = std::chrono::microseconds(16667);
  for (bool running = true; running;) {
    // At most 60 frames a second, also where the swap does not wait for the display (Xvfb): the
    // UI must not take the cores the generation runs on.
    Clock::time_point frame_start = Clock::now();
    SDL_Event event;
    while (SDL_PollEvent(&event)) {
      ImGui_ImplSDL2_ProcessEvent(&event);
      if (event.type == SDL_QUIT) running = false;
    }
    app.PollLoad();
    for (auto& conv : app.conversations) app.Poll(conv.get());
    if (script != nullptr && running) running = script->Step(app);

    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplSDL2_NewFrame();
    ImGui::NewFrame();
    DrawFrame(app);
    ImGui::Render();
    int width = 0, height = 0;
    SDL_GL_GetDrawableSize(window, &width, &height);
    gl.Viewport(0, 0, width, height);
    gl.ClearColor(0.08f, 0.08f, 0.1f, 1.0f);
    gl.Clear(kGlColorBufferBit);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    if (script != nullptr && !script->screenshot.empty()) {
      if (!SaveScreenshot(gl, width, height, script->screenshot)) {
        std::fprintf(stderr, "screenshot %s: %s\n", script->screenshot.c_str(), SDL_GetError());
        script->failed = true;
        running = false;
      }
      script->screenshot.clear();
    }
    SDL_GL_SwapWindow(window);
    auto spent = Clock::now() - frame_start;
    if (spent < kFrameTime) {
      SDL_Delay(static_cast<Uint32>(
          std::chrono::duration_cast<std::chrono::milliseconds>(kFrameTime - spent).count()));
    }
  }
  if (script != nullptr && script->failed) status = 1;

  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplSDL2_Shutdown();
  ImGui::DestroyContext();
  SDL_GL_DeleteContext(context);
  SDL_DestroyWindow(window);
  SDL_Quit();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, &opt)) {
    Usage();
    return 2;
  }
  if (!opt.reference.empty()) return RunReference(opt);
  Script script;
  if (!opt.script.empty() && !script.Load(opt.script)) {
    std::fprintf(stderr, "cannot read script %s\n", opt.script.c_str());
    return 2;
  }
  // A failed load is shown in the window, where another model can be picked; a script's next
  // action that needs the model fails with the load's error.
  App app;
  app.opt = opt;
  app.model_path_field = opt.model_path;
  return RunWindow(app, opt.script.empty() ? nullptr : &script);
}
