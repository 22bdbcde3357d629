// Rejection sampler tests: hand-worked decisions with injected uniforms, greedy verification,
// acceptance rate vs alpha = sum min(p, q), and exactness (speculative output distributed as
// direct sampling from p) for chains and trees under the draft processes the header declares
// exact — plus a negative control showing that violating the stated assumption is detected.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <deque>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rejection_sampler.h"
#include "lib/sample/rng.h"
#include "lib/sample/sampler.h"

namespace kiln::sample {
namespace {

// Builds a Distribution over `vocab` tokens from (token, prob) pairs, sorted as the contract says.
Distribution Dist(int32_t vocab, std::vector<std::pair<int32_t, double>> probs) {
  std::vector<double> w(vocab, 0.0);
  for (const auto& [t, p] : probs) w[t] = p;
  absl::StatusOr<Distribution> d = Distribution::FromWeights(w);
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

// --- (c) hand-worked decisions with injected uniforms ----------------------------------------

constexpr int32_t A = 0, B = 1, C = 2, D = 3;

TEST(RejectionHandWorked, AcceptWhenUniformBelowRatio) {
  const Distribution p0 = Dist(4, {{A, 0.5}, {B, 0.3}, {C, 0.2}});
  const Distribution q0 = Dist(4, {{A, 0.2}, {B, 0.6}, {C, 0.2}});
  const Distribution p1 = Dist(4, {{D, 1.0}});
  // Draft B: p/q = 0.3/0.6 = 0.5. u = 0.4 accepts; then bonus from one-hot p1 (no draw).
  FixedUniformSource u({0.4});
  VerifyResult r;
  ASSERT_TRUE(VerifyChain(std::vector<int32_t>{B}, std::vector<Distribution>{q0},
                          std::vector<Distribution>{p0, p1}, u, &r)
                  .ok());
  EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{B, D}));
  EXPECT_TRUE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 1);
  EXPECT_EQ(u.consumed(), 1u);
}

TEST(RejectionHandWorked, RejectThenRecoverFromResidual) {
  const Distribution p0 = Dist(4, {{A, 0.5}, {B, 0.3}, {C, 0.2}});
  const Distribution q0 = Dist(4, {{B, 0.7}, {C, 0.1}, {D, 0.2}});
  const Distribution p1 = Dist(4, {{D, 1.0}});
  // Draft B: p/q = 0.3/0.7 = 0.4286; u = 0.5 rejects. Residual max(0, p - q) = {A: 0.5, C: 0.1}
  // -> {A: 5/6, C: 1/6}. Second uniform 0.9 > 5/6 -> C; 0.8 < 5/6 -> A.
  for (const auto& [second, want] : {std::pair{0.9, C}, std::pair{0.8, A}}) {
    FixedUniformSource u({0.5, second});
    VerifyResult r;
    ASSERT_TRUE(VerifyChain(std::vector<int32_t>{B}, std::vector<Distribution>{q0},
                            std::vector<Distribution>{p0, p1}, u, &r)
                    .ok());
    EXPECT_TRUE(r.accepted_nodes.empty());
    EXPECT_EQ(r.next_token, want);
    EXPECT_FALSE(r.is_bonus);
    EXPECT_EQ(r.uniforms_used, 2);
  }
  Distribution residual;
  ASSERT_TRUE(ResidualDistribution(p0, &q0, B, &residual));
  ASSERT_EQ(residual.candidates.size(), 2u);
  EXPECT_EQ(residual.candidates[0].token, A);
  EXPECT_NEAR(residual.candidates[0].prob, 5.0 / 6, 1e-6);
  EXPECT_EQ(residual.candidates[1].token, C);
  EXPECT_NEAR(residual.candidates[1].prob, 1.0 / 6, 1e-6);
}

TEST(RejectionHandWorked, ChainAllAcceptedThenBonus) {
  const Distribution p0 = Dist(4, {{A, 0.5}, {B, 0.3}, {C, 0.2}});
  const Distribution q0 = Dist(4, {{A, 0.4}, {B, 0.6}});
  const Distribution p1 = Dist(4, {{B, 0.6}, {D, 0.4}});
  const Distribution q1 = Dist(4, {{B, 0.8}, {D, 0.2}});
  const Distribution p2 = Dist(4, {{C, 0.5}, {D, 0.5}});
  // A: p = 0.5 >= q = 0.4 -> accepted without a draw. B: ratio 0.75, u = 0.7 accepts.
  // Bonus from p2 with u = 0.25 -> C (cumulative 0.5).
  FixedUniformSource u({0.7, 0.25});
  VerifyResult r;
  ASSERT_TRUE(VerifyChain(std::vector<int32_t>{A, B}, std::vector<Distribution>{q0, q1},
                          std::vector<Distribution>{p0, p1, p2}, u, &r)
                  .ok());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{A, B, C}));
  EXPECT_EQ(r.num_accepted(), 2);
  EXPECT_TRUE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 2);
  // Same with u = 0.8 at B: 0.8 * 0.8 = 0.64 is not < 0.6 -> rejected; residual of p1 - q1 is
  // {D: 0.2} -> D with no draw.
  FixedUniformSource u2({0.8});
  ASSERT_TRUE(VerifyChain(std::vector<int32_t>{A, B}, std::vector<Distribution>{q0, q1},
                          std::vector<Distribution>{p0, p1, p2}, u2, &r)
                  .ok());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{A, D}));
  EXPECT_FALSE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 1);
}

TEST(RejectionHandWorked, TargetZeroRejectsWithoutDraw) {
  const Distribution p0 = Dist(4, {{A, 0.5}, {B, 0.5}});
  const Distribution q0 = Dist(4, {{D, 1.0}});
  FixedUniformSource u({0.3});
  VerifyResult r;
  ASSERT_TRUE(VerifyChain(std::vector<int32_t>{D}, std::vector<Distribution>{q0},
                          std::vector<Distribution>{p0, Dist(4, {{C, 1.0}})}, u, &r)
                  .ok());
  // Residual = p0 (q has no mass where p has); the one uniform picks A (0.3 < 0.5).
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{A}));
  EXPECT_EQ(r.uniforms_used, 1);
}

TEST(RejectionHandWorked, DeterministicTreeSiblingsThenDescend) {
  // Root children (deterministic): node0 = B, node1 = A. node1 has child node2 = C (det).
  const Distribution root = Dist(4, {{A, 0.5}, {B, 0.3}, {C, 0.2}});
  const Distribution p_b = Dist(4, {{D, 1.0}});
  const Distribution p_a = Dist(4, {{C, 0.25}, {D, 0.75}});
  const Distribution p_ac = Dist(4, {{A, 0.5}, {B, 0.5}});
  const std::vector<DraftNode> nodes = {
      {-1, B, nullptr, &p_b}, {-1, A, nullptr, &p_a}, {1, C, nullptr, &p_ac}};
  // B: accept prob p(B) = 0.3; u = 0.5 rejects. Residual: p without B = {A: 5/7, C: 2/7}.
  // A: ratio 5/7 = 0.714; u = 0.6 accepts. Under A: C with p = 0.25; u = 0.2 accepts.
  // Bonus from p_ac: u = 0.7 -> B.
  FixedUniformSource u({0.5, 0.6, 0.2, 0.7});
  VerifyResult r;
  ASSERT_TRUE(VerifyTree({&root, nodes}, u, &r).ok());
  EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{A, C, B}));
  EXPECT_TRUE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 4);
  // u = 0.72 for A: 0.72 >= 5/7 rejects too; recovered from p without B and A = {C: 1} (no draw).
  FixedUniformSource u2({0.5, 0.72});
  ASSERT_TRUE(VerifyTree({&root, nodes}, u2, &r).ok());
  EXPECT_TRUE(r.accepted_nodes.empty());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{C}));
  EXPECT_FALSE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 2);
}

TEST(RejectionHandWorked, EmptyTreeIsPlainSampling) {
  const Distribution root = Dist(4, {{A, 0.5}, {B, 0.5}});
  FixedUniformSource u({0.75});
  VerifyResult r;
  ASSERT_TRUE(VerifyTree({&root, {}}, u, &r).ok());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{B}));
  EXPECT_TRUE(r.is_bonus);
}

TEST(RejectionErrors, MalformedInputsGiveStatuses) {
  const Distribution p = Dist(4, {{A, 0.5}, {B, 0.5}});
  const Distribution p5 = Dist(5, {{A, 1.0}});
  const Distribution q = Dist(4, {{A, 1.0}});
  VerifyResult r;
  FixedUniformSource none({});
  const auto message = [&](std::vector<DraftNode> nodes, const Distribution* root) {
    return std::string(VerifyTree({root, nodes}, none, &r).message());
  };
  EXPECT_NE(message({{0, A, nullptr, &p}}, &p).find("node 0: parent 0"), std::string::npos);
  EXPECT_NE(message({{-1, 7, nullptr, &p}}, &p).find("token 7 is outside"), std::string::npos);
  EXPECT_NE(message({{-1, B, &q, &p}}, &p).find("q = 0"), std::string::npos);
  EXPECT_NE(message({{-1, A, nullptr, &p5}}, &p).find("vocab_size 5"), std::string::npos);
  EXPECT_NE(message({{-1, A, nullptr, nullptr}}, &p).find("node 0: p is null"), std::string::npos);
  EXPECT_NE(message({}, nullptr).find("root_p is null"), std::string::npos);
  // Running out of injected uniforms is reported, not a crash.
  absl::Status s = VerifyTree({&p, {}}, none, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  // Chain shape mismatch.
  s = VerifyChain(std::vector<int32_t>{A}, {}, std::vector<Distribution>{p}, none, &r);
  EXPECT_NE(s.message().find("need 2 target distributions"), std::string::npos) << s;
}

// --- (d) greedy verification --------------------------------------------------------------

TEST(RejectionGreedy, LongestArgmaxPathThenArgmax) {
  const int32_t V = 6;
  const Distribution root = Dist(V, {{1, 0.6}, {3, 0.4}});  // argmax 1
  const Distribution after_3 = Dist(V, {{0, 1.0}});
  const Distribution after_1 = Dist(V, {{0, 0.7}, {2, 0.3}});  // argmax 0
  const Distribution after_12 = Dist(V, {{5, 1.0}});
  const Distribution after_10 = Dist(V, {{4, 0.5}, {5, 0.5}});  // tie: argmax 4 (lower id)
  // Tree: root -> {3 (n0), 1 (n1)}; n1 -> {2 (n2), 0 (n3)}.
  const std::vector<DraftNode> nodes = {{-1, 3, nullptr, &after_3},
                                        {-1, 1, nullptr, &after_1},
                                        {1, 2, nullptr, &after_12},
                                        {1, 0, nullptr, &after_10}};
  VerifyResult r;
  ASSERT_TRUE(VerifyTreeGreedy({&root, nodes}, &r).ok());
  EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0, 4}));
  EXPECT_TRUE(r.is_bonus);
  EXPECT_EQ(r.uniforms_used, 0);

  // No child matches at the root: recovered = root argmax.
  const std::vector<DraftNode> miss = {{-1, 3, nullptr, &after_3}};
  ASSERT_TRUE(VerifyTreeGreedy({&root, miss}, &r).ok());
  EXPECT_TRUE(r.accepted_nodes.empty());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1}));
  EXPECT_FALSE(r.is_bonus);

  // Chain: [1, 2] matches only the first; then the argmax after 1 is 0.
  ASSERT_TRUE(VerifyChainGreedy(std::vector<int32_t>{1, 2},
                                std::vector<Distribution>{root, after_1, after_12}, &r)
                  .ok());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0}));
  EXPECT_FALSE(r.is_bonus);
}

TEST(RejectionGreedy, StochasticVerifierOnOneHotTargetsAgreesAndDrawsNothing) {
  const int32_t V = 6;
  const Distribution root = Distribution::OneHot(V, 1);
  const Distribution after_3 = Distribution::OneHot(V, 0);
  const Distribution after_1 = Distribution::OneHot(V, 0);
  const Distribution after_12 = Distribution::OneHot(V, 5);
  const Distribution after_10 = Distribution::OneHot(V, 4);
  const Distribution q_root = Dist(V, {{3, 0.5}, {1, 0.5}});
  const Distribution q_1 = Dist(V, {{2, 0.9}, {0, 0.1}});
  const std::vector<DraftNode> nodes = {{-1, 3, &q_root, &after_3},
                                        {-1, 1, &q_root, &after_1},
                                        {1, 2, &q_1, &after_12},
                                        {1, 0, &q_1, &after_10}};
  VerifyResult greedy, stochastic;
  ASSERT_TRUE(VerifyTreeGreedy({&root, nodes}, &greedy).ok());
  FixedUniformSource none({});
  ASSERT_TRUE(VerifyTree({&root, nodes}, none, &stochastic).ok());
  EXPECT_EQ(stochastic.tokens, greedy.tokens);
  EXPECT_EQ(stochastic.tokens, (std::vector<int32_t>{1, 0, 4}));
  EXPECT_EQ(none.consumed(), 0u);
}

// --- typical acceptance (lossy, Medusa's rule) -------------------------------------------------

TEST(TypicalAcceptance, ThresholdIsMinOfEpsilonAndScaledExpOfMinusEntropy) {
  const Distribution uniform4 = Dist(6, {{A, 1}, {B, 1}, {C, 1}, {D, 1}});
  const TypicalAcceptance medusa;                                     // epsilon 0.09, delta 0.3
  EXPECT_NEAR(TypicalThreshold(uniform4, medusa), 0.3 * 0.25, 1e-6);  // exp(-ln 4) = 1/4
  EXPECT_NEAR(TypicalThreshold(Distribution::OneHot(6, A), medusa), 0.09, 1e-7);  // H = 0
  EXPECT_NEAR(TypicalThreshold(uniform4, {0.5f, 1.0f}), 0.25, 1e-6);
  EXPECT_NEAR(TypicalThreshold(uniform4, {0.2f, 1.0f}), 0.2, 1e-6);
}

TEST(TypicalAcceptance, LongestAcceptedPathWinsThenTheNextTokenIsDrawnAfterIt) {
  constexpr int32_t E = 4, F = 5;
  const int32_t V = 6;
  // Root: H = 1.03 nats, threshold min(0.09, 0.3 * 0.357) = 0.09: A, B and C pass.
  const Distribution root = Dist(V, {{A, 0.5}, {B, 0.3}, {C, 0.2}});
  const Distribution after_a = Dist(V, {{D, 0.05}, {E, 0.95}});  // threshold 0.09: D fails
  const Distribution after_b = Dist(V, {{D, 0.6}, {E, 0.4}});    // D and E pass
  const Distribution after_bd = Dist(V, {{F, 0.7}, {A, 0.3}});
  const Distribution after_be = Dist(V, {{F, 1.0}});
  const Distribution after_ad = Dist(V, {{F, 1.0}});
  // Tree: root -> {A (n0), B (n1)}; n0 -> D (n2); n1 -> {D (n3), E (n4)}. n3 and n4 are both two
  // deep: n3 has the higher sum of log p (0.3 * 0.6 > 0.3 * 0.4).
  const std::vector<DraftNode> nodes = {{-1, A, nullptr, &after_a},
                                        {-1, B, nullptr, &after_b},
                                        {0, D, nullptr, &after_ad},
                                        {1, D, nullptr, &after_bd},
                                        {1, E, nullptr, &after_be}};
  for (const auto& [u, want] : {std::pair{0.5, F}, std::pair{0.9, A}}) {
    FixedUniformSource uniforms({u});
    VerifyResult r;
    ASSERT_TRUE(VerifyTreeTypical({&root, nodes}, {}, uniforms, &r).ok());
    EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{B, D, want}));
    EXPECT_TRUE(r.is_bonus);
    EXPECT_EQ(r.uniforms_used, 1);
  }
  // A stricter cap (epsilon 0.35) leaves only A at the root, whose child D fails: one token.
  FixedUniformSource one({0.5});
  VerifyResult r;
  ASSERT_TRUE(VerifyTreeTypical({&root, nodes}, {0.35f, 1.0f}, one, &r).ok());
  EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{A, E}));  // after_a at u = 0.5: E
}

TEST(TypicalAcceptance, NothingAcceptedDrawsFromTheRootTarget) {
  const Distribution root = Dist(4, {{A, 0.97}, {B, 0.03}});
  const Distribution after_b = Dist(4, {{C, 1.0}});
  const std::vector<DraftNode> nodes = {{-1, B, nullptr, &after_b}};  // 0.03 < 0.09
  FixedUniformSource uniforms({0.999});
  VerifyResult r;
  ASSERT_TRUE(VerifyTreeTypical({&root, nodes}, {}, uniforms, &r).ok());
  EXPECT_TRUE(r.accepted_nodes.empty());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{B}));  // drawn from the root: u = 0.999 -> B
}

// Why the rule is opt-in: a draft token the target gives 0.2 is always kept, where plain
// sampling (and exact verification) emits it one time in five.
TEST(TypicalAcceptance, IsLossy) {
  const Distribution root = Dist(4, {{A, 0.8}, {B, 0.2}});
  const Distribution after_b = Dist(4, {{C, 1.0}});
  const std::vector<DraftNode> nodes = {{-1, B, nullptr, &after_b}};
  Rng rng(11);
  int typical_b = 0, exact_b = 0;
  constexpr int kTrials = 2000;
  for (int i = 0; i < kTrials; ++i) {
    RngUniformSource uniforms(rng);
    VerifyResult typical, exact;
    ASSERT_TRUE(VerifyTreeTypical({&root, nodes}, {}, uniforms, &typical).ok());
    ASSERT_TRUE(VerifyTree({&root, nodes}, uniforms, &exact).ok());
    typical_b += typical.tokens[0] == B;
    exact_b += exact.tokens[0] == B;
  }
  EXPECT_EQ(typical_b, kTrials);
  // Binomial(2000, 0.2): mean 400, standard deviation 17.9; 5 deviations either side.
  EXPECT_NEAR(exact_b, 400, 90);
}

TEST(TypicalAcceptance, BadRulesAndMalformedTreesAreErrors) {
  const Distribution root = Dist(4, {{A, 0.5}, {B, 0.5}});
  const std::vector<DraftNode> nodes = {{-1, B, nullptr, &root}};
  FixedUniformSource uniforms({0.5, 0.5});
  VerifyResult r;
  for (const TypicalAcceptance& bad :
       {TypicalAcceptance{0.0f, 0.3f}, TypicalAcceptance{1.5f, 0.3f},
        TypicalAcceptance{std::nanf(""), 0.3f}, TypicalAcceptance{0.09f, 0.0f},
        TypicalAcceptance{0.09f, INFINITY}}) {
    const absl::Status st = VerifyTreeTypical({&root, nodes}, bad, uniforms, &r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        absl::StrContains(st.message(), bad.epsilon > 0 && bad.epsilon <= 1 ? "delta" : "epsilon"))
        << st;
  }
  const std::vector<DraftNode> bad_parent = {{3, B, nullptr, &root}};
  EXPECT_EQ(VerifyTreeTypical({&root, bad_parent}, {}, uniforms, &r).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uniforms.consumed(), 0u);
}

// --- (a) acceptance rate ---------------------------------------------------------------------

Distribution RandomDistribution(int32_t vocab, Rng& rng) {
  std::vector<double> w(vocab);
  for (double& x : w) {
    const double u1 = 1.0 - rng.NextDouble(), u2 = rng.NextDouble();
    x = std::exp(1.5 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return *Distribution::FromWeights(w);
}

double Alpha(const Distribution& p, const Distribution& q) {
  double alpha = 0.0;
  for (const TokenProb& c : p.candidates) alpha += std::min<double>(c.prob, q.ProbOf(c.token));
  return alpha;
}

TEST(RejectionStatistics, AcceptanceRateIsSumOfMin) {
  Rng rng(17);
  RngUniformSource uniforms(rng);
  for (int32_t vocab : {8, 12, 16}) {
    const Distribution p = RandomDistribution(vocab, rng);
    const Distribution q = RandomDistribution(vocab, rng);
    const Distribution after = Distribution::OneHot(vocab, 0);
    const double alpha = Alpha(p, q);
    constexpr int kSteps = 100000;
    int accepted = 0;
    VerifyResult r;
    for (int i = 0; i < kSteps; ++i) {
      const int32_t x = Sampler::Sample(q, rng);
      const DraftNode node{-1, x, &q, &after};
      ASSERT_TRUE(VerifyTree({&p, std::span<const DraftNode>(&node, 1)}, uniforms, &r).ok());
      accepted += r.num_accepted();
    }
    // sd of the rate <= sqrt(0.25 / 1e5) = 0.0016: the 0.01 bound is > 6 sd.
    EXPECT_NEAR(static_cast<double>(accepted) / kSteps, alpha, 0.01) << "vocab " << vocab;
  }
}

TEST(RejectionStatistics, ExpectedTokensPerStepMatchesFormula) {
  // Same p and q at every position: E[tokens per step] = (1 - alpha^(K+1)) / (1 - alpha).
  Rng rng(23);
  RngUniformSource uniforms(rng);
  const int32_t vocab = 10;
  const Distribution p = RandomDistribution(vocab, rng);
  const Distribution q = RandomDistribution(vocab, rng);
  const double alpha = Alpha(p, q);
  constexpr int K = 4;
  const std::vector<Distribution> qs(K, q), ps(K + 1, p);
  constexpr int kSteps = 100000;
  double tokens = 0.0;
  VerifyResult r;
  std::vector<int32_t> draft(K);
  for (int i = 0; i < kSteps; ++i) {
    for (int32_t& t : draft) t = Sampler::Sample(q, rng);
    ASSERT_TRUE(VerifyChain(draft, qs, ps, uniforms, &r).ok());
    tokens += static_cast<double>(r.tokens.size());
  }
  const double want = (1.0 - std::pow(alpha, K + 1)) / (1.0 - alpha);
  // tokens per step lies in [1, 5]: sd of the mean <= 2 / sqrt(1e5) = 0.0063; bound 0.03.
  EXPECT_NEAR(tokens / kSteps, want, 0.03) << "alpha " << alpha;
}

// --- (b) exactness: speculative vs direct sampling -------------------------------------------

constexpr int32_t kVocab = 8;
constexpr int kPositions = 3;  // checked positions (K)
constexpr int kMaxLen = 8;     // longest prefix a run can reach: K - 1 + tree depth (3) + slack

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Target and draft "models": logits depend on (position, previous two tokens) through a hash;
// the draft is the target's logits plus a hashed perturbation in [-1.25, 1.25]. Both go through
// the same sampler chain (temperature 0.8, top-p 0.9). Distributions are cached per state.
class SyntheticModels {
 public:
  explicit SyntheticModels(SamplerParams params) : sampler_(std::move(params)) {
    target_.resize(kStates);
    draft_.resize(kStates);
  }

  const Distribution& Target(const std::vector<int32_t>& prefix) { return Get(prefix, false); }
  const Distribution& Draft(const std::vector<int32_t>& prefix) { return Get(prefix, true); }

 private:
  static constexpr int kStates = (kMaxLen + 1) * (kVocab + 1) * (kVocab + 1);

  const Distribution& Get(const std::vector<int32_t>& prefix, bool draft) {
    const int n = static_cast<int>(prefix.size());
    EXPECT_LE(n, kMaxLen);
    const int a = n >= 1 ? prefix[n - 1] + 1 : 0;
    const int b = n >= 2 ? prefix[n - 2] + 1 : 0;
    const int state = (n * (kVocab + 1) + a) * (kVocab + 1) + b;
    std::vector<Distribution>& cache = draft ? draft_ : target_;
    Distribution& d = cache[state];
    if (d.candidates.empty()) {
      std::array<float, kVocab> logits;
      for (int t = 0; t < kVocab; ++t) {
        const uint64_t h = Mix(static_cast<uint64_t>(state) * 131 + t);
        logits[t] = static_cast<float>(4.0 * (h >> 11) * 0x1.0p-53 - 1.5);
        if (draft) {
          const uint64_t g = Mix(h ^ 0x5bd1e995ull);
          logits[t] += static_cast<float>(2.5 * ((g >> 11) * 0x1.0p-53) - 1.25);
        }
      }
      const absl::Status s = sampler_.Apply(logits, {}, &d);
      EXPECT_TRUE(s.ok()) << s;
    }
    return d;
  }

  Sampler sampler_;
  std::vector<Distribution> target_, draft_;  // [kStates]
};

enum class DraftMode {
  kIid,                       // children i.i.d. from q (with replacement), q passed as is
  kWithoutReplacement,        // children without replacement, conditional q_j passed
  kDeterministicTop,          // the most probable tokens of q, q = nullptr
  kWithoutReplacementWrongQ,  // without replacement but unconditioned q passed (NOT exact)
};

struct Shape {
  const char* name;
  std::vector<int> branching;  // children per node at each depth
  DraftMode mode;
};

void PrintTo(const Shape& shape, std::ostream* os) { *os << shape.name; }

class TreeBuilder {
 public:
  TreeBuilder(SyntheticModels& models, Rng& rng) : models_(models), rng_(rng) {}

  void Build(const Shape& shape, const std::vector<int32_t>& prefix) {
    nodes_.clear();
    owned_q_.clear();
    path_ = prefix;
    Expand(shape, -1, 0);
  }
  std::span<const DraftNode> nodes() const { return nodes_; }

 private:
  void Expand(const Shape& shape, int32_t parent, size_t depth) {
    if (depth == shape.branching.size()) return;
    const Distribution& q = models_.Draft(path_);
    const int width = shape.branching[depth];
    std::vector<int32_t> kids;
    const Distribution* conditional = &q;
    for (int j = 0; j < width; ++j) {
      int32_t token = 0;
      const Distribution* node_q = &q;
      switch (shape.mode) {
        case DraftMode::kIid:
          token = Sampler::Sample(q, rng_);
          break;
        case DraftMode::kDeterministicTop:
          if (j >= static_cast<int>(q.candidates.size())) return Descend(shape, kids, depth);
          token = q.candidates[j].token;
          node_q = nullptr;
          break;
        case DraftMode::kWithoutReplacement:
        case DraftMode::kWithoutReplacementWrongQ: {
          if (conditional == nullptr) return Descend(shape, kids, depth);
          token = Sampler::Sample(*conditional, rng_);
          if (shape.mode == DraftMode::kWithoutReplacement) node_q = conditional;
          // The next sibling is drawn from q with every earlier sibling removed.
          owned_q_.emplace_back();
          conditional = ResidualDistribution(*conditional, nullptr, token, &owned_q_.back())
                            ? &owned_q_.back()
                            : nullptr;
          break;
        }
      }
      path_.push_back(token);
      nodes_.push_back({parent, token, node_q, &models_.Target(path_)});
      path_.pop_back();
      kids.push_back(static_cast<int32_t>(nodes_.size()) - 1);
    }
    Descend(shape, kids, depth);
  }

  void Descend(const Shape& shape, const std::vector<int32_t>& kids, size_t depth) {
    for (int32_t kid : kids) {
      path_.push_back(nodes_[kid].token);
      Expand(shape, kid, depth + 1);
      path_.pop_back();
    }
  }

  SyntheticModels& models_;
  Rng& rng_;
  std::vector<DraftNode> nodes_;
  std::deque<Distribution> owned_q_;  // conditional q's (stable addresses)
  std::vector<int32_t> path_;
};

SamplerParams ChainParams() {
  SamplerParams p;
  p.top_k = 0;
  p.min_p = 0.0f;
  p.top_p = 0.9f;
  p.temperature = 0.8f;
  return p;
}

// Exact marginal of direct sampling at each position: sum over prefixes.
std::array<std::array<double, kVocab>, kPositions> ExactMarginals(SyntheticModels& models) {
  std::array<std::array<double, kVocab>, kPositions> m{};
  std::vector<int32_t> prefix;
  const auto recurse = [&](auto&& self, double weight) -> void {
    const int pos = static_cast<int>(prefix.size());
    if (pos == kPositions) return;
    const Distribution d = models.Target(prefix);  // copy: the recursion may touch the cache
    for (const TokenProb& c : d.candidates) {
      m[pos][c.token] += weight * c.prob;
      prefix.push_back(c.token);
      self(self, weight * c.prob);
      prefix.pop_back();
    }
  };
  recurse(recurse, 1.0);
  return m;
}

// Runs `runs` generations of kPositions tokens with speculative steps of `shape`; returns the
// largest TV (over positions) between the emitted-token frequencies and the exact marginals.
double SpeculativeMaxTv(const Shape& shape, int runs, uint64_t seed, double* mean_accepted) {
  SyntheticModels models(ChainParams());
  const auto exact = ExactMarginals(models);
  Rng rng(seed);
  RngUniformSource uniforms(rng);
  TreeBuilder builder(models, rng);
  std::array<std::array<double, kVocab>, kPositions> counts{};
  std::vector<int32_t> prefix;
  VerifyResult r;
  double accepted = 0.0, steps = 0.0;
  for (int run = 0; run < runs; ++run) {
    prefix.clear();
    while (prefix.size() < static_cast<size_t>(kPositions)) {
      builder.Build(shape, prefix);
      const absl::Status s = VerifyTree({&models.Target(prefix), builder.nodes()}, uniforms, &r);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return 1.0;
      accepted += r.num_accepted();
      steps += 1.0;
      for (int32_t t : r.tokens) prefix.push_back(t);
    }
    for (int pos = 0; pos < kPositions; ++pos) counts[pos][prefix[pos]] += 1.0;
  }
  *mean_accepted = accepted / steps;
  double worst = 0.0;
  for (int pos = 0; pos < kPositions; ++pos) {
    double tv = 0.0;
    for (int t = 0; t < kVocab; ++t) tv += std::fabs(counts[pos][t] / runs - exact[pos][t]);
    worst = std::max(worst, 0.5 * tv);
  }
  return worst;
}

// TV noise floor: with N runs over V outcomes, E|f_t - p_t| ~ sqrt(2 p_t (1 - p_t) / (pi N)), so
// E[TV] = 0.5 sum_t E|f_t - p_t| <= 0.5 sqrt(2 / (pi N)) sum_t sqrt(p_t) <= sqrt(V / (2 pi N)).
// V = 8, N = 100,000: E[TV] <= 0.0036, and its sd is ~0.001; the 0.01 bound is ~2.8x the mean,
// > 6 sd above it. A verifier used outside its assumptions shows TV of 2-3% on these distributions
// (negative control below); resampling from p instead of the residual fails the chain case too.
constexpr int kRuns = 100000;
constexpr double kTvBound = 0.01;

class Exactness : public ::testing::TestWithParam<Shape> {};

TEST_P(Exactness, SpeculativeOutputMatchesDirectSampling) {
  const Shape& shape = GetParam();
  double mean_accepted = 0.0;
  const double tv = SpeculativeMaxTv(shape, kRuns, 1234, &mean_accepted);
  EXPECT_LT(tv, kTvBound) << shape.name;
  // Speculation must actually be exercised: some draft tokens get accepted.
  EXPECT_GT(mean_accepted, 0.3) << shape.name;
  std::printf("  %-28s max TV %.4f, mean accepted %.3f\n", shape.name, tv, mean_accepted);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Exactness,
    ::testing::Values(Shape{"chain_k3", {1, 1, 1}, DraftMode::kIid},
                      Shape{"root_2_iid", {2}, DraftMode::kIid},
                      Shape{"binary_depth2_iid", {2, 2}, DraftMode::kIid},
                      Shape{"3_1_1_iid", {3, 1, 1}, DraftMode::kIid},
                      Shape{"3_1_without_replacement", {3, 1}, DraftMode::kWithoutReplacement},
                      Shape{"2_2_deterministic_top", {2, 2}, DraftMode::kDeterministicTop}),
    [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

TEST(ExactnessNegativeControl, WithoutReplacementNeedsConditionalQ) {
  // Passing the unconditioned q for children drawn without replacement violates the header's
  // assumption; the test harness must see it (otherwise it could not see a real bug either).
  // Observed: TV 0.029 for 3 root children (0.019 for 2), i.e. ~25 sd above the exact cases'
  // mean; the bound 2 * kTvBound = 0.02 leaves ~9 sd of margin on each side.
  double mean_accepted = 0.0;
  const double tv = SpeculativeMaxTv({"wrong_q", {3}, DraftMode::kWithoutReplacementWrongQ}, kRuns,
                                     1234, &mean_accepted);
  std::printf("  wrong_q (3 root children) max TV %.4f\n", tv);
  EXPECT_GT(tv, 2 * kTvBound);
  // The same draws with the conditional q are exact.
  const double fixed = SpeculativeMaxTv({"right_q", {3}, DraftMode::kWithoutReplacement}, kRuns,
                                        1234, &mean_accepted);
  EXPECT_LT(fixed, kTvBound);
}

}  // namespace
}  // namespace kiln::sample
