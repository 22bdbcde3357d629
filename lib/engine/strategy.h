// The speculative-decoding strategy interface: something that proposes draft tokens (a tree) for
// the target model to verify in one forward pass (speculative_decoder.h). Strategies plug in
// explicitly through this interface: the n-gram prompt lookup (ngram_strategy.h) and the draft
// model (draft_model_strategy.h) today, Medusa / EAGLE heads later.
//
// Exactness contract (see lib/sample/rejection_sampler.h for the proof and its assumptions):
//   - deterministic drafts (DraftTree::deterministic, q empty) are always exact, whatever
//     produced them: the rejection sampler treats q as one-hot at the token;
//   - sampled drafts must give, for every node, the distribution q the token was drawn from,
//     conditioned on its prefix (and on earlier siblings), computed through the same sampler
//     chain as the target (ProposeContext::sampler_params), so p and q are comparable.
//
// Thread-safety: a strategy belongs to one decoder (one session) at a time; none of its methods
// may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/common/strings.h"
#include "lib/engine/draft_policy.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rejection_sampler.h"
#include "lib/sample/rng.h"
#include "lib/sample/sampler.h"

namespace kiln::spec {

// A proposed draft tree. Node i hangs off node parents[i] (< i: topological order) or, when
// parents[i] == -1, off the root (the last token of the context, not yet verified by the target).
// A chain is parents = {-1, 0, 1, 2, ...}.
struct DraftTree {
  std::vector<int32_t> tokens;   // [n_nodes]
  std::vector<int32_t> parents;  // [n_nodes]
  // true: the tokens are deterministic (n-gram lookup, greedy draft); `q` is empty.
  // false: q[i] is the distribution tokens[i] was drawn from (after the sampler chain).
  bool deterministic = true;
  std::vector<sample::Distribution> q;  // [n_nodes] or empty

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  void Clear() {
    tokens.clear();
    parents.clear();
    q.clear();
    deterministic = true;
  }
  // Appends a node; returns its index.
  int32_t Add(int32_t token, int32_t parent) {
    tokens.push_back(token);
    parents.push_back(parent);
    return size() - 1;
  }
  // Merges a chain continuing the root (deterministic trees): follows the nodes that already
  // draft its tokens from the root down and appends the rest under the last one it shared.
  void MergeChain(std::span<const int32_t> chain) {
    int32_t parent = -1;
    for (int32_t token : chain) {
      int32_t same = -1;
      for (int32_t i = 0; i < size() && same < 0; ++i) {
        if (parents[i] == parent && tokens[i] == token) same = i;
      }
      parent = same >= 0 ? same : Add(token, parent);
    }
  }
};

// What a strategy may use while proposing.
struct ProposeContext {
  // The session's sampler chain parameters (temperature <= 0: greedy, draft deterministically).
  const sample::SamplerParams* sampler_params = nullptr;
  // The session's random generator, for strategies that sample their drafts.
  sample::Rng* rng = nullptr;
  // The decoder's measured cost of target passes by width (draft_policy.h), for strategies that
  // choose their draft length by expected tokens per unit cost. nullptr: not measured (the
  // strategy uses PassCostModel's prior).
  const PassCostModel* cost = nullptr;
};

// Cumulative counters of a decoder (per session).
struct SpecMetrics {
  int64_t steps = 0;      // target forward passes made by Step (one per step)
  int64_t drafted = 0;    // draft nodes proposed and verified
  int64_t accepted = 0;   // draft nodes accepted (before any end-of-generation / max cut)
  int64_t generated = 0;  // tokens emitted (accepted + recovered/bonus, after the cut)
  // Of `accepted`: those the lossy typical rule accepted (Strategy::typical_acceptance); 0 unless
  // a user chose it, so nonzero means the output was not distributed as plain sampling.
  int64_t accepted_lossy = 0;

  // Accepted draft tokens per step (0 when no step ran).
  double MeanAcceptedPerStep() const {
    return steps == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(steps);
  }
  // Target passes per generated token: 1 for plain decoding, lower is better.
  double TargetPassesPerToken() const {
    return generated == 0 ? 0.0 : static_cast<double>(steps) / static_cast<double>(generated);
  }
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // A short name for logs and metrics ("ngram", "draft").
  virtual std::string_view name() const = 0;

  // Proposes at most `max_draft` nodes (>= 0) continuing `context` (every token of the sequence;
  // its last token is the root, the target has not computed it yet). Fills *out (cleared first);
  // an empty tree means "no speculation this step" (the step is plain decoding). Errors abort
  // the step and reach the caller.
  virtual absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                               const ProposeContext& ctx, DraftTree* out) = 0;

  // After verification of the last proposal: `accepted` are the tokens of the accepted path
  // (accepted.size() of the proposed nodes), `drafted` how many were proposed. Lets the strategy
  // adapt and roll back its own state.
  virtual void Accepted(int32_t drafted, std::span<const int32_t> accepted) = 0;

  // Forgets all state (a new conversation, a rewind the strategy cannot follow).
  virtual void Reset() = 0;

  // Strategies that draft from the target's features (Medusa and EAGLE heads) return true: the
  // decoder then asks its passes for the final hidden states (ForwardBatch::want_hidden) and
  // hands those of the accepted path to ObserveTargetFeatures after every step.
  virtual bool wants_target_features() const { return false; }
  // With wants_target_features: empty (default) for the final hidden state; otherwise the
  // target layers (ascending) whose outputs (the residual stream after each) make a feature,
  // back to back: ObserveTargetFeatures then gets rows of layers.size() x n_embd floats.
  virtual std::span<const int32_t> target_feature_layers() const { return {}; }

  // The lossy typical-acceptance rule (rejection_sampler.h) when the user chose it for this
  // strategy; nullptr (the default): exact verification. Used only when sampling (temperature >
  // 0): greedy verification is already what typical acceptance tends to at temperature 0.
  virtual const sample::TypicalAcceptance* typical_acceptance() const { return nullptr; }

  // After a step (only when wants_target_features): `features` [n, n_embd] (row-major) are the
  // target's final hidden states (after the output norm: what the LM head multiplies; or the
  // target_feature_layers' outputs, n_embd then their count times the model's) of the
  // tokens at text positions [first_position, first_position + n): the old root and the accepted
  // drafts, each the row whose logits gave the token after it. `context_len` is the sequence
  // length after the step, so the last row (position context_len - 2) is the feature that
  // predicted the new root. Called after Accepted.
  virtual void ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                                     std::span<const float> features, int64_t n_embd) {}

  // A strategy in the same state (adaptive estimates, and whatever it holds about the context it
  // last saw) that serves another session: Session::Fork gives the fork a clone so both continue
  // speculating. The clone is independent of this strategy (it may be used on another thread at
  // the same time). Default: Unimplemented naming the strategy.
  virtual absl::StatusOr<std::unique_ptr<Strategy>> Clone() const {
    return absl::UnimplementedError(
        kiln::StrCat("strategy ", name(), " cannot be cloned (Session::Fork needs Clone)"));
  }

  // The strategy's parameters and adaptive state as bytes, for Session::SaveState (the format is
  // the strategy's own; the n-gram strategy writes a NgramStrategyState message of
  // lib/session/session_state.proto). Default: Unimplemented naming the strategy (its state
  // cannot be saved; the session is saved without it).
  virtual absl::StatusOr<std::string> SaveState() const {
    return absl::UnimplementedError(kiln::StrCat("the speculative strategy ", name(),
                                                 " cannot save its state (Strategy::SaveState)"));
  }

  // Replaces this strategy's adaptive state with one SaveState wrote, so that it continues
  // exactly as the saved strategy would have. All or nothing: on error nothing changed.
  // Errors: InvalidArgument (saved by a strategy with other parameters: the message names
  // them), DataLoss (malformed bytes), Unimplemented (the default: no saved state).
  virtual absl::Status LoadState(std::string_view state) {
    return absl::UnimplementedError(kiln::StrCat(
        "the speculative strategy ", name(), " cannot load a saved state (Strategy::LoadState)"));
  }
};

}  // namespace kiln::spec
