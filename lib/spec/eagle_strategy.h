// EAGLE draft heads (EAGLE-1 head, EAGLE-2 dynamic trees): a one-layer transformer that drafts
// from the target's features. Entry i of the head's sequence reads [token embedding of token
// i + 1; target feature f_i] (f_i: the target's feature at text position i, which predicted
// token i + 1), fc maps it to n_embd, one decoder layer (its own norms, attention over the
// head's own K/V) turns it into g_i, the head's guess of f_{i + 1}; the target's LM head turns
// g_i into the draft distribution of token i + 2.
//
// Features: the target's final hidden state after the output norm, exactly what the LM head
// multiplies (ForwardBatch::want_hidden). That is also what the reference EAGLE code feeds its
// head (the output of the base model's decoder stack, which ends with the final norm), and the
// head's output g goes to the LM head with no norm of its own, so g lives in the same space as
// the features and is fed back as the next depth's feature.
//
// Per step (Propose):
//   1. the entries whose target features arrived since the last step (the accepted path of the
//      last step: ObserveTargetFeatures) run causally through the head and are committed to the
//      head's cache (its own paged KvCache); the last one's output g_root gives the draft
//      distribution of the root's children (its top_k best);
//   2. EAGLE-2 expansion, depth by depth: the top_k frontier nodes by cumulative
//      log-probability run through the head in one batch (a tree mask over the committed
//      entries plus each node's ancestors), and each gets its top_k children;
//   3. every node made is reranked by cumulative log-probability and the best `budget` kept
//      (a child's log-probability never exceeds its parent's, so the kept set is a tree). The
//      budget is EagleParams::tree_tokens when set, else the n maximising
//      (1 + sum of the n best path probabilities) / c(n + 1), c the decoder's measured relative
//      pass cost (draft_policy.h): the path probabilities estimate the accepted length;
//   4. with EagleParams::merge_ngram, the n-gram strategy's chain for the context is merged in
//      (the nodes it shares with the tree are reused, the rest hang under the last shared one);
//   5. the head's cache is truncated back to the committed entries: the drafted entries never
//      stay; the entries of the accepted path are recomputed from the target's true features at
//      the next step. So the head's cache always holds exactly the accepted text.
// The tree's shape by default (EagleParams 0) follows two measured costs, c(w) above and s, one
// head pass (fc, the layer and the draft LM head over its rows; the strategy's moving average of
// its own passes) divided by the decoder's one-token step time:
//   - depth: before each expansion, with n and S the budget and expected accepted tokens the
//     tree has so far, P the path probability of the nodes about to be expanded (their children
//     can add at most P: a child is never likelier than its parent) and D = s times the passes
//     already made this step, the head expands iff
//        (1 + S + P) / (c(n + 2) + D + s)  >  (1 + S) / (c(n + 1) + D),
//     i.e. iff the next depth could pay for its pass even at its best (all of P, one more node),
//     up to kEagleAutoMaxDepth; a dear head pass or a flat tree stops early;
//   - top_k: the budget the last step kept, in [kEagleAutoMinTopK, kEagleAutoMaxTopK]: no more
//   nodes are
//     expanded per depth, nor children made per node, than the pass cost lets through verified.
// With the pass cost pinned (or not measured) s is kEaglePriorDraftStepCost, so the tree is
// deterministic there (draft_policy.h: sampled text for a fixed seed then does not depend on
// timing).
//
// Draft vocabulary: a head file may carry a reduced vocabulary (draft_head.h: eagle.vocab.ids
// and eagle.lm_head.weight, the target's rows for the K most frequent training tokens); the head
// then scores only those tokens, and a node costs K / n_vocab of the target's LM head. Without
// it the target's full LM head drafts.
// The head's context starts at the first position the decoder gave it a feature for (the
// prompt's last one): prompt positions have no features (prefill does not compute them).
//
// Exactness: the tree's tokens are deterministic (top-k of the head's logits, ties to the lower
// token id), so the decoder's tree verification is exact under any sampler chain: greedy output
// equals plain decoding, sampled output is distributed as plain sampling (recursive rejection
// with one-hot drafts), unless the user opts into Medusa's lossy typical acceptance
// (EagleParams::typical).
//
// EAGLE-3 heads (general.architecture "eagle3") differ in three ways, as in the EAGLE-3 paper:
// the target feature f_i is fuse [h_a; h_b; h_c], the outputs of a low, a middle and a high
// target layer (Strategy::target_feature_layers: the decoder captures them, ForwardBatch::
// hidden_layers); the head reads every feature through a norm of its own (RMSNorm(f) w), so the
// target's fused features and its own outputs g, which deeper nodes read, need not share a
// scale; and it drafts with its own LM head over its reduced vocabulary from RMSNorm(g) w_out.
// It is trained with training-time test (tools/train/train_eagle3.py): unrolled on its own
// outputs, as it runs in a tree.
//
// Head file: GGUF, general.architecture "eagle" or "eagle3", docs/speculative.md lists the keys
// and tensors.
//
// Thread-safety: as every strategy (strategy.h); clones share the read-only head.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/engine/draft_policy.h"
#include "lib/engine/strategy.h"
#include "lib/gguf/gguf.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/decoder.h"
#include "lib/model/model.h"
#include "lib/spec/draft_head.h"
#include "lib/spec/ngram_strategy.h"

namespace kiln::spec {

struct EagleParams {
  // Children per expanded node and frontier nodes expanded per depth (1..64); 0 (default):
  // chosen per step, the tree size the pass cost let through at the last step (see above).
  int32_t top_k = 0;
  // Deepest draft node (1: only the root's children; 1..16); 0 (default): the tree grows while
  // another draft step can pay for itself, at most kEagleAutoMaxDepth deep (see above).
  int32_t max_depth = 0;
  // Nodes per tree: > 0 always this many (at most the decoder's max_draft); 0: chosen per step
  // from the path probabilities and the measured pass cost (see the header comment).
  int32_t tree_tokens = 0;
  int32_t max_tree_tokens = 64;  // upper bound of the chosen budget
  int32_t n_ctx = 4096;          // head cache capacity in entries (the head resets beyond it)
  // Merge the n-gram strategy's continuation of the context (prompt lookup with its default
  // NgramParams and cost-aware length, ngram_strategy.h) into every tree, within max_draft: the
  // chain follows the head's nodes that draft the same tokens and adds the rest, so text that
  // copies the context (quoting, editing) gets the long runs a head rarely drafts. The chain's
  // nodes come on top of tree_tokens.
  bool merge_ngram = true;
  int n_threads = 1;  // threads of the head's matmuls; <= 0: physical cores
  // Set: Medusa's typical acceptance (rejection_sampler.h) instead of exact verification when
  // sampling, LOSSY (SpecMetrics::accepted_lossy counts what it accepted); unset (default): exact.
  std::optional<sample::TypicalAcceptance> typical;
};

// Bounds of the automatic top_k and depth (EagleParams 0).
inline constexpr int32_t kEagleAutoMaxTopK = 8;
inline constexpr int32_t kEagleAutoMinTopK = 2;
inline constexpr int32_t kEagleAutoMaxDepth = 8;
// The cost of one head pass in one-token target passes until one was measured (and whenever the
// pass cost is pinned, so that a pinned step is deterministic).
inline constexpr double kEaglePriorDraftStepCost = 0.25;

// A loaded head file: views into the mapped file (kept open) and the shapes it was checked
// against.
struct EagleHead {
  std::unique_ptr<gguf::GgufFile> file;
  TargetFingerprint target;
  int64_t n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  float rms_eps = 1e-5f;
  // Matrices (any type the backend multiplies) and f32 vectors.
  WeightView fc, fc_bias, attn_norm, wq, wk, wv, wo, ffn_norm, ffn_gate, ffn_up, ffn_down;
  // The file's reduced vocabulary (eagle.vocab.ids, eagle.lm_head.weight; draft_head.h), null
  // when it has none: the head then drafts with the target's full LM head.
  std::shared_ptr<const ReducedLmHead> draft_vocab;
  // EAGLE-3 heads only (general.architecture "eagle3"): the target layers whose outputs the
  // head fuses (ascending; empty for EAGLE-1), fuse [layers x n_embd -> n_embd], the norm of the
  // feature the head reads and the norm of its output before its own LM head (draft_vocab,
  // which an EAGLE-3 head must have).
  std::vector<int32_t> fused_layers;
  WeightView fuse, feature_norm, output_norm;

  bool eagle3() const { return !fused_layers.empty(); }
  // Floats per target feature row: n_embd, or n_embd per fused layer.
  int64_t feature_width() const {
    return n_embd * (eagle3() ? static_cast<int64_t>(fused_layers.size()) : 1);
  }
};

// Loads and checks a head file against `target`: InvalidArgument for a head made for another
// model (naming each field that differs) or a file that is not an eagle head; DataLoss naming the
// key or tensor for a malformed file (missing, wrong shape or type, not finite).
absl::StatusOr<std::unique_ptr<EagleHead>> LoadEagleHead(const std::string& path,
                                                         const Model& target);

// How WriteDerivedEagleHead fills a head (tests, tools/kiln-mkeagle):
enum class EagleHeadInit {
  // fc = [0 | I], the attention and feed-forward outputs zero: g = the feature it reads, so the
  // root's children are the target's own top-k at the root's feature (acceptance is high when the
  // head is given the right feature; used to exercise accept and reject paths).
  kIdentity,
  // fc = [I | I] (embedding + feature), the decoder layer copied from the target's last layer
  // (its tensor types kept): a head whose drafts are related to the target's.
  kLastLayer,
  // N(0, 1 / n_in) f32 matrices, unit norms, zero bias: random drafts.
  kRandom,
};
// Writes a head for `target` (f32 fc and vectors); with `draft_vocab` (target ids, strictly
// ascending) a reduced vocabulary too, the target's own LM-head rows for those ids. With
// `fused_layers` an EAGLE-3 head (needs draft_vocab) fusing those target layers: fuse picks the
// last of them (random for kRandom), the feature norm is ones and the output norm the target's,
// so that an identity head drafts what the target's LM head makes of that layer's output.
// Errors: the target's last layer lacks a tensor kLastLayer copies (fused projections), an id
// outside the vocabulary, fused layers without a vocabulary, the writer's errors.
absl::Status WriteDerivedEagleHead(const Model& target, EagleHeadInit init, uint64_t seed,
                                   const std::string& path,
                                   std::span<const int32_t> draft_vocab = {},
                                   std::span<const int32_t> fused_layers = {});

class EagleStrategy final : public Strategy {
 public:
  // `target` is borrowed (its embeddings and LM head are used; it must outlive the strategy and
  // its clones).
  static absl::StatusOr<std::unique_ptr<EagleStrategy>> Load(const std::string& path,
                                                             const Model& target,
                                                             const EagleParams& params);
  static absl::StatusOr<std::unique_ptr<EagleStrategy>> Create(
      std::shared_ptr<const EagleHead> head, const Model& target, const EagleParams& params);

  std::string_view name() const override { return "eagle"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  // Learns how the head's path probabilities compare with what verification accepts
  // (Calibration).
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override;
  void Reset() override;
  // The clone shares the head and starts without head context (its first step after a fork is
  // plain decoding, which gives it the feature to continue from).
  absl::StatusOr<std::unique_ptr<Strategy>> Clone() const override;
  bool wants_target_features() const override { return true; }
  // EAGLE-3 heads: the outputs of the layers they fuse; EAGLE-1: the final hidden state.
  std::span<const int32_t> target_feature_layers() const override { return head_->fused_layers; }
  const sample::TypicalAcceptance* typical_acceptance() const override {
    return params_.typical ? &*params_.typical : nullptr;
  }
  void ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                             std::span<const float> features, int64_t n_embd) override;

  const EagleHead& head() const { return *head_; }
  // Committed head entries (each one text position from base_position()) and the text position
  // of the first; -1 when the head has no context.
  int32_t committed_entries() const { return committed_; }
  int32_t base_position() const { return base_; }
  // Length of the head's cache sequence (equals committed_entries() between steps).
  int32_t head_cache_length() const;
  // The draft logits of the root's children at the last proposal: [draft vocabulary] (the
  // head's reduced one when it has one, else the target's) (tests).
  const std::vector<float>& last_root_logits() const { return root_logits_; }
  // Nodes made (expanded or not) at the last proposal, before the budget cut, and its depth.
  int32_t last_candidates() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t last_depth() const { return last_depth_; }
  // The top_k the next proposal uses.
  int32_t next_top_k() const;
  // One head pass in one-token target passes: measured (moving average), or the prior.
  double DraftStepCost(const PassCostModel* cost) const;
  // Seconds of one head pass (moving average; 0 before the first).
  double head_pass_seconds() const { return head_pass_seconds_; }
  // What verification accepted per token the head expected (moving sums of accepted drafted
  // tokens over the sum of the verified nodes' path probabilities; 1 before any step, within
  // [kMinCalibration, kMaxCalibration]; steps without the head's drafts move it back toward 1).
  // The budget and depth rules scale the head's probabilities by it: a head that is surer than
  // its acceptance shows drafts less. (Accepted n-gram candidates merged into the tree count
  // as the head's.)
  double Calibration() const;
  static constexpr double kMinCalibration = 0.05, kMaxCalibration = 2.0;

 private:
  EagleStrategy(std::shared_ptr<const EagleHead> head, const Model& target,
                const EagleParams& params, std::unique_ptr<KvCache> cache);

  // One row of a head pass.
  struct Row {
    int32_t token;           // the entry's token (i + 1)
    const float* feature;    // [n_embd] the entry's feature
    int32_t pos;             // RoPE position
    int32_t cache_index;     // slot in the head's sequence
    int32_t tree_node = -1;  // -1: causal; else index into nodes_ (its ancestors are visible)
  };
  // Runs rows through the head: g_ [rows, n_embd] and, for the rows from logits_from on, logits_
  // [rows - logits_from, n_vocab]. The rows' slots must have been appended.
  absl::Status RunHead(std::span<const Row> rows, int32_t logits_from);
  absl::Status ProposeTree(std::span<const int32_t> context, int32_t max_draft,
                           const ProposeContext& ctx, DraftTree* out);
  // Forgets the head's context (the n-gram strategy keeps what it learned).
  void ResetHead();
  // The LM head drafts are scored with: the head's reduced one, else the target's.
  const WeightView& DraftLmHead() const;
  // *order = the indices of nodes_, most likely first (ties: creation order).
  void SortByLogp(std::vector<int32_t>* order) const;
  // c(width) from the decoder's measurements, or the prior slope without them.
  static double RelativeCost(const PassCostModel* cost, int32_t width);
  // The number of nodes to verify among `order` (at most cap): tree_tokens when fixed, else the
  // n maximising (1 + expected(n)) / c(n + 1), 0 unless it beats plain decoding by 2%;
  // *expected = the sum of the kept nodes' path probabilities.
  int32_t ChooseBudget(std::span<const int32_t> order, int32_t cap, const PassCostModel* cost,
                       double* expected) const;

  struct Node {
    int32_t token;
    int32_t parent;  // index into nodes_, -1: a child of the root
    int32_t depth;
    float logp;           // cumulative log-probability under the head
    int32_t cache_index;  // head slot once expanded, else -1
    int32_t feature_row;  // row of the feature it reads (-1: the root's g) in features_
  };

  std::shared_ptr<const EagleHead> head_;
  const Model* target_;
  EagleParams params_;
  std::unique_ptr<Backend> backend_;
  DecoderLayer layer_;  // the head's decoder layer (views into head_)
  DecoderBlock block_;  // its arithmetic on backend_
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<NgramStrategy> ngram_;  // null unless params_.merge_ngram
  SeqId seq_ = -1;
  int32_t base_ = -1;                      // text position of head entry 0
  int32_t committed_ = 0;                  // committed entries in the head's cache
  std::vector<int32_t> committed_tokens_;  // [committed_] token of each entry
  std::vector<float> pending_;             // [rows, feature_width] features not yet run
  std::vector<float> fused_;               // [rows, n_embd] EAGLE-3: pending_ fused
  std::vector<Node> nodes_;
  std::vector<float> root_logits_;  // [n_vocab] draft logits of the root's children
  std::vector<float> root_g_;       // [n_embd] the head's output at the root
  int32_t root_context_len_ = -1;   // the context length the two above belong to
  // Scratch.
  std::vector<float> features_;  // [expanded nodes + 1, n_embd] g of the root, then nodes
  std::vector<float> in2_;       // [rows, 2 n_embd] [embedding; feature]
  std::vector<float> g_;         // [rows, n_embd] fc's output, then the block's: g
  std::vector<float> logits_;    // [rows - logits_from, n_vocab]
  std::vector<float> normed_;    // [rows - logits_from, n_embd] EAGLE-3: g through output_norm
  std::vector<int32_t> ids_, positions_, n_visible_, extra_indptr_, extra_positions_, seq_index_;
  int32_t last_depth_ = 0;
  int32_t last_budget_ = kEagleAutoMaxTopK;  // nodes kept at the last proposal (automatic top_k)
  double head_pass_seconds_ = 0.0;           // moving average of one head pass (0: none timed yet)
  // Calibration(): moving sums of accepted drafted tokens and of the expected ones (the head's
  // path probabilities of the verified nodes), and the last proposal's expected count.
  double accepted_sum_ = 0.0, expected_sum_ = 0.0, last_expected_ = 0.0;
  std::vector<KvSlot> slots_;
  KvTables tables_;
};

}  // namespace kiln::spec
