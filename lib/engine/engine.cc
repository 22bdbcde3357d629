#include "lib/engine/engine.h"

#include <algorithm>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cuda/cuda_backend.h"

namespace kiln {

namespace {

// The K/V pool's bytes: pool_bytes, which must hold a block of every group and the null block,
// or when it is 0 room for one full context of every group (its blocks, a copy-on-write spare
// per group and the null block).
absl::StatusOr<size_t> PoolBytes(const KvLayout& layout, const EngineOptions& opt) {
  const size_t groups = static_cast<size_t>(layout.n_groups());
  if (opt.pool_bytes == 0) {
    const size_t blocks_per_group =
        static_cast<size_t>((opt.n_ctx + opt.block_size - 1) / opt.block_size) + 1;
    return (blocks_per_group * groups + 1) * layout.block_bytes();
  }
  if (opt.pool_bytes < (groups + 1) * layout.block_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool_bytes ", opt.pool_bytes, " holds fewer than ", groups + 1, " blocks of ",
        layout.block_bytes(), " bytes (one a layer group and the reserved null block)"));
  }
  return opt.pool_bytes;
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
  if (opt.llama_cpp_order) opt.prefill_chunk = kLlamaCppUbatch;
  if (opt.n_ctx == 0) {
    opt.n_ctx = model.hparams().n_ctx_train > 0
                    ? static_cast<int32_t>(std::min<int64_t>(model.hparams().n_ctx_train, 1 << 20))
                    : 4096;
  }
  KILN_ASSIGN_OR_RETURN(KvLayout layout,
                        model.architecture().CacheLayoutForOrder(
                            model.hparams(), opt.kv_type, opt.block_size, opt.llama_cpp_order));
  std::unique_ptr<Engine> engine(new Engine(model, opt));
  KvCacheOptions cache_options;
  cache_options.enable_prefix_caching = opt.prefix_caching;
  // The backend: the CPU unless CUDA is asked for and can hold the weights and the pool (of the
  // layout without groups: CUDA keeps every layer's K/V).
  BackendDecision decision;
  if (opt.backend != BackendKind::kCpu) {
    const CudaProbe probe = ProbeCuda(opt.cuda_device, layout);
    const size_t pool_bytes = PoolBytes(layout, opt).value_or(opt.pool_bytes);
    decision = DecideBackend(opt.backend, probe, model.weight_bytes() + pool_bytes);
    if (decision.use_cuda) {
      // The engine's own copy of the model's weights on the device (a model is shared by
      // engines on any backend; the host copy stays for the CPU).
      auto cuda = cuda::CudaBackend::Create(*probe.module, opt.cuda_device, opt.n_threads);
      absl::Status uploaded = cuda.ok() ? (*cuda)->UploadWeights(model.tensors()) : cuda.status();
      if (uploaded.ok()) {
        engine->backend_ = std::move(*cuda);
      } else {
        decision.fallback_reason =
            StrCat("cuda requested, running on the CPU: ", uploaded.message());
      }
    }
  }
  if (engine->backend_ == nullptr) {
    engine->backend_ = std::make_unique<cpu::CpuBackend>(opt.n_threads, opt.pin_threads);
  }
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
  if (!opt.swa_full && hp.sliding_window > 0 && has_global_layer) {
    KILN_ASSIGN_OR_RETURN(
        layout, layout.WithSlidingGroups(hp.swa_layers, static_cast<int32_t>(hp.sliding_window)));
    cache_options.sliding_release_margin = kSlidingReleaseMargin;
    engine->max_draft_nodes_ = kSlidingReleaseMargin;
  }
  KILN_ASSIGN_OR_RETURN(cache_options.capacity_bytes, PoolBytes(layout, opt));
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
      if (request.on_hidden) {
        batch_.want_hidden = request.hidden_layers.empty();
        batch_.WantHiddenLayers(request.hidden_layers);
      }
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
      } else if (request.on_hidden && !request.hidden_layers.empty()) {
        // The batch asked for exactly these layers: row r's are contiguous.
        const size_t width = request.hidden_layers.size() * out_.layer_width;
        for (size_t r = 0; r < out_.logit_tokens.size(); ++r) {
          request.on_hidden(begin + out_.logit_tokens[r], out_.layer_hidden.data() + r * width);
        }
      }
      return absl::OkStatus();
    }));
    if (n_done != nullptr) *n_done = end;
  }
  return absl::OkStatus();
}

}  // namespace kiln
