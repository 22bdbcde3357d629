// kiln-game: a small real-time game in which NPCs on one kiln cache hold conversations.
//
// Four NPCs stand in a village square, in two pairs. Each NPC is one kiln session on a shared
// cache; in every round each NPC answers the line its partner said last (round 0: a scripted
// opener), so all four generate at once and the cache batches them into shared forward passes.
// The game loop drives kiln itself: once per frame it polls the sessions, submits the turns that
// are ready, and calls kiln_cache_step with a time budget, so generation never stalls the frame
// by more than the budget allows (the worker thread is never started).
//
// Saving (F5 in the window, --save DIR) writes each NPC's session through the session-state API
// plus a small text file with the finished lines; --load DIR restores them and the dialogue
// continues exactly as it would have.
//
// --headless runs a fixed number of frames without a window and prints frame-time figures and
// the transcript; samples/game/tests/run_test.py checks them. Only kiln's public C API is used.
#include <SDL.h>
#include <SDL_ttf.h>
#include <kiln/kiln.h>
#include <sys/resource.h>  // getrusage(RUSAGE_THREAD)
#include <time.h>          // clock_gettime(CLOCK_THREAD_CPUTIME_ID)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kNumNpcs = 4;

struct NpcPersona {
  const char* name;
  const char* persona;  // the system prompt
  const char* opener;   // what the NPC hears in round 0
  SDL_Color color;
};

// Partners: 0 <-> 1, 2 <-> 3.
const NpcPersona kPersonas[kNumNpcs] = {
    {"Bram the smith",
     "You are Bram, a village blacksmith. Answer in one short sentence.",
     "Good morning, Bram! Is the new sword ready?",
     {255, 170, 90, 255}},
    {"Ida the baker",
     "You are Ida, the village baker. Answer in one short sentence.",
     "Ida, what bread did you bake today?",
     {250, 230, 140, 255}},
    {"Olek the guard",
     "You are Olek, a gate guard. Answer in one short sentence.",
     "Olek, did anyone pass the gate last night?",
     {140, 200, 255, 255}},
    {"Mira the herbalist",
     "You are Mira, a herbalist. Answer in one short sentence.",
     "Mira, which herb helps with a cough?",
     {150, 240, 150, 255}},
};

int PartnerOf(int npc) { return npc ^ 1; }

struct Options {
  std::string model_path;
  std::string font_path = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf";
  bool headless = false;
  int frames = 600;  // headless: frames to run (the window runs until closed)
  uint64_t seed = 1;
  int rounds = 3;  // replies each NPC gives
  int max_reply_tokens = 32;
  double budget_ms = 2.0;  // kiln's time budget per frame
  // Most tokens in one step: prompts are computed in chunks of this size, so a new turn's prompt
  // does not cost one long frame.
  int step_tokens = 16;
  double max_p99_ms = -1;  // headless: fail when kiln's p99 per frame exceeds it; < 0: budget
  // headless: which time of kiln's per frame the check uses: "wall" (kiln_step_result's
  // elapsed_ms, what the frame loses) or "cpu" (the game thread's CPU time in kiln_cache_step:
  // the same without the time the OS gave other processes).
  std::string check_clock = "wall";
  int threads = 0;
  bool pin_threads = false;  // kiln_cache_params.pin_threads
  std::string save_dir;      // --save: where to save (F5 in the window; headless: at save_frame)
  int save_frame = -1;       // headless: ask for a save at this frame
  std::string load_dir;      // --load: restore this save at start
  std::string screenshot;    // window: save a BMP of frame `frames` then quit
};

struct Npc {
  kiln_session* session = nullptr;
  std::vector<std::string> replies;  // finished replies, one per round
  std::string partial;               // the reply being generated
  bool in_flight = false;
};

struct Game {
  Options opt;
  kiln_model* model = nullptr;
  kiln_cache* cache = nullptr;
  kiln_sampler* sampler = nullptr;
  Npc npcs[kNumNpcs];
  bool save_pending = false;
};

[[noreturn]] void Die(const char* what, kiln_status status) {
  std::fprintf(stderr, "kiln-game: %s failed: %s: %s\n", what, kiln_status_name(status),
               kiln_last_error_message());
  std::exit(1);
}

void Check(const char* what, kiln_status status) {
  if (status != KILN_OK) Die(what, status);
}

// The line NPC `npc` hears in `round`: the scripted opener, then its partner's last reply.
const std::string* HeardLine(const Game& game, int npc, int round, std::string* opener) {
  if (round == 0) {
    *opener = kPersonas[npc].opener;
    return opener;
  }
  const Npc& partner = game.npcs[PartnerOf(npc)];
  if (static_cast<int>(partner.replies.size()) < round) return nullptr;
  return &partner.replies[round - 1];
}

// The session's last token is an end-of-generation token (the reply ended on "<|im_end|>" rather
// than at max_tokens).
bool EndsWithEog(const Game& game, kiln_session* session) {
  size_t n = kiln_session_n_tokens(session);
  if (n == 0) return false;
  std::vector<int32_t> tokens(n);
  size_t got = 0;
  Check("kiln_session_get_tokens", kiln_session_get_tokens(session, tokens.data(), n, &got));
  return got > 0 && kiln_model_token_is_eog(game.model, tokens[got - 1]);
}

// Submits the NPC's next turn when the line it answers exists. The prompt is the ChatML turn
// (SmolLM2's template) appended to what the session already holds.
void MaybeSubmit(Game& game, int npc_index) {
  Npc& npc = game.npcs[npc_index];
  int round = static_cast<int>(npc.replies.size());
  if (npc.in_flight || game.save_pending || round >= game.opt.rounds) return;
  std::string opener;
  const std::string* heard = HeardLine(game, npc_index, round, &opener);
  if (heard == nullptr) return;
  std::string prompt;
  if (round == 0) {
    prompt.append("<|im_start|>system\n").append(kPersonas[npc_index].persona).append("<|im_end|>");
  } else if (!EndsWithEog(game, npc.session)) {
    prompt.append("<|im_end|>");  // the last reply was cut at max_tokens: close it
  }
  prompt.append("\n<|im_start|>user\n")
      .append(*heard)
      .append("<|im_end|>\n<|im_start|>assistant\n");
  kiln_request_params request;
  Check("kiln_request_params_init", kiln_request_params_init(&request, sizeof request));
  request.text = prompt.data();
  request.text_len = prompt.size();
  request.text_flags = KILN_TOKENIZE_PARSE_SPECIAL;
  request.max_tokens = game.opt.max_reply_tokens;
  static const char* const kStops[] = {"\n"};  // one line per reply
  request.stop_strings = kStops;
  request.n_stop_strings = 1;
  Check("kiln_session_submit", kiln_session_submit(npc.session, &request));
  npc.in_flight = true;
  npc.partial.clear();
}

// Moves new text of the NPC's request into `partial`; on done, files it as the round's reply.
void Poll(Game& game, int npc_index) {
  Npc& npc = game.npcs[npc_index];
  if (!npc.in_flight) return;
  char text[1024];
  for (;;) {
    kiln_poll_result result;
    std::memset(&result, 0, sizeof result);
    result.struct_size = sizeof result;
    Check("kiln_session_poll",
          kiln_session_poll(npc.session, text, sizeof text, nullptr, 0, &result));
    npc.partial.append(text, result.text_len);
    if (result.done) {
      if (result.status != KILN_OK) Die("an NPC's request", result.status);
      std::string line = npc.partial;
      while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
      while (!line.empty() && line.front() == ' ') line.erase(0, 1);
      npc.replies.push_back(line);
      npc.partial.clear();
      npc.in_flight = false;
      return;
    }
    if (result.text_left == 0) return;
  }
}

bool AnyInFlight(const Game& game) {
  for (const Npc& npc : game.npcs)
    if (npc.in_flight) return true;
  return false;
}

bool DialogueFinished(const Game& game) {
  for (const Npc& npc : game.npcs)
    if (static_cast<int>(npc.replies.size()) < game.opt.rounds) return false;
  return true;
}

std::string NpcStatePath(const std::string& dir, int npc) {
  return dir + "/npc" + std::to_string(npc) + ".kstate";
}

// The game's own state: each NPC's finished replies, length-prefixed (replies may hold any
// byte). Sessions hold the rest.
void SaveGame(Game& game, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    std::fprintf(stderr, "kiln-game: cannot create %s: %s\n", dir.c_str(), error.message().c_str());
    std::exit(1);
  }
  for (int i = 0; i < kNumNpcs; ++i)
    Check(
        "kiln_session_save_state_file",
        kiln_session_save_state_file(game.npcs[i].session, nullptr, NpcStatePath(dir, i).c_str()));
  std::ofstream out(dir + "/game.txt", std::ios::binary);
  out << "kiln-game 1\n";
  for (int i = 0; i < kNumNpcs; ++i) {
    out << game.npcs[i].replies.size() << "\n";
    for (const std::string& reply : game.npcs[i].replies) out << reply.size() << "\n" << reply;
  }
  if (!out) {
    std::fprintf(stderr, "kiln-game: cannot write %s/game.txt\n", dir.c_str());
    std::exit(1);
  }
  std::printf("saved game to %s\n", dir.c_str());
}

void LoadGame(Game& game, const std::string& dir) {
  std::ifstream in(dir + "/game.txt", std::ios::binary);
  std::string magic;
  std::getline(in, magic);
  if (!in || magic != "kiln-game 1") {
    std::fprintf(stderr, "kiln-game: %s/game.txt is missing or not a kiln-game save\n",
                 dir.c_str());
    std::exit(1);
  }
  for (int i = 0; i < kNumNpcs; ++i) {
    size_t n_replies = 0;
    in >> n_replies;
    in.get();
    if (!in || n_replies > 100000) {
      std::fprintf(stderr, "kiln-game: %s/game.txt: bad reply count of NPC %d\n", dir.c_str(), i);
      std::exit(1);
    }
    game.npcs[i].replies.clear();
    for (size_t r = 0; r < n_replies; ++r) {
      size_t len = 0;
      in >> len;
      in.get();
      if (!in || len > (1u << 20)) {
        std::fprintf(stderr, "kiln-game: %s/game.txt: bad reply length of NPC %d\n", dir.c_str(),
                     i);
        std::exit(1);
      }
      std::string reply(len, '\0');
      in.read(reply.data(), static_cast<std::streamsize>(len));
      if (!in) {
        std::fprintf(stderr, "kiln-game: %s/game.txt is truncated\n", dir.c_str());
        std::exit(1);
      }
      game.npcs[i].replies.push_back(reply);
    }
    Check("kiln_session_load_state_file",
          kiln_session_load_state_file(game.npcs[i].session, NpcStatePath(dir, i).c_str()));
  }
  std::printf("loaded game from %s (replies:", dir.c_str());
  for (const Npc& npc : game.npcs) std::printf(" %zu", npc.replies.size());
  std::printf(")\n");
}

struct FrameTimes {
  std::vector<double> frame_ms;
  std::vector<double> kiln_ms;
  std::vector<double> kiln_cpu_ms;
  std::vector<double> kept_core_kiln_ms;  // kiln_ms of the frames whose thread kept its core
};

// CPU time of the calling thread, in ms.
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

// Kiln's share of one frame: the wall time of kiln_cache_step and this thread's CPU time in it.
// The call runs on this thread with the cache's pool threads, which work in parallel with it
// and are waited for inside the call, so its wall time is the frame's cost; its CPU time is
// that cost less the time the OS ran other processes instead of this thread.
struct KilnTime {
  double wall_ms = 0;
  double cpu_ms = 0;
  // The OS preempted this thread inside the call (an involuntary context switch: it could have
  // run and another thread got its core, also after a sched_yield of the pool's wait): the wall
  // time then holds a slice of other threads' time.
  bool preempted = false;
};

// Involuntary context switches of the calling thread so far (Linux; elsewhere 0: no frame
// counts as preempted).
long InvoluntarySwitches() {
#ifdef RUSAGE_THREAD
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nivcsw;
#else
  return 0;
#endif
}

// One frame of game logic: poll, submit, save when asked and idle, then step kiln within the
// budget. Returns kiln's time in this frame (0 when it had nothing to run).
KilnTime GameTick(Game& game) {
  for (int i = 0; i < kNumNpcs; ++i) Poll(game, i);
  if (game.save_pending && !AnyInFlight(game)) {
    // Sessions take no calls while a request is in flight, so a save waits for the turns in
    // progress to end (new ones are held back meanwhile).
    SaveGame(game, game.opt.save_dir);
    game.save_pending = false;
  }
  for (int i = 0; i < kNumNpcs; ++i) MaybeSubmit(game, i);
  kiln_step_params step;
  Check("kiln_step_params_init", kiln_step_params_init(&step, sizeof step));
  step.time_budget_ms = game.opt.budget_ms;
  step.step_tokens = game.opt.step_tokens;
  kiln_step_result result;
  std::memset(&result, 0, sizeof result);
  result.struct_size = sizeof result;
  const long switches_start = InvoluntarySwitches();
  const double cpu_start = ThreadCpuMs();
  Check("kiln_cache_step", kiln_cache_step(game.cache, &step, &result));
  const double cpu_ms = ThreadCpuMs() - cpu_start;
  const bool preempted = InvoluntarySwitches() != switches_start;
  if (result.n_steps == 0) return {};
  return {result.elapsed_ms, cpu_ms, preempted};
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

void PrintTranscript(const Game& game) {
  std::printf("--- transcript\n");
  for (int round = 0; round < game.opt.rounds; ++round)
    for (int i = 0; i < kNumNpcs; ++i)
      if (round < static_cast<int>(game.npcs[i].replies.size()))
        std::printf("[%d] %s: %s\n", round, kPersonas[i].name, game.npcs[i].replies[round].c_str());
  std::printf("--- end\n");
}

int RunHeadless(Game& game) {
  FrameTimes times;
  for (int frame = 0; frame < game.opt.frames; ++frame) {
    if (frame == game.opt.save_frame && !game.opt.save_dir.empty()) game.save_pending = true;
    auto start = std::chrono::steady_clock::now();
    const KilnTime kiln = GameTick(game);
    auto end = std::chrono::steady_clock::now();
    times.frame_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    times.kiln_ms.push_back(kiln.wall_ms);
    times.kiln_cpu_ms.push_back(kiln.cpu_ms);
    if (!kiln.preempted) times.kept_core_kiln_ms.push_back(kiln.wall_ms);
  }
  // The transcript must not depend on how many tokens fit in the frames, so the rest of the
  // dialogue is finished off the clock (a pending save still happens first).
  int drain_steps = 0;
  while (!DialogueFinished(game) || AnyInFlight(game) || game.save_pending) {
    GameTick(game);
    if (++drain_steps > 1000000) {
      std::fprintf(stderr, "kiln-game: the dialogue did not finish\n");
      return 1;
    }
  }
  double max_p99 = game.opt.max_p99_ms >= 0 ? game.opt.max_p99_ms : game.opt.budget_ms;
  const bool check_cpu = game.opt.check_clock == "cpu";
  double kiln_p99 = Percentile(check_cpu ? times.kiln_cpu_ms : times.kiln_ms, 0.99);
  std::printf("frames %d  budget %.2f ms\n", game.opt.frames, game.opt.budget_ms);
  std::printf("frame ms: p50 %.3f  p99 %.3f  max %.3f\n", Percentile(times.frame_ms, 0.5),
              Percentile(times.frame_ms, 0.99),
              *std::max_element(times.frame_ms.begin(), times.frame_ms.end()));
  std::printf("kiln ms per frame: p50 %.3f  p99 %.3f  max %.3f\n", Percentile(times.kiln_ms, 0.5),
              Percentile(times.kiln_ms, 0.99),
              *std::max_element(times.kiln_ms.begin(), times.kiln_ms.end()));
  std::printf("kiln CPU ms per frame (game thread): p50 %.3f  p99 %.3f  max %.3f\n",
              Percentile(times.kiln_cpu_ms, 0.5), Percentile(times.kiln_cpu_ms, 0.99),
              *std::max_element(times.kiln_cpu_ms.begin(), times.kiln_cpu_ms.end()));
  // Which frames' wall time holds other processes' time: those where the OS preempted the game
  // thread inside kiln_cache_step (the kept ones lean to short frames: a long frame is more
  // likely to be preempted).
  if (!times.kept_core_kiln_ms.empty()) {
    std::printf(
        "kiln ms per frame, frames whose game thread kept its core (%zu of %d): p50 %.3f  "
        "p99 %.3f  max %.3f\n",
        times.kept_core_kiln_ms.size(), game.opt.frames, Percentile(times.kept_core_kiln_ms, 0.5),
        Percentile(times.kept_core_kiln_ms, 0.99),
        *std::max_element(times.kept_core_kiln_ms.begin(), times.kept_core_kiln_ms.end()));
  }
  std::printf("untimed steps after the frames: %d\n", drain_steps);
  PrintTranscript(game);
  bool within = kiln_p99 <= max_p99;
  std::printf("budget check: kiln %s p99 %.3f ms %s %.3f ms: %s\n", check_cpu ? "CPU" : "wall",
              kiln_p99, within ? "<=" : ">", max_p99, within ? "PASS" : "FAIL");
  return within ? 0 : 2;
}

// --- the window

constexpr int kWidth = 960;
constexpr int kHeight = 600;

void DrawText(SDL_Renderer* renderer, TTF_Font* font, const std::string& text, int x, int y,
              SDL_Color color, int wrap_width) {
  if (text.empty()) return;
  SDL_Surface* surface =
      TTF_RenderUTF8_Blended_Wrapped(font, text.c_str(), color, static_cast<Uint32>(wrap_width));
  if (surface == nullptr) return;
  SDL_Texture* texture = SDL_CreateTextureFromSurface(renderer, surface);
  SDL_Rect dst = {x, y, surface->w, surface->h};
  SDL_RenderCopy(renderer, texture, nullptr, &dst);
  SDL_DestroyTexture(texture);
  SDL_FreeSurface(surface);
}

void DrawNpc(SDL_Renderer* renderer, TTF_Font* font, const Game& game, int i, double now_s) {
  // Pairs face each other: 0 and 1 on the top row, 2 and 3 on the bottom.
  int col = i % 2, row = i / 2;
  int x = 40 + col * 460, y = 60 + row * 250;
  const Npc& npc = game.npcs[i];
  SDL_Color c = kPersonas[i].color;
  int bob = npc.in_flight ? static_cast<int>(4 * std::sin(now_s * 8 + i)) : 0;
  SDL_Rect body = {x, y + 60 + bob, 40, 60};
  SDL_SetRenderDrawColor(renderer, c.r, c.g, c.b, 255);
  SDL_RenderFillRect(renderer, &body);
  SDL_Rect head = {x + 8, y + 36 + bob, 24, 24};
  SDL_RenderFillRect(renderer, &head);
  DrawText(renderer, font, kPersonas[i].name, x, y + 124, c, 200);
  // Speech bubble: the reply being generated, else the last one.
  std::string line = npc.in_flight         ? npc.partial + "_"
                     : npc.replies.empty() ? std::string("...")
                                           : npc.replies.back();
  SDL_Rect bubble = {x + 50, y, 380, 110};
  SDL_SetRenderDrawColor(renderer, 30, 30, 45, 255);
  SDL_RenderFillRect(renderer, &bubble);
  SDL_SetRenderDrawColor(renderer, c.r, c.g, c.b, 255);
  SDL_RenderDrawRect(renderer, &bubble);
  DrawText(renderer, font, line, x + 58, y + 6, SDL_Color{235, 235, 235, 255}, 364);
}

int RunWindow(Game& game) {
  if (SDL_Init(SDL_INIT_VIDEO) != 0) {
    std::fprintf(stderr, "kiln-game: SDL_Init: %s\n", SDL_GetError());
    return 1;
  }
  if (TTF_Init() != 0) {
    std::fprintf(stderr, "kiln-game: TTF_Init: %s\n", TTF_GetError());
    return 1;
  }
  TTF_Font* font = TTF_OpenFont(game.opt.font_path.c_str(), 15);
  if (font == nullptr) {
    std::fprintf(stderr, "kiln-game: cannot open font %s: %s (use --font)\n",
                 game.opt.font_path.c_str(), TTF_GetError());
    return 1;
  }
  SDL_Window* window = SDL_CreateWindow("kiln-game", SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED,
                                        kWidth, kHeight, 0);
  SDL_Renderer* renderer = window ? SDL_CreateRenderer(window, -1, SDL_RENDERER_SOFTWARE) : nullptr;
  if (renderer == nullptr) {
    std::fprintf(stderr, "kiln-game: cannot open a window: %s\n", SDL_GetError());
    return 1;
  }
  std::vector<double> kiln_ms;
  auto t0 = std::chrono::steady_clock::now();
  bool running = true;
  int frame = 0;
  while (running) {
    auto frame_start = std::chrono::steady_clock::now();
    SDL_Event event;
    while (SDL_PollEvent(&event)) {
      if (event.type == SDL_QUIT) running = false;
      if (event.type == SDL_KEYDOWN) {
        if (event.key.keysym.sym == SDLK_ESCAPE) running = false;
        if (event.key.keysym.sym == SDLK_F5)
          game.save_pending = true;  // saved once the turns in progress end
      }
    }
    if (game.save_pending && game.opt.save_dir.empty()) game.opt.save_dir = "kiln-game-save";
    double kiln_frame_ms = GameTick(game).wall_ms;
    kiln_ms.push_back(kiln_frame_ms);
    double now_s = std::chrono::duration<double>(frame_start - t0).count();
    SDL_SetRenderDrawColor(renderer, 52, 76, 52, 255);
    SDL_RenderClear(renderer);
    for (int i = 0; i < kNumNpcs; ++i) DrawNpc(renderer, font, game, i, now_s);
    char hud[256];
    std::snprintf(hud, sizeof hud,
                  "frame %d  kiln %.2f ms this frame (budget %.1f ms)  F5: save  Esc: quit%s",
                  frame, kiln_frame_ms, game.opt.budget_ms, game.save_pending ? "  saving..." : "");
    DrawText(renderer, font, hud, 10, kHeight - 28, SDL_Color{255, 255, 255, 255}, kWidth - 20);
    if (!game.opt.screenshot.empty() && frame == game.opt.frames) {
      SDL_Surface* shot =
          SDL_CreateRGBSurfaceWithFormat(0, kWidth, kHeight, 32, SDL_PIXELFORMAT_ARGB8888);
      SDL_RenderReadPixels(renderer, nullptr, SDL_PIXELFORMAT_ARGB8888, shot->pixels, shot->pitch);
      SDL_SaveBMP(shot, game.opt.screenshot.c_str());
      SDL_FreeSurface(shot);
      running = false;
    }
    SDL_RenderPresent(renderer);
    // About 60 frames a second; kiln's share of the frame is bounded by the budget.
    double spent =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - frame_start)
            .count();
    if (spent < 16.0) SDL_Delay(static_cast<Uint32>(16.0 - spent));
    ++frame;
  }
  std::printf("kiln ms per frame over %d frames: p50 %.3f  p99 %.3f\n", frame,
              Percentile(kiln_ms, 0.5), Percentile(kiln_ms, 0.99));
  TTF_CloseFont(font);
  SDL_DestroyRenderer(renderer);
  SDL_DestroyWindow(window);
  TTF_Quit();
  SDL_Quit();
  return 0;
}

void Usage() {
  std::fprintf(
      stderr,
      "usage: kiln-game [--model PATH] [--headless] [--frames N] [--seed S] [--rounds R]\n"
      "  [--max-reply-tokens N] [--budget-ms MS] [--step-tokens N] [--max-p99-ms MS]\n"
      "  [--check-clock wall|cpu]\n"
      "  [--threads N] [--pin-threads] [--save DIR] [--save-frame K] [--load DIR] [--font TTF]\n"
      "  [--screenshot FILE.bmp]\n");
}

bool ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln-game: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* name, double lo, double hi, double* out) {
      const char* v = value(name);
      if (v == nullptr) return false;
      char* end = nullptr;
      double d = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(d >= lo && d <= hi)) {
        std::fprintf(stderr, "kiln-game: %s: '%s' is not a number in [%g, %g]\n", name, v, lo, hi);
        return false;
      }
      *out = d;
      return true;
    };
    double d = 0;
    const char* v = nullptr;
    if (arg == "--headless") {
      opt->headless = true;
    } else if (arg == "--model") {
      if ((v = value("--model")) == nullptr) return false;
      opt->model_path = v;
    } else if (arg == "--font") {
      if ((v = value("--font")) == nullptr) return false;
      opt->font_path = v;
    } else if (arg == "--save") {
      if ((v = value("--save")) == nullptr) return false;
      opt->save_dir = v;
    } else if (arg == "--load") {
      if ((v = value("--load")) == nullptr) return false;
      opt->load_dir = v;
    } else if (arg == "--screenshot") {
      if ((v = value("--screenshot")) == nullptr) return false;
      opt->screenshot = v;
    } else if (arg == "--frames") {
      if (!number("--frames", 1, 1e8, &d)) return false;
      opt->frames = static_cast<int>(d);
    } else if (arg == "--seed") {
      if (!number("--seed", 0, 1e15, &d)) return false;
      opt->seed = static_cast<uint64_t>(d);
    } else if (arg == "--rounds") {
      if (!number("--rounds", 1, 1000, &d)) return false;
      opt->rounds = static_cast<int>(d);
    } else if (arg == "--max-reply-tokens") {
      if (!number("--max-reply-tokens", 1, 4096, &d)) return false;
      opt->max_reply_tokens = static_cast<int>(d);
    } else if (arg == "--budget-ms") {
      if (!number("--budget-ms", 0, 1e6, &d)) return false;
      opt->budget_ms = d;
    } else if (arg == "--max-p99-ms") {
      if (!number("--max-p99-ms", 0, 1e9, &d)) return false;
      opt->max_p99_ms = d;
    } else if (arg == "--check-clock") {
      if ((v = value("--check-clock")) == nullptr) return false;
      opt->check_clock = v;
      if (opt->check_clock != "wall" && opt->check_clock != "cpu") {
        std::fprintf(stderr, "kiln-game: --check-clock: '%s' is not wall or cpu\n", v);
        return false;
      }
    } else if (arg == "--step-tokens") {
      if (!number("--step-tokens", 0, 65536, &d)) return false;
      opt->step_tokens = static_cast<int>(d);
    } else if (arg == "--threads") {
      if (!number("--threads", 0, 1024, &d)) return false;
      opt->threads = static_cast<int>(d);
    } else if (arg == "--pin-threads") {
      opt->pin_threads = true;
    } else if (arg == "--save-frame") {
      if (!number("--save-frame", 0, 1e8, &d)) return false;
      opt->save_frame = static_cast<int>(d);
    } else {
      std::fprintf(stderr, "kiln-game: unknown argument '%s'\n", arg.c_str());
      return false;
    }
  }
  if (opt->model_path.empty()) {
    const char* home = std::getenv("HOME");
    opt->model_path =
        std::string(home ? home : ".") + "/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (opt->save_frame >= 0 && opt->save_dir.empty()) {
    std::fprintf(stderr, "kiln-game: --save-frame needs --save DIR\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Game game;
  if (!ParseArgs(argc, argv, &game.opt)) {
    Usage();
    return 64;
  }
  kiln_model_params model_params;
  Check("kiln_model_params_init", kiln_model_params_init(&model_params, sizeof model_params));
  model_params.path = game.opt.model_path.c_str();
  Check("kiln_model_load", kiln_model_load(&model_params, &game.model));
  kiln_cache_params cache_params;
  Check("kiln_cache_params_init", kiln_cache_params_init(&cache_params, sizeof cache_params));
  // Each NPC's conversation stays short; room for all four plus slack for the prefix cache.
  cache_params.n_ctx = 1024;
  cache_params.pool_bytes = size_t{kNumNpcs + 2} * 1024 * 24 * 1024;
  cache_params.n_threads = game.opt.threads;
  cache_params.pin_threads = game.opt.pin_threads ? 1 : 0;
  Check("kiln_cache_create", kiln_cache_create(game.model, &cache_params, &game.cache));
  for (int i = 0; i < kNumNpcs; ++i) {
    // A sampler per NPC with its own seed, so the NPCs do not all talk alike; the same seed gives
    // the same dialogue.
    kiln_sampler_params sampler_params;
    Check("kiln_sampler_params_init",
          kiln_sampler_params_init(&sampler_params, sizeof sampler_params));
    sampler_params.seed = game.opt.seed * 16 + static_cast<uint64_t>(i);
    kiln_sampler* sampler = nullptr;
    Check("kiln_sampler_create", kiln_sampler_create(&sampler_params, &sampler));
    Check("kiln_session_create",
          kiln_session_create(game.model, game.cache, sampler, &game.npcs[i].session));
    kiln_sampler_destroy(sampler);
  }
  if (!game.opt.load_dir.empty()) LoadGame(game, game.opt.load_dir);
  // --save in the window also saves on exit (F5 alone saves only when pressed).
  bool save_on_exit =
      !game.opt.headless && !game.opt.save_dir.empty() && game.opt.screenshot.empty();
  int rc = game.opt.headless ? RunHeadless(game) : RunWindow(game);
  if (save_on_exit && rc == 0) {
    game.save_pending = true;  // saved once the turns in progress end
    while (game.save_pending) GameTick(game);
  }
  for (Npc& npc : game.npcs) kiln_session_destroy(npc.session);
  kiln_cache_destroy(game.cache);
  kiln_model_destroy(game.model);
  return rc;
}
