#include "lib/sample/rejection_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "lib/common/status.h"
#include "lib/sample/sampler.h"

namespace kiln::sample {

absl::StatusOr<double> FixedUniformSource::Next() {
  if (next_ >= uniforms_.size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("FixedUniformSource: all %d uniforms were consumed", uniforms_.size()));
  }
  return uniforms_[next_++];
}

bool ResidualDistribution(const Distribution& p, const Distribution* q, int32_t token,
                          Distribution* out) {
  out->vocab_size = p.vocab_size;
  out->candidates.clear();
  out->top_logprobs.clear();
  out->raw_log_normalizer = 0.0;
  std::vector<std::pair<int32_t, double>> residual;  // [<= |p|] (token, max(0, p - q))
  residual.reserve(p.candidates.size());
  if (q == nullptr) {
    for (const TokenProb& c : p.candidates) {
      if (c.token != token) residual.push_back({c.token, c.prob});
    }
  } else {
    std::vector<TokenProb> q_by_token = q->candidates;  // [|q|] sorted by token for lookups
    std::sort(q_by_token.begin(), q_by_token.end(),
              [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
    for (const TokenProb& c : p.candidates) {
      const auto it = std::lower_bound(q_by_token.begin(), q_by_token.end(), c.token,
                                       [](const TokenProb& a, int32_t t) { return a.token < t; });
      const double qx = (it != q_by_token.end() && it->token == c.token) ? it->prob : 0.0;
      const double r = static_cast<double>(c.prob) - qx;
      if (r > 0.0) residual.push_back({c.token, r});
    }
  }
  double total = 0.0;
  for (const auto& [t, r] : residual) total += r;
  if (!(total > 0.0)) return false;
  out->candidates.reserve(residual.size());
  for (const auto& [t, r] : residual) {
    const float prob = static_cast<float>(r / total);
    if (prob > 0.0f) out->candidates.push_back({t, prob});
  }
  if (out->candidates.empty()) return false;
  // p's order was (prob desc, ...); the residual reorders: sort by prob desc, then token asc.
  std::sort(out->candidates.begin(), out->candidates.end(),
            [](const TokenProb& a, const TokenProb& b) {
              return a.prob > b.prob || (a.prob == b.prob && a.token < b.token);
            });
  return true;
}

namespace {

absl::Status CheckDistribution(const Distribution* d, int32_t vocab, const char* what,
                               int32_t node) {
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("draft node %d: %s is null", node, what));
  }
  if (d->candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("draft node %d: %s is empty", node, what));
  }
  if (d->vocab_size != vocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("draft node %d: %s has vocab_size %d, the root target has %d", node, what,
                        d->vocab_size, vocab));
  }
  return absl::OkStatus();
}

// Validates the tree; fills children in CSR form: child_begin [n + 2] (slot 0 = root, slot i + 1 =
// node i), children [n] node indices in index order.
absl::Status BuildChildren(const DraftTree& tree, std::vector<int32_t>* child_begin,
                           std::vector<int32_t>* children) {
  if (tree.root_p == nullptr) return absl::InvalidArgumentError("draft tree: root_p is null");
  if (tree.root_p->candidates.empty()) {
    return absl::InvalidArgumentError("draft tree: root_p is empty");
  }
  const int32_t vocab = tree.root_p->vocab_size;
  const size_t n = tree.nodes.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max() - 2)) {
    return absl::InvalidArgumentError("draft tree: too many nodes");
  }
  std::vector<int32_t> count(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const DraftNode& node = tree.nodes[i];
    const int32_t idx = static_cast<int32_t>(i);
    if (node.parent < -1 || node.parent >= idx) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft node %d: parent %d must be -1 or an earlier node index", idx, node.parent));
    }
    if (node.token < 0 || node.token >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft node %d: token %d is outside the vocabulary [0, %d)", idx, node.token, vocab));
    }
    KILN_RETURN_IF_ERROR(CheckDistribution(node.p, vocab, "p", idx));
    if (node.q != nullptr) {
      KILN_RETURN_IF_ERROR(CheckDistribution(node.q, vocab, "q", idx));
      if (!(node.q->ProbOf(node.token) > 0.0f)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "draft node %d: token %d has draft probability q = 0 (it cannot have been drawn "
            "from q)",
            idx, node.token));
      }
    }
    ++count[node.parent + 1];
  }
  child_begin->assign(n + 2, 0);
  for (size_t s = 0; s <= n; ++s) (*child_begin)[s + 1] = (*child_begin)[s] + count[s];
  children->assign(n, 0);
  std::vector<int32_t> fill(child_begin->begin(), child_begin->end() - 1);
  for (size_t i = 0; i < n; ++i) {
    (*children)[fill[tree.nodes[i].parent + 1]++] = static_cast<int32_t>(i);
  }
  return absl::OkStatus();
}

// Draws from `dist` (no uniform when it has one candidate).
absl::StatusOr<int32_t> Draw(const Distribution& dist, UniformSource& uniforms, VerifyResult* out) {
  if (dist.candidates.size() == 1) return dist.candidates[0].token;
  KILN_ASSIGN_OR_RETURN(const double u, uniforms.Next());
  ++out->uniforms_used;
  return Sampler::SampleWithUniform(dist, u);
}

void ResetResult(VerifyResult* out) {
  out->accepted_nodes.clear();
  out->tokens.clear();
  out->next_token = -1;
  out->is_bonus = false;
  out->uniforms_used = 0;
}

std::vector<DraftNode> ChainNodes(std::span<const int32_t> tokens, std::span<const Distribution> q,
                                  std::span<const Distribution> p) {
  std::vector<DraftNode> nodes(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    nodes[i].parent = static_cast<int32_t>(i) - 1;
    nodes[i].token = tokens[i];
    nodes[i].q = q.empty() ? nullptr : &q[i];
    nodes[i].p = &p[i + 1];
  }
  return nodes;
}

absl::Status CheckChainShapes(size_t k, size_t q_size, size_t p_size) {
  if (q_size != 0 && q_size != k) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft chain: %d tokens but %d q distributions (need %d, or 0 for deterministic)", k,
        q_size, k));
  }
  if (p_size != k + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft chain: %d tokens need %d target distributions p, got %d", k, k + 1, p_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyTree(const DraftTree& tree, UniformSource& uniforms, VerifyResult* out) {
  if (out == nullptr) return absl::InvalidArgumentError("VerifyTree: out is null");
  ResetResult(out);
  std::vector<int32_t> child_begin, children;
  KILN_RETURN_IF_ERROR(BuildChildren(tree, &child_begin, &children));

  Distribution residual[2];  // ping-pong buffers for successive residuals
  int32_t current = -1;      // -1 = root
  while (true) {
    const Distribution* p = current < 0 ? tree.root_p : tree.nodes[current].p;
    const int32_t begin = child_begin[current + 1];
    const int32_t end = child_begin[current + 2];
    if (begin == end) {
      KILN_ASSIGN_OR_RETURN(out->next_token, Draw(*p, uniforms, out));
      out->is_bonus = true;
      break;
    }
    int32_t accepted = -1;
    int flip = 0;
    for (int32_t c = begin; c < end; ++c) {
      const DraftNode& child = tree.nodes[children[c]];
      const double px = p->ProbOf(child.token);
      const double qx = child.q == nullptr ? 1.0 : child.q->ProbOf(child.token);
      bool accept = false;
      if (px >= qx) {
        accept = true;
      } else if (px > 0.0) {
        KILN_ASSIGN_OR_RETURN(const double u, uniforms.Next());
        ++out->uniforms_used;
        accept = u * qx < px;
      }
      if (accept) {
        accepted = children[c];
        break;
      }
      Distribution& next = residual[flip];
      if (!ResidualDistribution(*p, child.q, child.token, &next)) {
        continue;  // no residual mass (rounding only): keep p, as documented
      }
      p = &next;
      flip ^= 1;
    }
    if (accepted < 0) {
      KILN_ASSIGN_OR_RETURN(out->next_token, Draw(*p, uniforms, out));
      out->is_bonus = false;
      break;
    }
    out->accepted_nodes.push_back(accepted);
    out->tokens.push_back(tree.nodes[accepted].token);
    current = accepted;
  }
  out->tokens.push_back(out->next_token);
  return absl::OkStatus();
}

absl::Status VerifyChain(std::span<const int32_t> tokens, std::span<const Distribution> q,
                         std::span<const Distribution> p, UniformSource& uniforms,
                         VerifyResult* out) {
  KILN_RETURN_IF_ERROR(CheckChainShapes(tokens.size(), q.size(), p.size()));
  const std::vector<DraftNode> nodes = ChainNodes(tokens, q, p);
  return VerifyTree(DraftTree{&p[0], nodes}, uniforms, out);
}

absl::Status VerifyTreeGreedy(const DraftTree& tree, VerifyResult* out) {
  if (out == nullptr) return absl::InvalidArgumentError("VerifyTreeGreedy: out is null");
  ResetResult(out);
  std::vector<int32_t> child_begin, children;
  KILN_RETURN_IF_ERROR(BuildChildren(tree, &child_begin, &children));
  int32_t current = -1;
  while (true) {
    const Distribution* p = current < 0 ? tree.root_p : tree.nodes[current].p;
    const int32_t best = p->Argmax();
    const int32_t begin = child_begin[current + 1];
    const int32_t end = child_begin[current + 2];
    int32_t accepted = -1;
    for (int32_t c = begin; c < end && accepted < 0; ++c) {
      if (tree.nodes[children[c]].token == best) accepted = children[c];
    }
    if (accepted < 0) {
      out->next_token = best;
      out->is_bonus = begin == end;
      break;
    }
    out->accepted_nodes.push_back(accepted);
    out->tokens.push_back(best);
    current = accepted;
  }
  out->tokens.push_back(out->next_token);
  return absl::OkStatus();
}

absl::Status CheckTypicalAcceptance(const TypicalAcceptance& rule) {
  if (!(rule.epsilon > 0.0f && rule.epsilon <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("typical acceptance: epsilon %g is outside (0, 1]", rule.epsilon));
  }
  if (!(rule.delta > 0.0f) || !std::isfinite(rule.delta)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("typical acceptance: delta %g is not a finite number > 0", rule.delta));
  }
  return absl::OkStatus();
}

double TypicalThreshold(const Distribution& p, const TypicalAcceptance& rule) {
  double entropy = 0.0;
  for (const TokenProb& c : p.candidates) {
    if (c.prob > 0.0f) entropy -= static_cast<double>(c.prob) * std::log(c.prob);
  }
  return std::min<double>(rule.epsilon, rule.delta * std::exp(-entropy));
}

absl::Status VerifyTreeTypical(const DraftTree& tree, const TypicalAcceptance& rule,
                               UniformSource& uniforms, VerifyResult* out) {
  if (out == nullptr) return absl::InvalidArgumentError("VerifyTreeTypical: out is null");
  KILN_RETURN_IF_ERROR(CheckTypicalAcceptance(rule));
  ResetResult(out);
  std::vector<int32_t> child_begin, children;
  KILN_RETURN_IF_ERROR(BuildChildren(tree, &child_begin, &children));
  const size_t n = tree.nodes.size();
  // Per node, in topological order: on an all-accepted path? its depth and sum of log p(x).
  std::vector<char> on_path(n, 0);
  std::vector<int32_t> depth(n, 0);
  std::vector<double> log_p(n, 0.0);
  std::vector<double> threshold(n + 1, -1.0);  // [1 + node]: of the node's p, when needed
  int32_t best = -1;
  for (size_t i = 0; i < n; ++i) {
    const DraftNode& node = tree.nodes[i];
    if (node.parent >= 0 && !on_path[node.parent]) continue;
    const Distribution& p = node.parent < 0 ? *tree.root_p : *tree.nodes[node.parent].p;
    double& t = threshold[node.parent + 1];
    if (t < 0.0) t = TypicalThreshold(p, rule);
    const double px = p.ProbOf(node.token);
    if (!(px > t)) continue;
    on_path[i] = 1;
    depth[i] = node.parent < 0 ? 1 : depth[node.parent] + 1;
    log_p[i] = (node.parent < 0 ? 0.0 : log_p[node.parent]) + std::log(px);
    if (best < 0 || depth[i] > depth[best] || (depth[i] == depth[best] && log_p[i] > log_p[best])) {
      best = static_cast<int32_t>(i);
    }
  }
  for (int32_t v = best; v >= 0; v = tree.nodes[v].parent) out->accepted_nodes.push_back(v);
  std::reverse(out->accepted_nodes.begin(), out->accepted_nodes.end());
  for (int32_t v : out->accepted_nodes) out->tokens.push_back(tree.nodes[v].token);
  const Distribution& last = best < 0 ? *tree.root_p : *tree.nodes[best].p;
  KILN_ASSIGN_OR_RETURN(out->next_token, Draw(last, uniforms, out));
  out->is_bonus = true;
  out->tokens.push_back(out->next_token);
  return absl::OkStatus();
}

absl::Status VerifyChainGreedy(std::span<const int32_t> tokens, std::span<const Distribution> p,
                               VerifyResult* out) {
  KILN_RETURN_IF_ERROR(CheckChainShapes(tokens.size(), 0, p.size()));
  const std::vector<DraftNode> nodes = ChainNodes(tokens, {}, p);
  return VerifyTreeGreedy(DraftTree{&p[0], nodes}, out);
}

}  // namespace kiln::sample
