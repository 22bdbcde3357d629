#include "lib/engine/engine.h"

#include <algorithm>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cuda/cuda_backend.h"

namespace kiln {

namespace {

// Pool sizes of a cache whose layout has a sliding group (EngineOptions::sliding_window_sessions):
// the sliding pool holds that many sessions' live windows, the global pool the rest of the bytes
// (or one full context when pool_bytes is 0). Rewrites capacity_bytes into block counts.
absl::Status SizeSlidingPools(const KvLayout& layout, const EngineOptions& opt,
                              KvCacheOptions* cache_options) {
  const int64_t bs = opt.block_size;
  // One session's live sliding rows: the window, the release margin and the attention's row
  // alignment behind its computed tokens, a partial block, and the most it appends before they
  // are computed (a prompt chunk or a draft); plus a copy-on-write spare.
  const int64_t rows = layout.sliding_window() + kSlidingReleaseMargin +
                       KvCache::kSlidingRowAlignment + bs +
                       std::max<int64_t>(opt.prefill_chunk, kSlidingReleaseMargin + 1);
  const int64_t per_session = (rows + bs - 1) / bs + 1;
  const int64_t wanted =
      std::min<int64_t>(per_session * opt.sliding_window_sessions + 1, INT32_MAX);
  const size_t global_bytes = layout.block_bytes(0);
  const size_t sliding_bytes = layout.block_bytes(1);
  int64_t global = 0;
  int64_t sliding = 0;
  if (opt.pool_bytes == 0) {
    global = (opt.n_ctx + bs - 1) / bs + 2;
    sliding = std::min(global, wanted);
  } else {
    const size_t wanted_bytes = static_cast<size_t>(wanted) * sliding_bytes;
    global = opt.pool_bytes > wanted_bytes
                 ? static_cast<int64_t>((opt.pool_bytes - wanted_bytes) / global_bytes)
                 : 0;
    sliding = wanted;
    if (global < sliding) {  // a small pool: never more sliding blocks than global ones
      global = sliding = static_cast<int64_t>(opt.pool_bytes / (global_bytes + sliding_bytes));
    }
    if (global < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool_bytes ", opt.pool_bytes, " holds fewer than 2 blocks of ",
                       global_bytes + sliding_bytes, " bytes (one is the reserved null block)"));
    }
  }
  cache_options->capacity_bytes = 0;
  cache_options->num_blocks = static_cast<int32_t>(std::min<int64_t>(global, INT32_MAX));
  cache_options->sliding_num_blocks = static_cast<int32_t>(sliding);
  cache_options->sliding_release_margin = kSlidingReleaseMargin;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Model& model,
                                                       const EngineOptions& options) {
  EngineOptions opt = options;
  if (opt.kv_type != GgmlType::kF16 && opt.kv_type != GgmlType::kF32 &&
      opt.kv_type != GgmlType::kBF16 && opt.kv_type != GgmlType::kQ8_0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_type must be f16, f32, bf16 or q8_0, got ",
                     GgmlTypeName(static_cast<uint32_t>(opt.kv_type))));
  }
  if (opt.block_size <= 0 || opt.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size ", opt.block_size, " is outside [1, 1024]"));
  }
  if (opt.n_ctx < 0) {
    return absl::InvalidArgumentError(absl::StrCat("n_ctx ", opt.n_ctx, " < 0"));
  }
  if (opt.prefill_chunk <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("prefill_chunk ", opt.prefill_chunk, " <= 0"));
  }
  if (opt.step_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("step_tokens ", opt.step_tokens, " <= 0"));
  }
  if (opt.sliding_window_sessions < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window_sessions ", opt.sliding_window_sessions, " < 0"));
  }
  if (opt.llama_cpp_order) opt.prefill_chunk = kLlamaCppUbatch;
  if (opt.n_ctx == 0) {
    opt.n_ctx = model.hparams().n_ctx_train > 0
                    ? static_cast<int32_t>(std::min<int64_t>(model.hparams().n_ctx_train, 1 << 20))
                    : 4096;
  }
  KILN_ASSIGN_OR_RETURN(KvLayout layout, model.architecture().CacheLayout(
                                             model.hparams(), opt.kv_type, opt.block_size));
  std::unique_ptr<Engine> engine(new Engine(model, opt));
  KvCacheOptions cache_options;
  cache_options.enable_prefix_caching = opt.prefix_caching;
  if (opt.pool_bytes == 0) {
    // Room for one full context: its blocks, a copy-on-write spare and the null block.
    const size_t blocks =
        static_cast<size_t>((opt.n_ctx + opt.block_size - 1) / opt.block_size) + 2;
    cache_options.capacity_bytes = blocks * layout.block_bytes();
  } else {
    if (opt.pool_bytes < 2 * layout.block_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool_bytes ", opt.pool_bytes, " holds fewer than 2 blocks of ",
                       layout.block_bytes(), " bytes (one is the reserved null block)"));
    }
    cache_options.capacity_bytes = opt.pool_bytes;
  }
  // The backend: the CPU unless CUDA is asked for and can hold the weights and the pool.
  BackendDecision decision;
  if (opt.backend != BackendKind::kCpu) {
    const CudaProbe probe = ProbeCuda(opt.cuda_device, layout);
    decision =
        DecideBackend(opt.backend, probe, model.weight_bytes() + cache_options.capacity_bytes);
    if (decision.use_cuda) {
      auto cuda = cuda::CudaBackend::Create(*probe.module, opt.cuda_device, opt.n_threads);
      if (cuda.ok()) {
        engine->backend_ = std::move(*cuda);
      } else {
        decision.fallback_reason =
            StrCat("cuda requested, running on the CPU: ", cuda.status().message());
      }
    }
  }
  const bool on_cpu = engine->backend_ == nullptr;
  if (on_cpu) engine->backend_ = std::make_unique<cpu::CpuBackend>(opt.n_threads);
  engine->backend_description_ = engine->backend_->Describe();
  if (!decision.fallback_reason.empty()) {
    engine->backend_description_ += StrCat("; ", decision.fallback_reason);
  }
  engine->backend_->set_llama_cpp_order(opt.llama_cpp_order);
  cache_options.storage = [backend = engine->backend_.get()](const KvLayout& l, int32_t n_blocks) {
    return backend->NewKvStorage(l, n_blocks);
  };
  const ModelHparams& hp = model.hparams();
  // (A model whose every layer slides keeps them all: a group needs a global layer.)
  const bool has_global_layer =
      std::find(hp.swa_layers.begin(), hp.swa_layers.end(), 0) != hp.swa_layers.end();
  if (opt.sliding_window_sessions > 0 && hp.sliding_window > 0 && has_global_layer) {
    if (on_cpu) {
      KILN_ASSIGN_OR_RETURN(
          layout, layout.WithSlidingGroup(hp.swa_layers, static_cast<int32_t>(hp.sliding_window)));
      KILN_RETURN_IF_ERROR(SizeSlidingPools(layout, opt, &cache_options));
      engine->max_draft_nodes_ = kSlidingReleaseMargin;
    } else {
      engine->backend_description_ +=
          "; sliding-window release is CPU-only: every layer's K/V is kept";
    }
  }
  KILN_ASSIGN_OR_RETURN(engine->cache_, KvCache::Create(layout, cache_options));
  KILN_ASSIGN_OR_RETURN(engine->forward_, model.architecture().NewForwardWithOptions(
                                              model, *engine->backend_,
                                              ForwardOptions{.mla_prefill = opt.mla_prefill}));
  // llama.cpp's bits depend on the batch: one session's work per pass, in its prefill chunks.
  engine->scheduler_ = std::make_unique<Scheduler>(
      *engine, opt.llama_cpp_order ? opt.prefill_chunk : opt.step_tokens, opt.llama_cpp_order);
  return engine;
}

KvCacheCounters Engine::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_->Counters();
}

absl::Status Engine::Prefill(const PrefillRequest& request, int32_t* n_done) {
  const int32_t n = static_cast<int32_t>(request.tokens.size());
  const int32_t chunk = options_.prefill_chunk;
  if (n_done != nullptr) *n_done = 0;
  for (int32_t begin = 0; begin < n; begin += chunk) {
    if (request.cancelled && request.cancelled()) {
      return absl::CancelledError(
          absl::StrCat("cancelled after ", begin, " of ", n, " new tokens were computed"));
    }
    const int32_t end = std::min(n, begin + chunk);
    KILN_RETURN_IF_ERROR(Locked([&](KvCache& cache, ForwardPass& pass) -> absl::Status {
      KILN_ASSIGN_OR_RETURN(const int32_t start, cache.Length(request.seq));
      batch_.Clear();
      for (int32_t i = begin; i < end; ++i) {
        const bool want = i >= request.logits_from || (request.last_logits && i == n - 1);
        batch_.Add(request.tokens[i], request.seq, start + (i - begin), want);
      }
      batch_.want_hidden = static_cast<bool>(request.on_hidden);
      KILN_RETURN_IF_ERROR(
          cache.AppendSlots(request.seq, request.tokens.subspan(begin, end - begin)));
      absl::Status st = pass.Forward(batch_, cache, &out_);
      if (!st.ok()) {
        cache.Truncate(request.seq, start).IgnoreError();
        return st;
      }
      if (request.on_logits) {
        // Rows of out_.logits are the tokens that asked, in batch order.
        for (size_t r = 0; r < out_.logit_tokens.size(); ++r) {
          request.on_logits(begin + out_.logit_tokens[r], out_.LogitsRow(r));
        }
      }
      if (request.on_hidden && out_.has_hidden()) {
        for (size_t r = 0; r < out_.logit_tokens.size(); ++r) {
          request.on_hidden(begin + out_.logit_tokens[r], out_.HiddenRow(r));
        }
      }
      return absl::OkStatus();
    }));
    if (n_done != nullptr) *n_done = end;
  }
  return absl::OkStatus();
}

}  // namespace kiln
