// The rejection sampler for speculative decoding: given draft tokens (a chain or a tree) with the
// draft distributions q they were drawn from, and the target distributions p at every position,
// decide which draft tokens to keep so that the emitted tokens are distributed exactly as if the
// target had sampled them one by one (Leviathan et al. 2023; Chen et al. 2023; for trees,
// SpecInfer's multi-step speculative sampling, Miao et al. 2024, and the recursive rejection
// sampling of Jeon et al. 2024).
//
// Terms (used throughout kiln):
//   accepted  — draft tokens kept: a root-to-node path of the draft tree.
//   recovered — the token emitted after the first rejection: at the node where every child was
//               rejected, a draw from the final residual distribution (below).
//   bonus     — the extra token emitted when the accepted path ends at a node with no children
//               (every draft token on the path accepted): a draw from that node's target p.
//   residual  — after rejecting a draft token x drawn from q, the target is replaced by
//               norm(max(0, p - q)); for a deterministic draft (q one-hot at x) that is p with x
//               removed and renormalized.
// Each call emits accepted tokens followed by exactly one recovered-or-bonus token.
//
// p and q are Distributions after the *same* sampler chain (sampler.h: penalties, top-k, top-p,
// temperature ... applied to target and draft logits alike); the output is then distributed as
// plain sampling with that chain. All distributions must share one vocab_size.
//
// Tree verification (the algorithm). At the current node (start: the root, i.e. the last committed
// token) with target p and children c_1..c_m in node-index order:
//   for j = 1..m: accept c_j with probability min(1, p(x_j) / q_j(x_j));
//                 if accepted, descend into c_j (its p becomes the target) and repeat;
//                 else p <- norm(max(0, p - q_j)).
//   if all m were rejected: emit the recovered token ~ p (the last residual).
//   at a node without children: emit the bonus token ~ p.
// A chain is the tree where every node has one child; there this is exactly Leviathan's
// algorithm.
//
// When it is exact (the assumptions; the tests in tests/unit/sample_rejection_test.cc match them):
//   q_j must be the law of x_j given the prefix *and the earlier siblings x_1..x_{j-1}*, and the
//   draft tokens of a subtree may depend only on its prefix (not on tokens elsewhere in the tree or
//   on the verification). Proof sketch: accepting x_1 emits y with probability min(p, q_1)(y);
//   rejection happens with probability sum max(0, p - q_1), and conditioned on it and on x_1 the
//   remaining siblings follow their own conditionals, so by induction they emit ~ norm(max(0,
//   p - q_1)); the sum is p(y). The same argument applies level by level below the accepted child.
//   Covered draft processes:
//   - children sampled i.i.d. (with replacement) from one draft distribution q: pass q for every
//     child (duplicates are fine; SpecInfer's MSS / SpecTr-style i.i.d. drafts);
//   - children from different independent proposers (several draft models): each its own q;
//   - children sampled WITHOUT replacement from q (Gumbel-top-k, Jeon et al.'s RSD): pass q_j =
//     q with x_1..x_{j-1} removed and renormalized. Passing the unconditioned q here is NOT exact;
//   - deterministic children (top-k of the draft, n-gram/prompt lookup, static Medusa trees,
//     EAGLE-2's deterministic expansion): q = nullptr (one-hot at the token); any fixed list of
//     tokens is exact, whatever produced it.
//   Not exact: trees pruned or re-ranked after sampling using the sampled tokens' values (e.g.
//   keeping the sampled children with the highest draft probability) unless the tokens are then
//   treated as deterministic AND verified with q = nullptr; and Medusa's "typical acceptance"
//   (VerifyTreeTypical below), a different rule that is lossy by design.
//
// Typical acceptance (VerifyTreeTypical; Cai et al. 2024, Medusa section 3.3.1), LOSSY: the output
// is no longer distributed as plain sampling. A draft token x at a node with target p is accepted
// when p(x) > min(epsilon, delta * exp(-H(p))) (H: the entropy of p, in nats), whatever q was;
// of the root-to-node paths whose every token is accepted, the longest wins (ties: the higher
// sum of log p(x) along it, then the lower node index). The token after it is drawn from that
// node's p (is_bonus true, even where the node has children). Plausible tokens are kept where
// the target is unsure (high entropy lowers the threshold), so more drafts are accepted than by
// rejection sampling at temperature > 0; callers must report it as lossy (SpecMetrics).
//
// Greedy verification (VerifyTreeGreedy): the longest path whose every token equals the argmax of
// the target at its position (first matching child in index order), then the target's argmax
// after it. Uses no randomness. With greedy target distributions (one-hot), VerifyTree gives the
// same result and also draws nothing.
//
// Randomness: every uniform comes from a UniformSource, so tests can inject exact values. A uniform
// is drawn only when a decision is actually random: an acceptance test with 0 < p(x) < q(x)
// (accept iff u * q(x) < p(x)), or a draw from a distribution with >= 2 candidates
// (Sampler::SampleWithUniform). p(x) >= q(x) accepts and p(x) = 0 rejects without drawing.
//
// Numerical edge: if a rejection leaves a residual with no mass (possible only through float
// rounding when p ~= q), the recovered token is drawn from the pre-rejection p instead.
//
// Thread-safety: free functions over caller-owned inputs; safe to call concurrently with distinct
// outputs and uniform sources.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rng.h"

namespace kiln::sample {

// Source of uniform numbers in [0, 1) for the rejection sampler.
class UniformSource {
 public:
  virtual ~UniformSource() = default;
  virtual absl::StatusOr<double> Next() = 0;
};

// Draws from an Rng (NextDouble()). The Rng must outlive this object.
class RngUniformSource final : public UniformSource {
 public:
  explicit RngUniformSource(Rng& rng) : rng_(rng) {}
  absl::StatusOr<double> Next() override { return rng_.NextDouble(); }

 private:
  Rng& rng_;
};

// Replays pre-drawn uniforms; running out is OutOfRange (a test bug, reported, not a crash).
class FixedUniformSource final : public UniformSource {
 public:
  explicit FixedUniformSource(std::vector<double> uniforms) : uniforms_(std::move(uniforms)) {}
  absl::StatusOr<double> Next() override;
  size_t consumed() const { return next_; }

 private:
  std::vector<double> uniforms_;
  size_t next_ = 0;
};

// One draft token of a tree.
struct DraftNode {
  // -1: a child of the root (hangs off the last committed token); else the index of an earlier
  // node (parent < own index, so nodes are in topological order).
  int32_t parent = -1;
  int32_t token = 0;
  // The distribution this token was drawn from, conditioned as described above; nullptr = a
  // deterministic draft (q one-hot at `token`). When given, q->ProbOf(token) must be > 0.
  const Distribution* q = nullptr;
  // Target distribution of the token that follows this node (from the target's logits at this
  // node's position). Required.
  const Distribution* p = nullptr;
};

struct DraftTree {
  const Distribution* root_p = nullptr;  // target distribution for the first draft position
  std::span<const DraftNode> nodes;      // [n_nodes], topological; may be empty
};

struct VerifyResult {
  std::vector<int32_t> accepted_nodes;  // [n_accepted] node indices, root to leaf
  std::vector<int32_t> tokens;          // [n_accepted + 1] accepted tokens, then next_token
  int32_t next_token = -1;              // the recovered or bonus token
  bool is_bonus = false;                // true: next_token is a bonus; false: recovered
  int32_t uniforms_used = 0;            // how many uniforms were consumed

  int32_t num_accepted() const { return static_cast<int32_t>(accepted_nodes.size()); }
};

// Stochastic tree verification (see above). InvalidArgument for a malformed tree (naming the node
// and field): null/empty p, bad parent, token outside the vocab, mismatched vocab sizes, a draft
// token with q(token) = 0. Errors from `uniforms` are passed through.
absl::Status VerifyTree(const DraftTree& tree, UniformSource& uniforms, VerifyResult* out);

// Chain verification: tokens [K], q [K] (or empty: every draft deterministic), p [K + 1] where
// p[i] is the target distribution at draft position i and p[K] the one after the last draft token.
absl::Status VerifyChain(std::span<const int32_t> tokens, std::span<const Distribution> q,
                         std::span<const Distribution> p, UniformSource& uniforms,
                         VerifyResult* out);

// The lossy typical-acceptance rule (see above). Medusa's defaults: epsilon 0.09, delta 0.3.
struct TypicalAcceptance {
  float epsilon = 0.09f;  // the threshold's cap, in (0, 1]
  float delta = 0.3f;     // the factor of exp(-entropy), > 0
};

// OK, or InvalidArgument naming the field outside its range.
absl::Status CheckTypicalAcceptance(const TypicalAcceptance& rule);

// min(epsilon, delta * exp(-H(p))): a draft token needs a target probability above it.
double TypicalThreshold(const Distribution& p, const TypicalAcceptance& rule);

// Typical-acceptance verification (see above): InvalidArgument for a malformed tree (as VerifyTree)
// or a rule outside its ranges; errors from `uniforms` are passed through. The q fields are
// ignored.
absl::Status VerifyTreeTypical(const DraftTree& tree, const TypicalAcceptance& rule,
                               UniformSource& uniforms, VerifyResult* out);

// Greedy verification (see above); the q fields are ignored.
absl::Status VerifyTreeGreedy(const DraftTree& tree, VerifyResult* out);
absl::Status VerifyChainGreedy(std::span<const int32_t> tokens, std::span<const Distribution> p,
                               VerifyResult* out);

// norm(max(0, p - q)) into *out; q == nullptr means one-hot at `token`. Returns false (and leaves
// *out empty) when the residual has no mass. Exposed for tests.
bool ResidualDistribution(const Distribution& p, const Distribution* q, int32_t token,
                          Distribution* out);

}  // namespace kiln::sample
