// Engine: one model's forward pass on one backend over one paged KV cache, the single place
// computation happens. Sessions, speculative strategies (a draft model is an Engine of its own),
// tools and benches all run their batches through it.
//
// It owns the KvCache (its blocks' storage comes from the backend), the Backend (the CPU's
// thread pool and scratch), the architecture's ForwardPass, and a mutex that serializes every
// cache call and forward pass, so sessions on different threads may share it. Locked() runs a
// step under the mutex; Prefill() is a loop that computes a run of new tokens of one sequence in
// chunks (for draft models and tools). Sessions run through the engine's Scheduler
// (scheduler.h): continuous batching, one forward pass per step for every request in flight.
//
// Thread-safety: fully thread-safe. The model must outlive the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/backend/backend_select.h"
#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/engine/scheduler.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/architecture.h"
#include "lib/model/forward_batch.h"
#include "lib/model/model.h"

namespace kiln {

// llama.cpp's default n_ubatch: the prompt batch size EngineOptions::llama_cpp_order prefills with.
inline constexpr int32_t kLlamaCppUbatch = 512;

struct EngineOptions {
  // KV pool size in bytes (rounded down to whole blocks). 0: room for n_ctx tokens plus one block.
  size_t pool_bytes = 0;
  int32_t block_size = 16;
  // f16, f32, bf16 or q8_0 (blocks of 32 with an f16 scale, as ggml's; 34/64 of f16's bytes;
  // head_dim must be a multiple of 32).
  GgmlType kv_type = GgmlType::kF16;
  bool prefix_caching = true;
  // Largest number of tokens a session may hold. 0: the model's training context.
  int32_t n_ctx = 0;
  int n_threads = 0;  // <= 0: physical cores
  // CPU backend: each worker thread bound to a core of its own (cpu::ThreadPool), so the OS cannot
  // put a worker on the core of the thread that steps the engine.
  bool pin_threads = false;
  // Tokens per forward call when prefilling (and per cancellation check); with the scheduler,
  // the most prefill tokens of one session in one step.
  int32_t prefill_chunk = 256;
  // The scheduler's token budget per step: decode tokens (and draft trees) of every session in
  // flight, then prefill chunks up to this many tokens in all.
  int32_t step_tokens = 512;
  // Backend::set_llama_cpp_order: llama.cpp's bits instead of batch invariance. Its bits depend
  // on how a prompt is split into batches, so this also prefills in chunks of kLlamaCppUbatch
  // tokens (llama.cpp's default n_ubatch) instead of prefill_chunk.
  bool llama_cpp_order = false;
  // The backend of the forward passes (backend_select.h): the CPU (default), or the CUDA device
  // cuda_device when it can run the model, else the CPU with the reason in BackendDescription.
  BackendKind backend = BackendKind::kCpu;
  int32_t cuda_device = 0;
  // MLA models only: absorbed everywhere (every bitwise guarantee) or the measured choice of
  // decompressed prefill for long chunks (faster; a token's last bits then depend on how its
  // prompt was chunked). architecture.h has the modes.
  MlaPrefillMode mla_prefill = MlaPrefillMode::kAbsorbed;
  // Models with both sliding-window and global layers (gemma3), CPU backend: false (default)
  // puts each kind of layer in block groups of its own over the one pool and releases the
  // sliding layers' blocks that every window has left, for any session to reuse
  // (docs/kv_cache.md); rewinding past a released window then recomputes the session's K/V, and
  // speculative drafts are cut to kSlidingReleaseMargin nodes. true keeps every layer's K/V for
  // the whole context (llama.cpp's --swa-full).
  bool swa_full = false;
};

// Tokens of sliding-layer K/V kept past the window when released (EngineOptions::swa_full
// false): the longest speculative draft that can be rolled back, and the
// rewind of one token that recomputes a session's last logits.
inline constexpr int32_t kSlidingReleaseMargin = 64;

// A run of new tokens for Engine::Prefill.
struct PrefillRequest {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // appended after the sequence's current Length
  // Tokens at index >= logits_from (and the last token when last_logits) return logits to
  // on_logits(index in tokens, row [n_vocab]).
  int32_t logits_from = INT32_MAX;
  bool last_logits = true;
  std::function<void(int32_t index, const float* logits)> on_logits;
  // When set, the same tokens also return their target features (ForwardOutput::hidden: the
  // normed final hidden state the LM head reads) to on_hidden(index in tokens, row [n_embd]),
  // after on_logits; used to capture training data for draft heads (tools/train/).
  std::function<void(int32_t index, const float* hidden)> on_hidden;
  // With on_hidden: when not empty, its rows are instead the outputs of these target layers
  // (ascending; ForwardBatch::hidden_layers), back to back: [hidden_layers.size(), n_embd].
  std::vector<int32_t> hidden_layers;
  // Checked before each chunk; true stops with Cancelled (the chunks done stay computed).
  std::function<bool()> cancelled;
};

class Engine {
 public:
  // InvalidArgument naming the field for bad options; ResourceExhausted when the pool cannot hold
  // a single block; the architecture's errors. The model must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Model& model,
                                                        const EngineOptions& options);

  const Model& model() const { return model_; }
  const EngineOptions& options() const { return options_; }
  int32_t n_ctx() const { return options_.n_ctx; }
  KvCacheCounters Counters() const;
  // The backend in use ("cpu (avx2, 2 threads)"), and when a CUDA request fell back to the CPU,
  // "; cuda requested, running on the CPU: <reason>".
  const std::string& BackendDescription() const { return backend_description_; }
  // The most draft nodes one speculative step may verify: kSlidingReleaseMargin when the cache
  // releases sliding-window blocks, else unlimited.
  int32_t max_draft_nodes() const { return max_draft_nodes_; }

  // Runs fn(KvCache&, ForwardPass&) with the engine mutex held; returns what fn returns. The
  // pass's Forward is the entry point of computation (lib/model/architecture.h).
  template <typename Fn>
  auto Locked(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    return fn(*cache_, *forward_);
  }

  // Appends request.tokens to the sequence and computes them in chunks of the engine's prefill
  // size, causally. *n_done (optional) counts the tokens computed so far, also on failure. On an
  // error the failing chunk's slots are removed again (earlier chunks stay computed); the
  // caller truncates further if it wants the sequence back as it was. Errors: the cache's
  // (ResourceExhausted when full), the forward pass's, Cancelled.
  absl::Status Prefill(const PrefillRequest& request, int32_t* n_done = nullptr);

  // The continuous-batching scheduler that runs every session's requests (scheduler.h).
  Scheduler& scheduler() { return *scheduler_; }

 private:
  Engine(const Model& model, const EngineOptions& options) : model_(model), options_(options) {}

  const Model& model_;
  EngineOptions options_;
  mutable std::mutex mu_;
  std::unique_ptr<Backend> backend_;  // declared before what borrows it
  std::string backend_description_;
  int32_t max_draft_nodes_ = INT32_MAX;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ForwardPass> forward_;
  ForwardBatch batch_;  // Prefill's, under mu_
  ForwardOutput out_;
  std::unique_ptr<Scheduler> scheduler_;  // last: destroyed (its worker stopped) first
};

}  // namespace kiln
