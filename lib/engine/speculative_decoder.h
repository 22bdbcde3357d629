// SpeculativeDecoder: one speculative step on a sequence of the engine's cache.
//
// State it expects (the session's "one pending token" state): the sequence holds tokens
// [0, n - 1) computed in the cache (Length == NumComputed == n - 1) and tokens[n - 1], the root,
// is sampled but not computed. One Step:
//   1. asks the strategy for a draft tree continuing `tokens` (at most max_emit - 1 nodes);
//   2. builds one ForwardBatch: the root (causal, cache index n - 1, position n - 1), then every
//      node i with parent = its parent's batch index (the root for top-level nodes), position =
//      root position + depth, cache index n + i (slots appended after the root). A chain (every
//      node the child of the previous one) is already where it would be committed, so it runs as
//      causal tokens instead of tree nodes: the causal attention kernel path, bitwise identical
//      to one-at-a-time decoding (the tree-mask path is exact math but, in the current CPU
//      attention kernel, not bitwise equal to the causal path; see docs/speculative.md). Causal
//      draft tokens are marked computed by the forward pass; rejected ones are truncated away
//      (full blocks of them may stay in the prefix cache: valid K/V for those token ids);
//   3. runs the target forward (all rows want logits), turns every row into a Distribution
//      through the session's sampler chain (history = tokens + the node's ancestors), verifies
//      with the rejection sampler (VerifyTreeGreedy when temperature <= 0, else VerifyTree);
//   4. commits the accepted path: the K/V rows of accepted node a_j are copied into cache index
//      n - 1 + j (only when a_j sits elsewhere: a fully accepted chain copies nothing), the
//      sequence is truncated to n + m (m accepted) and marked computed. Work is proportional to
//      the accepted path (m rows per layer and KV head) plus releasing the tree's blocks;
//   5. appends the accepted tokens and the recovered/bonus token to `tokens` (that last token is
//      the new root) and tells the strategy what was accepted.
// Cost: every step's wall time from the batch to the verification (target forward, per-row
// sampler chain, verification; not the proposal) is recorded in cost_model() by width (root +
// drafts), and the strategy sees it in ProposeContext::cost to choose its draft length
// (draft_policy.h).
// Log-probabilities: when the sampler asks for n_logprobs, every emitted token gets the top
// log-probabilities of the target row it was sampled from (accepted: the row before it on the
// accepted path; recovered/bonus: the row of the last accepted node or the root), which are
// bitwise those plain decoding reports for the same token (batch-invariant logits, same chain).
// Emitted tokens are cut after the first end-of-generation token and at max_emit; K/V of tokens
// cut off are dropped so the state above holds again.
//
// Exactness: with temperature <= 0 the output is identical, token for token, to plain greedy
// decoding (the engine's logits are batch invariant, so a tree node's logits equal those of the
// same token decoded alone). With sampling, the tokens are distributed exactly as plain sampling
// with the same chain (rejection_sampler.h), though the random stream is consumed differently,
// so a seed gives different (equally distributed) text than plain decoding.
//
// Batched: the engine's scheduler (scheduler.h) runs the same step in two halves around one
// forward pass shared with other sequences: Plan (proposal, the root and nodes appended to the
// shared batch, their slots) and Finish (verification and commit with this step's logits rows).
// The logits are batch invariant, so a batched step gives the bits of Step.
//
// Thread-safety: one decoder per session; Step takes the engine mutex around cache and forward
// calls, so decoders of different sessions may run concurrently. Plan, Finish and Undo are
// called with the engine mutex held (by the scheduler).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/common/status.h"
#include "lib/engine/engine.h"
#include "lib/engine/strategy.h"
#include "lib/model/forward_batch.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rejection_sampler.h"
#include "lib/sample/rng.h"
#include "lib/sample/sampler.h"

namespace kiln::spec {

struct SpecStepResult {
  std::vector<int32_t> emitted;  // tokens appended to `tokens` this step
  // [emitted.size()] the top log-probabilities of each emitted token's distribution (as
  // Distribution::top_logprobs); empty when the sampler's n_logprobs is 0.
  std::vector<std::vector<sample::TokenLogprob>> logprobs;
  int32_t drafted = 0;
  int32_t accepted = 0;
  bool end_of_generation = false;  // emitted ends with an end-of-generation token
};

class SpeculativeDecoder {
 public:
  // `sampler` and `rng` are the session's (borrowed; must outlive the decoder); `seq` a sequence
  // of engine's cache. `strategy` may be nullptr (every step is plain decoding).
  SpeculativeDecoder(Engine& engine, SeqId seq, sample::Sampler& sampler, sample::Rng& rng,
                     Strategy* strategy);

  void set_strategy(Strategy* strategy) { strategy_ = strategy; }
  Strategy* strategy() const { return strategy_; }

  // One step (see the header comment). Preconditions: tokens non-empty, the cache holds exactly
  // tokens.size() - 1 computed tokens of `seq`; max_emit >= 1. Errors: FailedPrecondition (state
  // mismatch), ResourceExhausted (cache full: nothing changed), strategy and sampler errors
  // (nothing changed in the sequence).
  absl::Status Step(std::vector<int32_t>* tokens, int32_t max_emit, SpecStepResult* out);

  // The first half of a batched step (engine mutex held): proposes at most
  // min(max_emit, max_width) - 1 draft nodes, appends the root and the nodes to the end of
  // `batch` (all wanting logits) and makes their slots in `cache`. Returns the number of batch
  // tokens added (1 + nodes). Errors: as Step (ResourceExhausted: nothing changed).
  absl::StatusOr<int32_t> Plan(const std::vector<int32_t>& tokens, int32_t max_emit,
                               int32_t max_width, KvCache& cache, ForwardBatch* batch);
  // The second half (engine mutex held): the planned tokens' logits are rows
  // [row_begin, row_begin + 1 + nodes) of `out`; verifies, commits and appends as Step does.
  // forward_seconds is the shared pass's time (for the cost model). On an error the sequence is
  // back at the root (nothing changed).
  absl::Status Finish(std::vector<int32_t>* tokens, int32_t max_emit, KvCache& cache,
                      Backend& backend, const ForwardOutput& out, size_t row_begin,
                      double forward_seconds, SpecStepResult* result);
  // Drops the slots of a planned step whose forward failed (engine mutex held).
  void Undo(KvCache& cache);

  const SpecMetrics& metrics() const { return metrics_; }

  // The measured cost of steps by width (see the header comment). Mutable so that callers can
  // pin it (reproducible sampled text) or carry it over to a fork's decoder.
  PassCostModel& cost_model() { return cost_; }
  const PassCostModel& cost_model() const { return cost_; }

 private:
  // Proposal and the batch of one step (root + nodes, appended to *batch) for tokens.
  absl::Status Propose(const std::vector<int32_t>& tokens, int32_t max_emit, int32_t max_width);
  void AddToBatch(int32_t root_index, int32_t root_token, ForwardBatch* batch);
  // Target distributions of rows [row_begin, ...) and the verification (the random stream is
  // the session's). On error nothing is committed.
  absl::Status Verify(const std::vector<int32_t>& tokens, const ForwardOutput& out,
                      size_t row_begin);
  // Commit and bookkeeping after Verify; cache access through `cache` (mutex held).
  // pass_out rows [row_begin, ...) are this step's (their features go to the strategy).
  absl::Status Complete(std::vector<int32_t>* tokens, int32_t max_emit, int32_t root_index,
                        KvCache& cache, Backend& backend, const ForwardOutput& pass_out,
                        size_t row_begin, SpecStepResult* out);
  absl::Status Commit(KvCache& cache, Backend& backend, int32_t root_index,
                      std::span<const int32_t> accepted_nodes,
                      std::span<const int32_t> accepted_tokens);

  Engine& engine_;
  SeqId seq_;
  sample::Sampler& sampler_;
  sample::Rng& rng_;
  Strategy* strategy_;
  SpecMetrics metrics_;
  PassCostModel cost_;

  DraftTree draft_;
  int32_t planned_root_ = -1;  // root index of the step between Plan and Finish/Undo
  ForwardBatch batch_;
  ForwardOutput out_;
  std::vector<int32_t> depth_;            // [n_nodes]
  std::vector<sample::Distribution> p_;   // [1 + n_nodes] target distributions
  std::vector<sample::DraftNode> nodes_;  // [n_nodes]
  std::vector<int32_t> history_;          // scratch: tokens + a node's ancestors
  std::vector<int32_t> path_;             // scratch
  std::vector<float> features_;           // [kept tokens, n_embd] for ObserveTargetFeatures
  sample::VerifyResult verify_;
  bool verified_lossy_ = false;  // verify_ came from the typical (lossy) rule
};

}  // namespace kiln::spec
