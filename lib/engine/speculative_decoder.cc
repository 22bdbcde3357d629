#include "lib/engine/speculative_decoder.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln::spec {

SpeculativeDecoder::SpeculativeDecoder(Engine& engine, SeqId seq, sample::Sampler& sampler,
                                       sample::Rng& rng, Strategy* strategy)
    : engine_(engine), seq_(seq), sampler_(sampler), rng_(rng), strategy_(strategy) {}

namespace {

// Checks the shape of a proposal and trims it to max_draft nodes (the first max_draft nodes of a
// topological order form a tree).
absl::Status CheckDraft(DraftTree& d, int32_t max_draft, int64_t n_vocab, const std::string& who) {
  if (d.parents.size() != d.tokens.size()) {
    return absl::InternalError(absl::StrCat("strategy ", who, ": draft has ", d.tokens.size(),
                                            " tokens but ", d.parents.size(), " parents"));
  }
  if (!d.deterministic && d.q.size() != d.tokens.size()) {
    return absl::InternalError(absl::StrCat("strategy ", who, ": sampled draft has ",
                                            d.tokens.size(), " tokens but ", d.q.size(), " q"));
  }
  if (d.size() > max_draft) {
    d.tokens.resize(max_draft);
    d.parents.resize(max_draft);
    if (!d.deterministic) d.q.resize(max_draft);
  }
  for (int32_t i = 0; i < d.size(); ++i) {
    if (d.parents[i] < -1 || d.parents[i] >= i) {
      return absl::InternalError(absl::StrCat("strategy ", who, ": draft node ", i, " has parent ",
                                              d.parents[i], " (must be -1 or < ", i, ")"));
    }
    if (d.tokens[i] < 0 || d.tokens[i] >= n_vocab) {
      return absl::InternalError(absl::StrCat("strategy ", who, ": draft node ", i, " token ",
                                              d.tokens[i], " is outside [0, ", n_vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

void ClearResult(SpecStepResult* out) {
  out->emitted.clear();
  out->logprobs.clear();
  out->drafted = 0;
  out->accepted = 0;
  out->end_of_generation = false;
}

}  // namespace

absl::Status SpeculativeDecoder::Propose(const std::vector<int32_t>& tokens, int32_t max_emit,
                                         int32_t max_width) {
  if (tokens.empty()) {
    return absl::FailedPreconditionError("SpeculativeDecoder::Step: no root token");
  }
  if (max_emit < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SpeculativeDecoder::Step: max_emit ", max_emit, " < 1"));
  }
  const int32_t max_nodes =
      std::min(std::min(max_emit, std::max(1, max_width)) - 1, engine_.max_draft_nodes());
  draft_.Clear();
  if (strategy_ != nullptr && max_nodes > 0) {
    ProposeContext ctx{&sampler_.params(), &rng_, &cost_};
    KILN_RETURN_IF_ERROR(strategy_->Propose(tokens, max_nodes, ctx, &draft_));
    KILN_RETURN_IF_ERROR(CheckDraft(draft_, max_nodes, engine_.model().hparams().n_vocab,
                                    std::string(strategy_->name())));
  }
  path_.assign(1, tokens.back());
  path_.insert(path_.end(), draft_.tokens.begin(), draft_.tokens.end());  // [1 + n_nodes]
  return absl::OkStatus();
}

// A chain (node i's parent is node i - 1) sits exactly where it would be committed, so it runs
// as plain causal tokens: the causal attention path, bitwise identical to decoding one token at
// a time. Other trees use the tree mask.
void SpeculativeDecoder::AddToBatch(int32_t root_index, int32_t root_token, ForwardBatch* batch) {
  const int32_t n_nodes = draft_.size();
  const int32_t base = static_cast<int32_t>(batch->tokens.size());  // the root's batch index
  bool is_chain = true;
  for (int32_t i = 0; i < n_nodes; ++i) is_chain = is_chain && draft_.parents[i] == i - 1;
  depth_.resize(n_nodes);
  if (strategy_ != nullptr && strategy_->wants_target_features()) {
    const std::span<const int32_t> layers = strategy_->target_feature_layers();
    if (layers.empty()) {
      batch->want_hidden = true;
    } else {
      batch->WantHiddenLayers(layers);
    }
  }
  batch->Add(root_token, seq_, root_index, /*want_logits=*/true);
  for (int32_t i = 0; i < n_nodes; ++i) {
    const int32_t parent = draft_.parents[i];
    depth_[i] = parent < 0 ? 1 : depth_[parent] + 1;
    batch->Add(draft_.tokens[i], seq_, root_index + depth_[i], /*want_logits=*/true,
               /*parent=*/is_chain ? -1 : base + (parent < 0 ? 0 : parent + 1),
               /*cache_index=*/root_index + 1 + i);
  }
}

absl::Status SpeculativeDecoder::Verify(const std::vector<int32_t>& tokens,
                                        const ForwardOutput& out, size_t row_begin) {
  const int64_t n_vocab = engine_.model().hparams().n_vocab;
  const int32_t n_nodes = draft_.size();
  if (out.logit_tokens.size() < row_begin + static_cast<size_t>(n_nodes + 1)) {
    return absl::InternalError("SpeculativeDecoder::Step: forward returned the wrong logit rows");
  }
  // Target distributions through the session's chain; history = tokens + the node's ancestors.
  p_.resize(n_nodes + 1);
  nodes_.resize(n_nodes);
  absl::Status st = sampler_.Apply(std::span(out.LogitsRow(row_begin), n_vocab), tokens, &p_[0]);
  for (int32_t i = 0; st.ok() && i < n_nodes; ++i) {
    history_.assign(tokens.begin(), tokens.end());
    const size_t base = history_.size();
    for (int32_t a = i; a >= 0; a = draft_.parents[a]) history_.push_back(draft_.tokens[a]);
    std::reverse(history_.begin() + static_cast<std::ptrdiff_t>(base), history_.end());
    st = sampler_.Apply(std::span(out.LogitsRow(row_begin + i + 1), n_vocab), history_, &p_[i + 1]);
    nodes_[i] = {draft_.parents[i], draft_.tokens[i], draft_.deterministic ? nullptr : &draft_.q[i],
                 &p_[i + 1]};
  }
  if (!st.ok()) return st;
  sample::DraftTree tree{&p_[0], nodes_};
  verified_lossy_ = false;
  if (sampler_.params().temperature <= 0.0f) return sample::VerifyTreeGreedy(tree, &verify_);
  sample::RngUniformSource uniforms(rng_);
  const sample::TypicalAcceptance* typical =
      strategy_ == nullptr ? nullptr : strategy_->typical_acceptance();
  if (typical != nullptr) {
    verified_lossy_ = true;
    return sample::VerifyTreeTypical(tree, *typical, uniforms, &verify_);
  }
  return sample::VerifyTree(tree, uniforms, &verify_);
}

absl::Status SpeculativeDecoder::Complete(std::vector<int32_t>* tokens, int32_t max_emit,
                                          int32_t root_index, KvCache& cache, Backend& backend,
                                          const ForwardOutput& pass_out, size_t row_begin,
                                          SpecStepResult* out) {
  const int32_t n_nodes = draft_.size();
  // Cut after the first end-of-generation token and at max_emit.
  const Tokenizer& tokenizer = engine_.model().tokenizer();
  int32_t keep = std::min<int32_t>(static_cast<int32_t>(verify_.tokens.size()), max_emit);
  bool end_of_generation = false;
  for (int32_t i = 0; i < keep; ++i) {
    if (tokenizer.IsEndOfGeneration(verify_.tokens[i])) {
      keep = i + 1;
      end_of_generation = true;
      break;
    }
  }
  const int32_t m = verify_.num_accepted();
  const int32_t m_commit = std::min(m, keep - 1);

  // Commit the accepted path.
  KILN_RETURN_IF_ERROR(Commit(cache, backend, root_index,
                              std::span(verify_.accepted_nodes).first(m_commit),
                              std::span(verify_.tokens).first(m_commit)));
  out->end_of_generation = end_of_generation;
  out->emitted.assign(verify_.tokens.begin(), verify_.tokens.begin() + keep);
  if (sampler_.params().n_logprobs > 0) {
    // Emitted token j was sampled from the row before it on the accepted path.
    out->logprobs.resize(keep);
    for (int32_t j = 0; j < keep; ++j) {
      const int32_t row = j == 0 ? 0 : verify_.accepted_nodes[j - 1] + 1;
      out->logprobs[j] = p_[row].top_logprobs;
    }
  }
  out->drafted = n_nodes;
  out->accepted = m;
  tokens->insert(tokens->end(), out->emitted.begin(), out->emitted.end());
  if (strategy_ != nullptr) {
    strategy_->Accepted(n_nodes, std::span(verify_.tokens).first(m));
  }
  if (strategy_ != nullptr && strategy_->wants_target_features()) {
    // The rows that produced the emitted tokens: the root's, then the accepted nodes' (as for
    // the log-probabilities above), i.e. the features of text positions [root_index, + keep):
    // the final hidden state, or the outputs of the strategy's layers back to back.
    const std::span<const int32_t> layers = strategy_->target_feature_layers();
    const int64_t d = layers.empty() ? pass_out.n_embd : pass_out.layer_width;
    const int64_t width = d * std::max<int64_t>(1, static_cast<int64_t>(layers.size()));
    bool complete = d > 0;
    features_.resize(static_cast<size_t>(keep * width));
    for (int32_t j = 0; complete && j < keep; ++j) {
      const int32_t row = row_begin + (j == 0 ? 0 : verify_.accepted_nodes[j - 1] + 1);
      for (size_t k = 0; complete && k < std::max<size_t>(1, layers.size()); ++k) {
        const float* src =
            layers.empty() ? pass_out.HiddenRow(row) : pass_out.LayerHiddenRow(row, layers[k]);
        complete = src != nullptr;
        if (complete) std::copy(src, src + d, features_.begin() + j * width + k * d);
      }
    }
    if (complete) {
      strategy_->ObserveTargetFeatures(root_index, static_cast<int32_t>(tokens->size()), features_,
                                       width);
    }
  }
  ++metrics_.steps;
  metrics_.drafted += n_nodes;
  metrics_.accepted += m;
  if (verified_lossy_) metrics_.accepted_lossy += m;
  metrics_.generated += keep;
  return absl::OkStatus();
}

absl::Status SpeculativeDecoder::Step(std::vector<int32_t>* tokens, int32_t max_emit,
                                      SpecStepResult* out) {
  ClearResult(out);
  // 1. Proposal.
  KILN_RETURN_IF_ERROR(Propose(*tokens, max_emit, max_emit));
  const int32_t n = static_cast<int32_t>(tokens->size());
  const int32_t root_index = n - 1;  // cache index and position of the root
  const int32_t n_nodes = draft_.size();

  // 2. One batch: root + tree nodes.
  batch_.Clear();
  AddToBatch(root_index, tokens->back(), &batch_);

  // 3. Target forward.
  using Clock = std::chrono::steady_clock;
  Clock::duration busy{};  // forward + sampling + verification, without waiting for the lock
  KILN_RETURN_IF_ERROR(engine_.Locked([&](KvCache& cache, ForwardPass& fwd) -> absl::Status {
    KILN_ASSIGN_OR_RETURN(int32_t len, cache.Length(seq_));
    KILN_ASSIGN_OR_RETURN(int32_t computed, cache.NumComputed(seq_));
    if (len != root_index || computed != root_index) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SpeculativeDecoder::Step: the sequence holds ", len, " tokens (", computed,
          " computed) but ", root_index, " computed tokens plus the root were expected"));
    }
    KILN_RETURN_IF_ERROR(cache.AppendSlots(seq_, path_));
    const Clock::time_point start = Clock::now();
    absl::Status st = fwd.Forward(batch_, cache, &out_);
    busy += Clock::now() - start;
    if (!st.ok()) cache.Truncate(seq_, root_index).IgnoreError();
    return st;
  }));
  auto undo = [&] {
    engine_.Locked([&](KvCache& cache, ForwardPass&) { return cache.Truncate(seq_, root_index); })
        .IgnoreError();
  };

  // 4. Verification.
  const Clock::time_point sampling_start = Clock::now();
  absl::Status st = Verify(*tokens, out_, 0);
  if (!st.ok()) {
    undo();
    return st;
  }
  busy += Clock::now() - sampling_start;
  cost_.Observe(1 + n_nodes, std::chrono::duration<double>(busy).count());

  // 5. Commit the accepted path.
  st = engine_.Locked([&](KvCache& cache, ForwardPass& pass) {
    return Complete(tokens, max_emit, root_index, cache, pass.backend(), out_, 0, out);
  });
  if (!st.ok()) {
    ClearResult(out);
    undo();
    return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SpeculativeDecoder::Plan(const std::vector<int32_t>& tokens,
                                                 int32_t max_emit, int32_t max_width,
                                                 KvCache& cache, ForwardBatch* batch) {
  KILN_RETURN_IF_ERROR(Propose(tokens, max_emit, max_width));
  const int32_t root_index = static_cast<int32_t>(tokens.size()) - 1;
  KILN_ASSIGN_OR_RETURN(int32_t len, cache.Length(seq_));
  KILN_ASSIGN_OR_RETURN(int32_t computed, cache.NumComputed(seq_));
  if (len != root_index || computed != root_index) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SpeculativeDecoder::Plan: the sequence holds ", len, " tokens (", computed,
        " computed) but ", root_index, " computed tokens plus the root were expected"));
  }
  KILN_RETURN_IF_ERROR(cache.AppendSlots(seq_, path_));
  AddToBatch(root_index, tokens.back(), batch);
  planned_root_ = root_index;
  return 1 + draft_.size();
}

absl::Status SpeculativeDecoder::Finish(std::vector<int32_t>* tokens, int32_t max_emit,
                                        KvCache& cache, Backend& backend, const ForwardOutput& out,
                                        size_t row_begin, double forward_seconds,
                                        SpecStepResult* result) {
  ClearResult(result);
  const int32_t root_index = planned_root_;
  planned_root_ = -1;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point sampling_start = Clock::now();
  absl::Status st = Verify(*tokens, out, row_begin);
  if (st.ok()) {
    cost_.Observe(
        1 + draft_.size(),
        forward_seconds + std::chrono::duration<double>(Clock::now() - sampling_start).count());
    st = Complete(tokens, max_emit, root_index, cache, backend, out, row_begin, result);
  }
  if (!st.ok()) {
    ClearResult(result);
    cache.Truncate(seq_, root_index).IgnoreError();
  }
  return st;
}

void SpeculativeDecoder::Undo(KvCache& cache) {
  if (planned_root_ >= 0) cache.Truncate(seq_, planned_root_).IgnoreError();
  planned_root_ = -1;
}

absl::Status SpeculativeDecoder::Commit(KvCache& cache, Backend& backend, int32_t root_index,
                                        std::span<const int32_t> accepted_nodes,
                                        std::span<const int32_t> accepted_tokens) {
  const int32_t m = static_cast<int32_t>(accepted_nodes.size());
  for (int32_t j = 0; j < m; ++j) {
    // Node a_j sits at cache index root + 1 + a_j; its place in the text is root + 1 + j.
    // a_j >= j and the a_j increase, so a later source is never overwritten before it is read.
    const int32_t from = root_index + 1 + accepted_nodes[j];
    const int32_t to = root_index + 1 + j;
    if (from == to) continue;
    KILN_ASSIGN_OR_RETURN(KvSlot to_slot, cache.PrepareOverwrite(seq_, to, accepted_tokens[j]));
    KILN_ASSIGN_OR_RETURN(KvSlot from_slot, cache.SlotOf(seq_, from));
    backend.CopyKvSlot(cache, from_slot, to_slot);
  }
  KILN_RETURN_IF_ERROR(cache.Truncate(seq_, root_index + 1 + m));
  return cache.MarkComputed(seq_, root_index + 1 + m);
}

}  // namespace kiln::spec
