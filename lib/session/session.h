// Session: a conversation on an Engine (lib/engine/engine.h). Every computation of a session
// (an append's prefill, each generated token, a speculative step) is a request that the engine's
// scheduler (lib/engine/scheduler.h) runs batched with the requests of the other sessions of the
// engine: concurrent sessions share each forward pass instead of taking turns. The blocking calls
// (Append*, Generate) submit their request and step the engine themselves until it is done (or
// wait for the thread that is stepping); Submit/Poll are the non-blocking form.
//
// Output invariance: in the default numeric order the kernels are batch invariant
// (docs/numerics.md), so a session's tokens and logits are bitwise the same whether it runs
// alone or batched with other sessions, also after being preempted and recomputed. With
// EngineOptions::llama_cpp_order the scheduler runs one session's work per pass, so the bits
// are llama.cpp's as before, except after a preemption (the recompute batches differently).
//
// A session is one token stream (a conversation) held as a sequence in the engine's cache, plus a
// sampler and a seeded Rng. Its tokens are split in two parts:
//   tokens()[0, n_cached)  K/V in the cache (computed, or attached from the prefix cache)
//   tokens()[n_cached, n)  pending: accepted but not computed yet (the last generated token, a
//                          token moved back by Rewind). The next Append/Generate computes them.
// The next-token logits are those after tokens()[n - 1] when there are no pending tokens.
//
// Atomicity: AppendText/AppendTokens either take every token or leave the session exactly as it
// was (cache full, cancel, bad token id, past the context: the sequence is truncated back).
// Generate keeps the tokens it emitted through the callback, also when it then fails.
//
// Thread-safety: a Session is used by one thread at a time; a
// call made while another thread is inside a call on the same session fails with Aborted ("busy")
// and changes nothing, never undefined behaviour. Read-only getters may also be called from the
// Generate callback on the generating thread. Cancel() and published_n_tokens() may be called
// from any thread at any time, Poll() too. While a submitted request is in flight every other
// call fails with Aborted (busy). The engine (and model) must outlive every session created on
// it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "lib/common/status.h"
#include "lib/engine/engine.h"
#include "lib/engine/strategy.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rng.h"
#include "lib/sample/sampler.h"

namespace kiln {

namespace spec {
class SpeculativeDecoder;
}  // namespace spec

enum class StopReason {
  kEndOfGeneration = 0,  // the model produced an end-of-generation token (kept in the session)
  kMaxTokens = 1,
  kStopString = 2,   // a stop string appeared in the text; it is not emitted
  kCallback = 3,     // the callback returned false
  kCancelled = 4,    // Cancel()
  kContextFull = 5,  // the session reached n_ctx tokens
};

struct GenerateOptions {
  int32_t max_tokens = 128;               // >= 0
  std::vector<std::string> stop_strings;  // non-empty strings
  // Called once per generated token with the text it completed (possibly empty: a partial UTF-8
  // character, or text held back because it may start a stop string). At the end, text still
  // held back (and not part of a stop string) comes in one more call with token -1. Return false
  // to stop. May be empty.
  std::function<bool(int32_t token, std::string_view piece)> on_token;
};

struct GenerateResult {
  int32_t n_tokens = 0;  // tokens generated (the EOG token and the stop-string token included)
  StopReason reason = StopReason::kMaxTokens;
};

// A non-blocking request (Submit): append `prompt`, then generate like Generate.
struct SubmitOptions {
  std::vector<int32_t> prompt;  // may be empty (generate after the session's tokens)
  GenerateOptions generate;     // max_tokens 0: only compute the prompt
  // Callbacks run on the thread that steps the engine (Scheduler: a host calling Step, a
  // blocking call of another session, the worker), after the step that produced the tokens and
  // outside the engine mutex. generate.on_token returning false stops the request before its
  // next step (StopReason::kCallback; the tokens of the step that are already made are still
  // passed). With on_token set, Poll returns no text or tokens (the callback had them).
  std::function<void(const absl::Status& status, const GenerateResult& result)> on_done;
};

// What Poll returns: output since the previous poll, and the end of the request.
struct PollResult {
  std::string text;             // appended (up to the capacity asked for)
  std::vector<int32_t> tokens;  // appended generated token ids (up to the capacity asked for)
  size_t text_left = 0;         // bytes and tokens still queued after this poll
  size_t tokens_left = 0;
  bool done = false;     // the request ended and everything it produced has been returned
  absl::Status status;   // when done: OK, or why it failed (the prompt then was not appended)
  int32_t n_tokens = 0;  // tokens generated so far (the EOG and stop-string tokens included)
  StopReason reason = StopReason::kMaxTokens;  // when done with OK status
};

// What Session::SaveState stores besides the tokens, sampler and random state (see
// docs/session_state.md).
struct SaveStateOptions {
  // true: the K/V of the computed tokens, bit for bit in the cache's element type (about
  // bytes_per_token per token: 23 KB for the default model at f16), and the last logits, so a
  // restore is a copy. false: tokens only; the restore recomputes the K/V (a prefill; with prefix
  // caching on, cached prefix blocks are attached instead) and gets the same bits, since the
  // kernels are batch invariant (not with EngineOptions::llama_cpp_order). A cache that releases
  // sliding-window blocks (EngineOptions::swa_full false) saves the sliding layers' rows
  // it still holds; a cache that needs rows a state lacks recomputes the K/V from its tokens.
  bool kv = true;
  // true: the speculative strategy's adaptive state (Strategy::SaveState); a strategy that
  // cannot save it (the draft model) makes SaveState fail with Unimplemented. false: not stored;
  // a restored session's strategy starts afresh (greedy output is the same either way).
  bool strategy = true;
};

struct SessionStats {
  int64_t computed_tokens = 0;  // tokens run through the forward pass (prefill + decode)
  int64_t attached_tokens = 0;  // tokens attached from the prefix cache instead
  int64_t preemptions = 0;      // times the scheduler released its K/V to make room
};

class Session {
 public:
  // A new empty session on `engine`, sampling with `params` and an Rng seeded with `seed`.
  // InvalidArgument when the sampler parameters are bad (names the field).
  static absl::StatusOr<std::unique_ptr<Session>> Create(Engine& engine,
                                                         const sample::SamplerParams& params,
                                                         uint64_t seed);
  ~Session();  // frees the sequence (its full computed blocks stay in the prefix cache)
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Tokenizes `text` and appends it (see AppendTokens).
  absl::Status AppendText(std::string_view text, bool add_special, bool parse_special);

  // Appends tokens and prefills them (with the pending ones) in chunks of
  // EngineOptions::prefill_chunk; afterwards the logits of the last token are available. On an
  // empty session with prefix caching on, the longest cached prefix of tokens[0, n-1) is attached
  // instead of recomputed. Errors (nothing changed): InvalidArgument (token id out of range,
  // naming its index), OutOfRange (the session would exceed n_ctx), ResourceExhausted (cache
  // full), Cancelled (Cancel() during the call), Aborted (busy).
  absl::Status AppendTokens(std::span<const int32_t> tokens);

  // Appends tokens like AppendTokens and writes, for i in [0, tokens.size() - 1), the natural
  // log-probability of tokens[i + 1] given the session and tokens[0, i] into logprobs[i]
  // (logprobs.size() must be tokens.size() - 1). For perplexity.
  absl::Status AppendTokensScored(std::span<const int32_t> tokens, std::span<float> logprobs);

  // Samples up to options.max_tokens tokens, computing each before sampling the next. Stops on
  // an end-of-generation token, max_tokens, a stop string (also split across tokens), the
  // callback, Cancel(), or n_ctx. Errors: FailedPrecondition (empty session), InvalidArgument
  // (bad options), OutOfRange (already at n_ctx), ResourceExhausted (cache full: the tokens
  // generated so far stay, the failing step changed nothing), Aborted (busy).
  absl::StatusOr<GenerateResult> Generate(const GenerateOptions& options);

  // Asks the call in flight to stop (Append* between prefill chunks, Generate between decode
  // steps, a submitted request in any state: queued, prefilling or decoding, at the engine's
  // next step). A cancel applies only to the call in flight: every mutating call drops a pending
  // cancel as it starts, so a cancel that arrives while no call is in flight has no effect.
  // Any thread, any time.
  void Cancel();

  // Starts a request and returns at once: the prompt is appended (checked like AppendTokens),
  // then computed and generated from by the engine's scheduler whenever some thread steps it
  // (Scheduler::Step, the worker, or a blocking call of any session of the engine). Poll (or
  // the callbacks) collect the output. All or nothing for the prompt: when the request ends
  // before the prompt is computed (cancel, cache full), the session is as before the Submit and
  // the status says why; after that, generated tokens stay. Errors (nothing changed):
  // InvalidArgument (bad token id or options), OutOfRange (past n_ctx), FailedPrecondition
  // (empty session and prompt with max_tokens > 0), Aborted (busy).
  absl::Status Submit(SubmitOptions options);
  // Moves up to text_capacity bytes and token_capacity tokens of the output into *out (text may
  // end inside a UTF-8 character; the next poll continues it); a capacity of 0 drops that kind of
  // output. Any thread, any time (not concurrently with the destructor). FailedPrecondition when
  // no request was ever submitted. Once it reports done the session takes calls again; later
  // polls report done again.
  absl::Status Poll(size_t text_capacity, size_t token_capacity, PollResult* out);
  // True while a submitted request has not been reported done (by Poll or on_done).
  bool request_in_flight() const { return in_flight_.load(std::memory_order_acquire); }

  // A new session with the same tokens (sharing the cache blocks by reference), logits, sampler
  // parameters and Rng state. With a speculative strategy set, the fork gets its own clone of it
  // (Strategy::Clone: same adaptive state; a draft model's cache sequence is forked too), owned
  // by the fork, and the decoder's measured pass cost, so both sessions continue speculating
  // (the fork's spec_metrics() start at zero). Errors: Aborted (busy), Unimplemented (the
  // strategy cannot be cloned), the clone's errors.
  absl::StatusOr<std::unique_ptr<Session>> Fork();

  // Saved state (docs/session_state.md, lib/session/session_state.proto): the tokens, the K/V of
  // the computed ones (or only the tokens, see SaveStateOptions), the last logits, the sampler
  // parameters, the Rng state, the top logprobs of the last token, and with a speculative
  // strategy its decoder's pass-cost model and the strategy's state. A session restored from it
  // (LoadState) continues bit for bit as this one would: the same tokens, greedy or seeded.
  // The state carries a fingerprint of the model, a format version and a CRC-32C.
  // Errors: Aborted (busy, or called from the generate callback), Unimplemented (a strategy that
  // cannot save its state, with options.strategy), OutOfRange (over 2 GiB: save without K/V).
  absl::StatusOr<std::string> SaveState(const SaveStateOptions& options = {});
  // SaveState written to `path` (through a temporary file renamed over it, so a crash never
  // leaves half a state under the name). Errors: SaveState's, the file system's (the path and
  // the OS's reason).
  absl::Status SaveStateToFile(const std::string& path, const SaveStateOptions& options = {});

  // Replaces this session's contents (tokens, K/V, logits, sampler parameters, Rng state) with a
  // saved state of a session on an engine of the same model; any block size, a cache of the same
  // kv_type when the state holds K/V. The strategy: when the state holds the state of one and
  // this session has a strategy of that name set (SetStrategy, before LoadState), the strategy
  // is loaded from it and must have the same parameters; a strategy whose state was not saved is
  // Reset; a saved strategy state is ignored when this session has no strategy. The decoder's
  // pass-cost model is restored; spec_metrics() start at zero.
  // All or nothing: on any error the session and the cache are exactly as before.
  // Errors: DataLoss (not a state, truncated, corrupted, malformed), Unimplemented (a newer
  // format version), InvalidArgument (another model, another K/V type, bad sampler parameters,
  // a strategy of another kind or with other parameters), OutOfRange (more tokens than n_ctx),
  // ResourceExhausted (cache full: the restored K/V need their blocks while this session's
  // current ones are still held), Cancelled (Cancel() during a recompute), Aborted (busy).
  absl::Status LoadState(std::string_view state);
  // LoadState of the bytes of `path`. Errors: LoadState's, the file system's (NotFound, ...).
  absl::Status LoadStateFromFile(const std::string& path);

  // Removes the last n_tokens tokens (0 <= n_tokens <= n). The logits are recomputed lazily by
  // the next Generate. Errors: OutOfRange (n_tokens > n or < 0), Aborted (busy).
  absl::Status Rewind(int32_t n_tokens);

  // Logits [n_vocab] after the last token; empty when not available (empty session, pending
  // tokens, after Rewind). Valid until the next call on the session.
  std::span<const float> Logits() const;
  // The top log-probabilities of the last sampled token (empty unless n_logprobs > 0).
  std::span<const sample::TokenLogprob> LastLogprobs() const { return last_logprobs_; }

  // Speculative decoding (lib/spec, docs/speculative.md): from now on Generate lets `strategy`
  // draft tokens and verifies them with the target in one pass per step; the output is
  // distributed exactly as without it (identical at temperature 0). nullptr: plain decoding.
  // The strategy is borrowed: it must outlive its use by this session and serve no other
  // session at the same time. LastLogprobs() is updated for every token a speculative step emits
  // (before the callback sees it) with what plain decoding would report. May be changed between
  // calls. Errors: Aborted (busy).
  absl::Status SetStrategy(spec::Strategy* strategy);
  // The strategy in use (the one set, or a fork's own clone); nullptr without one.
  spec::Strategy* spec_strategy() const;
  // Cumulative speculative metrics of this session (zero without a strategy).
  spec::SpecMetrics spec_metrics() const;
  // The measured cost of target passes by width that strategies use to choose their draft length
  // (draft_policy.h); nullptr before the first SetStrategy. Pin it (PassCostModel::Pin) for
  // reproducible sampled text with a cost-aware strategy. Same rules as the other calls.
  spec::PassCostModel* spec_cost_model();

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  // n_tokens() for any thread at any time, also while another thread is inside a call: the count
  // as of the last completed token. During an append it is the count before the append (the
  // appended tokens count once the append has succeeded); during Generate each generated token
  // counts from the moment it is handed to the callback. Between calls it equals n_tokens().
  int32_t published_n_tokens() const { return published_n_tokens_.load(std::memory_order_acquire); }
  int32_t n_cached() const { return n_cached_; }
  const SessionStats& stats() const { return stats_; }
  // True while some thread is inside a call on this session, or a submitted request is in
  // flight.
  bool busy() const {
    return owner_.load(std::memory_order_acquire) != std::thread::id() || request_in_flight();
  }

  // The in-use flag of one call. status() is Aborted when another thread is inside a call on the
  // session, or when a mutating call is made from inside this thread's own Generate callback;
  // a read-only scope on the generating thread (the callback) is allowed. Every public mutating
  // method takes one; the C API takes a read-only one around the getters. A mutating Use starts
  // a call: it drops a cancel that arrived before it (see Cancel).
  class Use {
   public:
    Use(const Session& session, const char* what, bool mutating);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    const absl::Status& status() const { return status_; }

   private:
    const Session& session_;
    const bool mutating_;
    bool owns_ = false;
    absl::Status status_;
  };

 private:
  class Job;  // a request in the engine's scheduler (session.cc)

  Session(Engine& engine, const sample::SamplerParams& params, uint64_t seed, SeqId seq);

  // Takes back tokens_/n_cached_ to (n_tokens, n_cached) after a failure (RestoreToLocked:
  // with the engine mutex held).
  void RestoreTo(size_t n_tokens, int32_t n_cached);
  void RestoreToLocked(KvCache& cache, size_t n_tokens, int32_t n_cached);
  // The job object, out of the scheduler, ready for Reset.
  Job& PrepareJob();
  // Runs the job (set up by the caller) through the scheduler until it ends; blocking calls.
  absl::Status RunJob();
  bool ConsumeCancel() { return cancel_.exchange(false, std::memory_order_acq_rel); }
  // Sets published_n_tokens(). Every mutating call publishes tokens_.size() as it ends (Use);
  // Generate also publishes each token as it hands it to the callback.
  void PublishNTokens(size_t n) const {
    published_n_tokens_.store(static_cast<int32_t>(n), std::memory_order_release);
  }
  // AppendTokens inside a call that already holds the session (AppendText tokenizes first).
  absl::Status AppendTokensHeld(std::span<const int32_t> tokens);
  absl::Status CheckTokens(std::span<const int32_t> tokens) const;

  Engine& engine_;
  const int64_t n_vocab_;
  SeqId seq_;
  sample::Sampler sampler_;
  sample::Rng rng_;
  std::vector<int32_t> tokens_;
  int32_t n_cached_ = 0;
  std::vector<float> logits_;  // [n_vocab]
  bool logits_valid_ = false;
  // The session was preempted (its K/V dropped) where its next token was to be sampled from the
  // last token's logits: the recompute computes the last token too and samples from its logits
  // as it would have unpreempted, instead of leaving it pending as a speculative step's root.
  bool sample_after_recompute_ = false;
  sample::Distribution dist_;
  std::vector<sample::TokenLogprob> last_logprobs_;
  SessionStats stats_;
  // Set by Cancel(); cleared as each mutating call starts (Use), consumed when honoured.
  mutable std::atomic<bool> cancel_{false};
  mutable std::atomic<int32_t> published_n_tokens_{0};  // see published_n_tokens()
  mutable std::atomic<std::thread::id> owner_{};
  std::unique_ptr<spec::Strategy> owned_strategy_;  // a fork's clone (declared before spec_)
  std::unique_ptr<spec::SpeculativeDecoder> spec_;  // created by SetStrategy
  std::unique_ptr<Job> job_;  // the request in flight or the last one (one per session, reused)
  std::atomic<bool> in_flight_{false};  // a submitted request not yet reported done
};

}  // namespace kiln
