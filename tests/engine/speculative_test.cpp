// Speculative decoding in the engine core: the n-gram proposer, the verifier (engine/speculative/) and
// the step loop around them, on the simulated executor. Greedy outputs must be token-for-token those
// of plain decoding (batch 1, batch 16, under preemption), sampled outputs must have the target's
// distribution (chi-square against exactly computed probabilities), and no block may leak however
// many drafts are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sim_executor.hpp"
#include "engine/speculative/ngram_proposer.hpp"
#include "engine/speculative/speculative_options.hpp"
#include "engine/speculative/verifier.hpp"
#include "tests/support/chi_square.hpp"
#include "tests/support/greedy_params.hpp"
#include "tests/support/ngram_speculation.hpp"
#include "tests/support/scripted_constraints.hpp"

namespace tessera {
namespace {

using test_support::chi_square;
using testing::fake_logits;
using testing::markov2_executor;
using testing::markov_executor;
using testing::sim_executor;

// ---- the n-gram proposer ---------------------------------------------------------------------------

TEST(ngram_proposer, proposes_what_followed_the_latest_longest_match) {
  ngram_proposer p({.min_n = 1, .max_n = 3});
  // "5 6 7" occurs at 0 and at the end; "6 7" also at 4 (followed by 9): the 3-gram wins.
  const std::vector<token_id> ctx{5, 6, 7, 8, 6, 7, 9, 1, 5, 6, 7};
  EXPECT_EQ(p.propose(ctx, 2), (std::vector<token_id>{8, 6}));
  // Only a 1-gram matches (the latest 7 is at index 3): what followed it.
  const std::vector<token_id> ctx2{1, 7, 2, 7, 3, 4, 7};
  EXPECT_EQ(p.propose(ctx2, 2), (std::vector<token_id>{3, 4}));
  // No match at all.
  EXPECT_TRUE(p.propose(std::vector<token_id>{1, 2, 3, 4}, 3).empty());
  EXPECT_TRUE(p.propose(ctx, 0).empty());
}

TEST(ngram_proposer, a_repeating_cycle_is_proposed_as_it_repeats) {
  ngram_proposer p({.min_n = 2, .max_n = 2});
  const std::vector<token_id> ctx{9, 1, 2, 1, 2};  // "1 2" at 1, followed by "1 2" and on
  EXPECT_EQ(p.propose(ctx, 5), (std::vector<token_id>{1, 2, 1, 2, 1}));
}

TEST(ngram_proposer, min_n_bounds_the_match) {
  ngram_proposer p({.min_n = 2, .max_n = 4});
  EXPECT_TRUE(p.propose(std::vector<token_id>{1, 7, 2, 7}, 3).empty());  // only a 1-gram repeats
}

TEST(ngram_proposer, a_tree_merges_the_continuations_of_several_matches_first_match_first) {
  // "1 2" occurs at 0, 4 and 8 before the suffix: latest first they continue 3 8 1, 4 9 1 and 3 9 1.
  const std::vector<token_id> ctx{1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 8, 1, 2};
  ngram_proposer chain({.min_n = 1, .max_n = 2});
  ngram_proposer tree({.min_n = 1, .max_n = 2, .branches = 3});
  const draft_proposal t = tree.propose_tree(ctx, 3);
  // Branch 1 is nodes 0-2 (the chain propose() gives); branch 2 hangs under the last token; branch 3
  // shares node 0 ("3") and adds 9 1 under it.
  EXPECT_EQ(t.tokens, (std::vector<token_id>{3, 8, 1, 4, 9, 1, 9, 1}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, -1, 3, 4, 0, 6}));
  EXPECT_EQ(std::vector<token_id>(t.tokens.begin(), t.tokens.begin() + 3), chain.propose(ctx, 3));
  // More branches allowed than there are distinct continuations (the 1-gram "2" finds the same three).
  ngram_proposer wide({.min_n = 1, .max_n = 2, .branches = 8});
  EXPECT_EQ(wide.propose_tree(ctx, 3).tokens, t.tokens);
  // One branch, or only one distinct continuation: a chain (no parents).
  const draft_proposal one = ngram_proposer({.min_n = 1, .max_n = 2, .branches = 1}).propose_tree(ctx, 3);
  EXPECT_EQ(one.tokens, chain.propose(ctx, 3));
  EXPECT_TRUE(one.parents.empty());
  EXPECT_TRUE(tree.propose_tree(std::vector<token_id>{9, 1, 2, 1, 2}, 3).parents.empty());
  EXPECT_TRUE(tree.propose_tree(std::vector<token_id>{1, 2, 3}, 3).tokens.empty());
  // The batch call and the per-sequence one agree.
  const std::vector<draft_request> requests{{seq_id{1}, ctx, 3}, {seq_id{2}, std::span(ctx).first(6), 2}};
  const std::vector<draft_proposal> trees = tree.propose(requests);
  ASSERT_EQ(trees.size(), 2u);
  EXPECT_EQ(trees[0].tokens, t.tokens);
  EXPECT_EQ(trees[1].tokens, tree.propose_tree(std::span(ctx).first(6), 2).tokens);
  EXPECT_THROW(ngram_proposer({.min_n = 1, .max_n = 2, .branches = 0}), invalid_request);
}

TEST(speculative_options, bad_values_are_refused) {
  speculative_options o;
  o.mode = speculative_mode::ngram;
  o.validate();
  for (auto bad :
       {+[](speculative_options& s) { s.num_tokens = 0; }, +[](speculative_options& s) { s.num_tokens = -2; },
        +[](speculative_options& s) { s.max_batch = 0; }, +[](speculative_options& s) { s.ngram.min_n = 0; },
        +[](speculative_options& s) { s.ngram.max_n = 0; }, +[](speculative_options& s) { s.draft.branches = 0; },
        +[](speculative_options& s) { s.draft.branches = 65; }}) {
    speculative_options s = o;
    bad(s);
    EXPECT_THROW(s.validate(), invalid_request);
  }
  EXPECT_EQ(parse_speculative_mode("ngram"), speculative_mode::ngram);
  EXPECT_EQ(parse_speculative_mode("off"), speculative_mode::off);
  EXPECT_EQ(parse_speculative_mode("draft"), speculative_mode::draft);
  EXPECT_FALSE(parse_speculative_mode("eagle").has_value());
  EXPECT_FALSE(parse_speculative_mode("").has_value());
}

// ---- the verifier, directly --------------------------------------------------------------------------

// The distribution the sampler draws from, computed independently in double: logit_bias, the presence
// penalty over `history`, temperature, then top-k, then softmax.
std::vector<double> target_distribution(const std::vector<float>& logits, const sampling_params& p,
                                        const std::vector<token_id>& history) {
  std::vector<double> z(logits.size());
  for (size_t v = 0; v < z.size(); ++v) {
    double l = logits[v];
    for (const auto& [t, b] : p.logit_bias)
      if (t == static_cast<token_id>(v)) l += b;
    if (std::count(history.begin(), history.end(), static_cast<token_id>(v)) > 0) l -= p.presence_penalty;
    z[v] = l / p.temperature;
  }
  std::vector<double> sorted = z;
  std::sort(sorted.rbegin(), sorted.rend());
  const double cut = sorted[static_cast<size_t>(p.top_k - 1)];
  double total = 0;
  std::vector<double> prob(z.size(), 0.0);
  for (size_t v = 0; v < z.size(); ++v)
    if (z[v] >= cut) total += prob[v] = std::exp(z[v] - sorted[0]);
  for (double& x : prob) x /= total;
  return prob;
}

TEST(verify_draft, accepts_with_p_of_the_draft_and_resamples_from_the_rest_chi_square) {
  const std::vector<float> row0{1.0f, 0.4f, 0.9f, -0.5f, 0.2f, -2.0f};
  const std::vector<float> row1{0.3f, 1.2f, -0.4f, 0.8f, 0.0f, 0.5f};
  const token_id draft = 1;
  sampling_params params;
  params.temperature = 0.7f;
  params.top_k = 4;
  params.logit_bias = {{2, 0.5f}};
  params.presence_penalty = 0.8f;
  const std::vector<double> p0 = target_distribution(row0, params, {});
  // The token after an accepted draft: the penalty already counts the draft (it is in the history).
  const std::vector<double> p1 = target_distribution(row1, params, {draft});
  ASSERT_GT(p0[draft], 0.1);
  ASSERT_LT(p0[draft], 0.9);

  constexpr int draws = 60000;
  std::vector<int64_t> first(6, 0), after_reject(6, 0), after_accept(6, 0);
  int64_t accepted = 0;
  for (int i = 0; i < draws; ++i) {
    params.seed = 1000 + static_cast<uint64_t>(i);
    sampler s(params, 0, {});
    std::vector<token_id> got;
    const int32_t n = verify_draft(
        s, std::vector<token_id>{draft},
        [&](int32_t r) {
          return verify_row{r == 0 ? row0 : row1, {}};
        },
        [&](const sample_result& res, bool from_draft) {
          EXPECT_EQ(from_draft, got.empty() && res.token == draft);
          got.push_back(res.token);
          return true;
        });
    ASSERT_EQ(got.size(), static_cast<size_t>(n + 1));
    ++first[static_cast<size_t>(got[0])];
    if (n == 1) {
      ++accepted;
      ++after_accept[static_cast<size_t>(got[1])];
    } else {
      ASSERT_NE(got[0], draft);
      ++after_reject[static_cast<size_t>(got[0])];
    }
  }
  // The first token has the target's distribution (acceptance included: P(accept) = p0(draft)).
  const auto c0 = chi_square(first, p0);
  EXPECT_GT(c0.p_value, 0.01) << "chi2 " << c0.statistic << " dof " << c0.degrees_of_freedom;
  EXPECT_NEAR(static_cast<double>(accepted) / draws, p0[draft], 4 * std::sqrt(p0[draft] * (1 - p0[draft]) / draws));
  // A rejection draws from p0 without the draft, renormalised.
  std::vector<double> residual = p0;
  residual[draft] = 0;
  for (double& x : residual) x /= 1 - p0[draft];
  const auto cr = chi_square(after_reject, residual);
  EXPECT_GT(cr.p_value, 0.01) << "chi2 " << cr.statistic << " dof " << cr.degrees_of_freedom;
  // After an accepted draft the bonus token follows the target given the draft.
  const auto c1 = chi_square(after_accept, p1);
  EXPECT_GT(c1.p_value, 0.01) << "chi2 " << c1.statistic << " dof " << c1.degrees_of_freedom;
}

TEST(verify_sampled_draft, accepts_with_min_1_p_over_q_and_resamples_the_residual_chi_square) {
  // Leviathan et al.'s rule, directly: d ~ q0 (drawn here with a generator of the test's own), accepted
  // with min(1, p0(d) / q0(d)), else a token from max(0, p0 - q0) normalised; after an accepted draft the
  // bonus token comes from p1. p is the sampler's (bias, penalty, temperature, top-k), q any other
  // distribution: here one that puts mass where p has none (token 5, cut by top-k) and too little on
  // the target's favourite.
  const std::vector<float> row0{1.0f, 0.4f, 0.9f, -0.5f, 0.2f, -2.0f};
  const std::vector<float> row1{0.3f, 1.2f, -0.4f, 0.8f, 0.0f, 0.5f};
  const std::vector<float> q0{0.05f, 0.4f, 0.1f, 0.2f, 0.05f, 0.2f};
  sampling_params params;
  params.temperature = 0.7f;
  params.top_k = 4;
  params.logit_bias = {{2, 0.5f}};
  params.presence_penalty = 0.8f;
  const std::vector<double> p0 = target_distribution(row0, params, {});
  std::vector<double> accept(6), residual(6);
  double accept_mass = 0, residual_mass = 0;
  for (size_t x = 0; x < 6; ++x) {
    accept[x] = std::min<double>(p0[x], q0[x]);
    residual[x] = std::max<double>(0, p0[x] - q0[x]);
    accept_mass += accept[x];
    residual_mass += residual[x];
  }
  for (double& r : residual) r /= residual_mass;
  ASSERT_GT(residual_mass, 0.1);

  constexpr int draws = 60000;
  std::mt19937_64 rng(42);
  std::discrete_distribution<int> from_q(q0.begin(), q0.end());
  std::vector<int64_t> first(6, 0), after_reject(6, 0), after_accept(6, 0);
  std::map<token_id, std::vector<int64_t>> bonus;  // per accepted draft: the token after it
  int64_t accepted = 0;
  for (int i = 0; i < draws; ++i) {
    params.seed = 5000 + static_cast<uint64_t>(i);
    sampler s(params, 0, {});
    const token_id d = from_q(rng);
    std::vector<token_id> got;
    const int32_t n = verify_sampled_draft(
        s, std::vector<token_id>{d}, q0,
        [&](int32_t r) {
          return verify_row{r == 0 ? row0 : row1, {}};
        },
        [&](const sample_result& res, bool from_draft) {
          // A rejection never draws d again: it is rejected only where q(d) > p(d), so residual(d) = 0.
          EXPECT_EQ(from_draft, got.empty() && res.token == d);
          got.push_back(res.token);
          return true;
        });
    ASSERT_EQ(got.size(), static_cast<size_t>(n + 1));
    ASSERT_EQ(s.num_generated(), n + 1);  // every committed token is recorded (penalties, positions)
    ++first[static_cast<size_t>(got[0])];
    if (n == 1) {
      ++accepted;
      ASSERT_EQ(got[0], d);
      auto& counts = bonus[d];
      counts.resize(6);
      ++counts[static_cast<size_t>(got[1])];
    } else {
      ++after_reject[static_cast<size_t>(got[0])];
    }
  }
  const auto c0 = chi_square(first, p0);
  EXPECT_GT(c0.p_value, 0.01) << "chi2 " << c0.statistic << " dof " << c0.degrees_of_freedom;
  EXPECT_NEAR(static_cast<double>(accepted) / draws, accept_mass,
              4 * std::sqrt(accept_mass * (1 - accept_mass) / draws));
  const auto cr = chi_square(after_reject, residual);
  EXPECT_GT(cr.p_value, 0.01) << "chi2 " << cr.statistic << " dof " << cr.degrees_of_freedom;
  // The bonus token after an accepted d follows the target given d (the presence penalty counts d).
  for (const auto& [d, counts] : bonus) {
    const auto cb = chi_square(counts, target_distribution(row1, params, {d}));
    EXPECT_GT(cb.p_value, 0.001) << "after draft " << d << ": chi2 " << cb.statistic;
  }
  EXPECT_EQ(bonus.count(5), 0u);  // p0(5) = 0: never accepted, however often q drafts it
}

TEST(verify_sampled_draft, a_draft_from_p_itself_is_always_accepted_and_logprobs_are_reported) {
  const std::vector<float> row0{1.0f, 0.4f, 0.9f, -0.5f};
  const std::vector<float> row1{0.3f, 1.2f, -0.4f, 0.8f};
  sampling_params params;
  params.temperature = 0.9f;
  params.top_p = 0.9f;
  params.logprobs = 2;
  params.seed = 3;
  sampler probe(params, 0, {});
  std::vector<float> p0, q;
  probe.distribution(row0, {}, p0);
  draft_distribution(row0, params, q);  // the draft model's q for the same logits: p exactly
  ASSERT_EQ(q, p0);
  std::vector<float> p1;
  probe.distribution(row1, {}, p1);
  std::vector<float> qq = q;
  qq.insert(qq.end(), p1.begin(), p1.end());
  for (token_id d0 = 0; d0 < 4; ++d0) {
    if (p0[static_cast<size_t>(d0)] == 0.0f) continue;
    sampler s(params, 0, {});
    std::vector<sample_result> got;
    const std::vector<token_id> draft{d0, 1};
    const int32_t n = verify_sampled_draft(
        s, draft, qq,
        [&](int32_t r) {
          return verify_row{r == 0 ? row0 : row1, {}};
        },
        [&](const sample_result& res, bool) {
          got.push_back(res);
          return true;
        });
    // Row 1's q is its p too (no penalty: the same after every d0), and token 1 is its favourite.
    ASSERT_GT(p1[1], 0.0f);
    EXPECT_EQ(n, 2);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[1].token, 1);
    EXPECT_EQ(got[0].token, d0);
    ASSERT_EQ(got[0].top_logprobs.size(), 2u);
    EXPECT_NEAR(got[0].logprob, row0[static_cast<size_t>(d0)] - compute_raw_logprobs(row0, 0).log_normalizer, 1e-5);
  }
}

// `count` distinct tokens drawn from `weights` without replacement, with the test's own generator.
std::vector<token_id> draws_without_replacement(std::vector<float> weights, int count, std::mt19937_64& rng) {
  std::vector<token_id> out;
  for (int i = 0; i < count; ++i) {
    std::discrete_distribution<int> d(weights.begin(), weights.end());
    const auto t = static_cast<token_id>(d(rng));
    out.push_back(t);
    weights[static_cast<size_t>(t)] = 0.0f;
  }
  return out;
}

TEST(verify_sampled_tree, three_draws_without_replacement_per_position_give_the_targets_joint_distribution) {
  // Recursive rejection sampling, directly: per position three candidates drawn from q without
  // replacement (the test's own generator), x_1 on the chain and x_2, x_3 as leaves beside it, at the
  // root from q0 and under chain node 0 from q1: tokens [x1, y1, x2, x3, y2, y3], parents [-1, 0, -1, -1,
  // 0, 0]. The target's row after a branch depends on its tokens, p includes a presence penalty and
  // top-k (which cuts token 5, where both q put mass). The first two tokens committed (a second drawn
  // plainly from the first's row when the walk ended at once, as the next step would) must follow
  // p(t1) p(t2 | t1) exactly, and leaves must be taken at both depths.
  constexpr size_t v = 6;
  const std::vector<float> row0{1.0f, 0.4f, 0.9f, -0.5f, 0.2f, -2.0f};
  const auto row_after = [&](const std::vector<token_id>& branch) {
    std::vector<float> r(v);
    for (size_t x = 0; x < v; ++x) r[x] = 0.35f * static_cast<float>((x * 7 + branch.back() * 3 + branch.size()) % 5);
    return r;
  };
  const std::vector<float> q0{0.05f, 0.35f, 0.1f, 0.2f, 0.05f, 0.25f};
  const std::vector<float> q1{0.3f, 0.05f, 0.25f, 0.1f, 0.2f, 0.1f};
  sampling_params params;
  params.temperature = 0.8f;
  params.top_k = 4;
  params.presence_penalty = 0.6f;
  std::vector<double> expected(v * v, 0.0);
  const std::vector<double> p0 = target_distribution(row0, params, {});
  for (size_t a = 0; a < v; ++a) {
    const std::vector<double> p1 =
        target_distribution(row_after({static_cast<token_id>(a)}), params, {static_cast<token_id>(a)});
    for (size_t b = 0; b < v; ++b) expected[a * v + b] = p0[a] * p1[b];
  }
  std::vector<float> q = q0;
  q.insert(q.end(), q1.begin(), q1.end());
  const std::vector<int32_t> parents{-1, 0, -1, -1, 0, 0};
  constexpr int trials = 60000;
  std::mt19937_64 rng(1);
  std::vector<int64_t> observed(v * v, 0);
  int64_t root_leaves = 0, deep_leaves = 0, chain_both = 0;
  for (int i = 0; i < trials; ++i) {
    const std::vector<token_id> x = draws_without_replacement(q0, 3, rng), y = draws_without_replacement(q1, 3, rng);
    const std::vector<token_id> tokens{x[0], y[0], x[1], x[2], y[1], y[2]};
    params.seed = 900 + static_cast<uint64_t>(i);
    sampler s(params, 0, {});
    std::vector<token_id> got;
    const auto row = [&](int32_t r) {
      std::vector<token_id> branch;
      for (int32_t at = r - 1; at >= 0; at = parents[static_cast<size_t>(at)])
        branch.insert(branch.begin(), tokens[static_cast<size_t>(at)]);
      thread_local std::vector<float> held;
      held = branch.empty() ? row0 : row_after(branch);
      return verify_row{held, {}};
    };
    const std::vector<int32_t> path =
        verify_sampled_tree(s, tokens, parents, q, row, [&](const sample_result& res, bool) {
          got.push_back(res.token);
          return true;
        });
    ASSERT_EQ(got.size(), path.size() + 1);
    ASSERT_EQ(s.num_generated(), static_cast<int32_t>(got.size()));
    for (size_t j = 0; j < path.size(); ++j) ASSERT_EQ(got[j], tokens[static_cast<size_t>(path[j])]);
    if (!path.empty() && path[0] != 0) ++root_leaves;
    if (path.size() >= 2 && path[1] != 1) ++deep_leaves;
    if (path.size() == 2) ++chain_both;
    if (got.size() == 1) got.push_back(s.sample(row_after({got[0]}), {}).token);
    ++observed[static_cast<size_t>(got[0]) * v + static_cast<size_t>(got[1])];
  }
  const auto c = chi_square(observed, expected);
  EXPECT_GT(c.p_value, 0.01) << "chi2 " << c.statistic << " dof " << c.degrees_of_freedom;
  EXPECT_GT(root_leaves, trials / 50);
  EXPECT_GT(deep_leaves, trials / 200);
  EXPECT_GT(chain_both, trials / 200);
}

TEST(verify_sampled_tree, refuses_q_rows_it_lacks_and_children_off_the_chain_and_skips_repeats) {
  // p is (almost) a point mass on token 1, so a draft of 1 is accepted whatever the uniform.
  const std::vector<float> row{0.0f, 10.0f, 0.0f};
  sampling_params params;
  params.temperature = 0.1f;
  params.seed = 1;
  const auto rows = [&](int32_t) { return verify_row{row, {}}; };
  const auto keep = [](const sample_result&, bool) { return true; };
  // A chain of two with one q row: the second position has none.
  sampler a(params, 0, {});
  EXPECT_THROW(verify_sampled_tree(a, std::vector<token_id>{1, 1}, {}, std::vector<float>{0, 1, 0}, rows, keep),
               std::invalid_argument);
  // Root candidates 0 then 1 from q0 = (1/2, 1/2, 0): 0 is rejected (p(0) ~ 0), 1 accepted; node 1 is
  // a leaf beside the chain, and a child of it has no q row of its own.
  const std::vector<float> q{0.5f, 0.5f, 0.0f, 0.0f, 1.0f, 0.0f};
  sampler b(params, 0, {});
  EXPECT_THROW(verify_sampled_tree(b, std::vector<token_id>{0, 1, 1}, std::vector<int32_t>{-1, -1, 1}, q, rows, keep),
               std::invalid_argument);
  // The same tree without the leaf's child: token 1 from the leaf, then the leaf's row.
  sampler c(params, 0, {});
  std::vector<token_id> got;
  EXPECT_EQ(verify_sampled_tree(c, std::vector<token_id>{0, 1}, std::vector<int32_t>{-1, -1}, q, rows,
                                [&](const sample_result& r, bool) {
                                  got.push_back(r.token);
                                  return true;
                                }),
            (std::vector<int32_t>{1}));
  EXPECT_EQ(got, (std::vector<token_id>{1, 1}));
  // A repeated candidate was never a draw without replacement: skipped, so that the 1 after it is
  // still tried with q_2 = q without the first 0 (and accepted), not with q's mass spent.
  sampler d(params, 0, {});
  EXPECT_EQ(verify_sampled_tree(d, std::vector<token_id>{0, 0, 1}, std::vector<int32_t>{-1, -1, -1}, q, rows, keep),
            (std::vector<int32_t>{2}));
}

TEST(verify_draft, greedy_accepts_the_longest_prefix_equal_to_the_argmax_then_the_targets_token) {
  sampling_params params;
  params.temperature = 0;
  // Row j's argmax is 10 + j; the draft guesses 10, 11, then 5 (wrong): 2 accepted, then 12.
  auto row = [](int32_t j) {
    static std::vector<std::vector<float>> rows;
    if (rows.empty())
      for (int r = 0; r < 4; ++r) {
        rows.emplace_back(16, 0.0f);
        rows.back()[static_cast<size_t>(10 + r)] = 3.0f;
      }
    return verify_row{rows[static_cast<size_t>(j)], {}};
  };
  sampler s(params, 0, {});
  std::vector<token_id> got;
  const int32_t n = verify_draft(s, std::vector<token_id>{10, 11, 5}, row, [&](const sample_result& r, bool) {
    got.push_back(r.token);
    return true;
  });
  EXPECT_EQ(n, 2);
  EXPECT_EQ(got, (std::vector<token_id>{10, 11, 12}));
  EXPECT_EQ(s.num_generated(), 3);
  // Every draft token right: all accepted and the last row gives one more.
  sampler all(params, 0, {});
  got.clear();
  EXPECT_EQ(verify_draft(all, std::vector<token_id>{10, 11, 12}, row,
                         [&](const sample_result& r, bool) {
                           got.push_back(r.token);
                           return true;
                         }),
            3);
  EXPECT_EQ(got, (std::vector<token_id>{10, 11, 12, 13}));
  // A stop at the first token ends the verification there.
  sampler stop(params, 0, {});
  got.clear();
  EXPECT_EQ(verify_draft(stop, std::vector<token_id>{10, 11}, row,
                         [&](const sample_result& r, bool) {
                           got.push_back(r.token);
                           return false;
                         }),
            0);
  EXPECT_EQ(got.size(), 1u);
}

TEST(verify_tree, greedy_follows_the_branch_the_targets_argmaxes_take) {
  sampling_params params;
  params.temperature = 0;
  // The tree of a_tree_merges_...: tokens 3 8 1 | 4 9 1 | (under 3) 9 1. Row 0 (the context) picks 3,
  // node 0's row picks 9 (not node 1's 8: node 6's), node 6's row picks 1 (node 7), node 7's row 5.
  const std::vector<token_id> tokens{3, 8, 1, 4, 9, 1, 9, 1};
  const std::vector<int32_t> parents{-1, 0, 1, -1, 3, 4, 0, 6};
  const std::map<int32_t, token_id> argmax{{0, 3}, {1, 9}, {7, 1}, {8, 5}};  // row -> its argmax
  std::vector<std::vector<float>> rows(9, std::vector<float>(16, 0.0f));
  for (int32_t r = 0; r < 9; ++r)
    rows[static_cast<size_t>(r)][static_cast<size_t>(argmax.count(r) ? argmax.at(r) : 15)] = 3.0f;
  std::vector<int32_t> rows_read;
  auto row = [&](int32_t r) {
    rows_read.push_back(r);
    return verify_row{rows[static_cast<size_t>(r)], {}};
  };
  sampler s(params, 0, {});
  std::vector<std::pair<token_id, bool>> got;
  const std::vector<int32_t> path = verify_tree(s, tokens, parents, row, [&](const sample_result& r, bool accepted) {
    got.emplace_back(r.token, accepted);
    return true;
  });
  EXPECT_EQ(path, (std::vector<int32_t>{0, 6, 7}));
  EXPECT_EQ(rows_read, (std::vector<int32_t>{0, 1, 7, 8}));
  EXPECT_EQ(got, (std::vector<std::pair<token_id, bool>>{{3, true}, {9, true}, {1, true}, {5, false}}));
  // A token no child of the root has ends at once; a stop ends the walk where it happens.
  rows[0][3] = 0.0f;
  rows[0][4] = 3.0f;  // -> node 3 (4), whose row picks 15: not its child's 9
  sampler s2(params, 0, {});
  got.clear();
  EXPECT_EQ(verify_tree(s2, tokens, parents, row,
                        [&](const sample_result& r, bool accepted) {
                          got.emplace_back(r.token, accepted);
                          return true;
                        }),
            (std::vector<int32_t>{3}));
  EXPECT_EQ(got, (std::vector<std::pair<token_id, bool>>{{4, true}, {15, false}}));
  sampler s3(params, 0, {});
  got.clear();
  EXPECT_TRUE(verify_tree(s3, tokens, parents, row, [&](const sample_result& r, bool accepted) {
                got.emplace_back(r.token, accepted);
                return false;
              }).empty());
  EXPECT_EQ(got.size(), 1u);
}

// ---- the block manager's rollback -----------------------------------------------------------------

TEST(block_manager_truncate, returns_the_blocks_of_rejected_positions_and_caches_none_of_them) {
  block_manager_options o;
  o.block_size = 4;
  o.num_device_blocks = 16;
  block_manager bm(o);
  std::vector<block_copy> copies;
  const seq_id s{1};
  // 5 computed tokens, then a verification slice of 1 + 6 tokens (positions 5..11): 3 blocks.
  std::vector<token_id> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ASSERT_TRUE(bm.allocate_slots(s, tokens, 0, 5, 0, copies));
  bm.commit_computed(s, std::span(tokens).first(5), 5);
  ASSERT_TRUE(bm.allocate_slots(s, tokens, 5, 7, 0, copies));
  EXPECT_EQ(bm.num_blocks(s), 3);
  // One draft accepted: 7 computed tokens (2 blocks); the third block held only rejected positions.
  bm.commit_computed(s, std::span(tokens).first(7), 7);
  bm.truncate(s, 7);
  EXPECT_EQ(bm.num_blocks(s), 2);
  EXPECT_EQ(bm.num_free_blocks(), 14);
  EXPECT_EQ(bm.check_invariants(), "");
  // Only the full computed block is indexed: the second (positions 4..7, 7 rejected) is not.
  int cached = 0;
  for (const block_info& b : bm.snapshot()) cached += b.cached;
  EXPECT_EQ(cached, 1);
  EXPECT_THROW(bm.truncate(s, 6), std::logic_error);  // below the computed tokens
  bm.free(s);
  EXPECT_EQ(bm.num_free_blocks(), 16);
  EXPECT_EQ(bm.check_invariants(), "");
}

// ---- the engine ----------------------------------------------------------------------------------

constexpr int32_t vocab = 64;

engine_options spec_opts(int32_t blocks, bool speculative, int32_t host = 0) {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = host;
  o.watermark = 0;
  if (speculative) o.speculative = test_support::ngram_speculation(3, 64);
  return o;
}

sampling_params greedy(int32_t max_tokens) { return test_support::greedy_to_length(max_tokens); }

std::vector<token_id> random_prompt(std::mt19937& rng, int32_t len, int32_t v = vocab) {
  std::vector<token_id> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(static_cast<token_id>(rng() % static_cast<uint32_t>(v)));
  return p;
}

struct run_result {
  std::map<request_id, std::map<int32_t, std::vector<token_id>>> tokens;
  std::map<request_id, std::map<int32_t, request_output>> last;
  engine_stats stats;
};

// Runs to the end checking the scheduler's and the block manager's invariants after every step, and
// that every block is free again at the end (nothing leaked by rejected drafts).
run_result run_checked(llm_engine& engine, const sim_executor& exec) {
  run_result r;
  for (int i = 0; i < 100000 && engine.has_unfinished(); ++i) {
    for (const request_output& o : engine.step()) {
      auto& t = r.tokens[o.id][o.index];
      t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
      r.last[o.id][o.index] = o;
    }
    const std::string inv = engine.get_scheduler().check_invariants();
    EXPECT_EQ(inv, "") << "step " << i;
    if (!inv.empty()) break;
  }
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_TRUE(exec.errors().empty()) << exec.errors()[0];
  const block_manager& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  EXPECT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks());
  r.stats = engine.stats();
  return r;
}

template <class Exec>
run_result run_batch(bool speculative, int32_t blocks, int32_t host, preemption_mode mode,
                     const std::vector<std::vector<token_id>>& prompts, const sampling_params& params) {
  Exec exec(4, blocks, host, vocab);
  engine_options o = spec_opts(blocks, speculative, host);
  o.preemption = mode;
  llm_engine engine(exec, nullptr, o);
  for (const auto& p : prompts) engine.add_request(p, params);
  return run_checked(engine, exec);
}

TEST(speculative_engine, greedy_output_is_token_for_token_plain_decoding_batch_1_and_16) {
  std::mt19937 rng(3);
  for (const int batch : {1, 16}) {
    std::vector<std::vector<token_id>> prompts;
    for (int i = 0; i < batch; ++i) prompts.push_back(random_prompt(rng, 5 + i % 7));
    const auto plain = run_batch<markov_executor>(false, 512, 0, preemption_mode::recompute, prompts, greedy(40));
    const auto spec = run_batch<markov_executor>(true, 512, 0, preemption_mode::recompute, prompts, greedy(40));
    EXPECT_EQ(spec.tokens, plain.tokens) << "batch " << batch;
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << "batch " << batch;
    EXPECT_GT(spec.stats.num_spec_verifications, 0u);
    EXPECT_EQ(plain.stats.num_draft_tokens, 0u);
    // Accepted drafts skip steps.
    EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps) << "batch " << batch;
    uint64_t proposed = 0, accepted = 0;
    for (const auto& [id, choices] : spec.last) {
      EXPECT_EQ(choices.at(0).num_generated_tokens, 40);
      proposed += static_cast<uint64_t>(choices.at(0).num_draft_tokens);
      accepted += static_cast<uint64_t>(choices.at(0).num_accepted_draft_tokens);
    }
    EXPECT_EQ(proposed, spec.stats.num_draft_tokens);
    EXPECT_EQ(accepted, spec.stats.num_accepted_draft_tokens);
  }
}

// Token trees (SpecInfer) through the engine, on the second-order Markov target (a row's logits depend
// on its own token and its parent's) with n-gram trees of up to 4 branches matching one token: the
// first branch is often wrong and another right, so tokens are accepted from other branches (and
// computed again by the next step). Greedy and seeded sampled outputs are plain decoding's token for
// token, at batch 1 and 16 and under preemption by swap and by recompute in a tiny pool; the
// simulated cache checks every slot's position on read-back and no block leaks.
// executor_trees false: an executor that does not verify trees (the CUDA executor), which the engine
// then gives chains however many branches are asked for (the simulator reports any tree it gets).
run_result run_trees(bool speculative, int32_t branches, int32_t blocks, int32_t host, preemption_mode mode,
                     const std::vector<std::vector<token_id>>& prompts, const sampling_params& params,
                     bool executor_trees = true) {
  markov2_executor exec(4, blocks, host, 8);  // 8 tokens: the greedy chain soon cycles through pairs
  exec.set_verifies_trees(executor_trees);
  engine_options o = spec_opts(blocks, speculative, host);
  o.preemption = mode;
  o.speculative.ngram = {.min_n = 1, .max_n = 1, .branches = branches};
  llm_engine engine(exec, nullptr, o);
  for (const auto& p : prompts) engine.add_request(p, params);
  run_result r = run_checked(engine, exec);
  if (speculative && branches > 1 && executor_trees) { EXPECT_GT(exec.num_tree_slices(), 0); }
  if (branches == 1 || !executor_trees) { EXPECT_EQ(exec.num_tree_slices(), 0); }
  return r;
}

TEST(speculative_engine, token_trees_give_plain_decodings_tokens_greedy_and_seeded) {
  std::mt19937 rng(11);
  sampling_params seeded = greedy(40);
  seeded.temperature = 0.8f;
  seeded.top_k = 8;
  seeded.seed = 77;
  for (const int batch : {1, 16}) {
    std::vector<std::vector<token_id>> prompts;
    // Prompts of few distinct tokens, repeated: the last token has several earlier occurrences.
    for (int i = 0; i < batch; ++i) prompts.push_back(random_prompt(rng, 24 + i % 7, 8));
    for (const sampling_params& params : {greedy(40), seeded}) {
      const char* what = params.temperature == 0 ? "greedy" : "seeded";
      const auto plain = run_trees(false, 1, 512, 0, preemption_mode::recompute, prompts, params);
      const auto chain = run_trees(true, 1, 512, 0, preemption_mode::recompute, prompts, params);
      const auto tree = run_trees(true, 4, 512, 0, preemption_mode::recompute, prompts, params);
      EXPECT_EQ(chain.tokens, plain.tokens) << what << " batch " << batch;
      EXPECT_EQ(tree.tokens, plain.tokens) << what << " batch " << batch;
      const auto no_trees = run_trees(true, 4, 512, 0, preemption_mode::recompute, prompts, params, false);
      EXPECT_EQ(no_trees.tokens, plain.tokens) << what << " batch " << batch;
      EXPECT_EQ(no_trees.stats.num_tree_branch_tokens, 0u);
      EXPECT_GT(tree.stats.num_tree_branch_tokens, 0u) << what << " batch " << batch;
      EXPECT_EQ(chain.stats.num_tree_branch_tokens, 0u);
      // Other branches accept what the first one missed: more accepted per draft token.
      EXPECT_GT(tree.stats.num_accepted_draft_tokens, chain.stats.num_accepted_draft_tokens)
          << what << " batch " << batch;
      std::printf(
          "  trees, %s, batch %d: accepted %llu of %llu draft tokens (chain: %llu of %llu), %llu from other "
          "branches; steps %llu (chain %llu, plain %llu)\n",
          what, batch, static_cast<unsigned long long>(tree.stats.num_accepted_draft_tokens),
          static_cast<unsigned long long>(tree.stats.num_draft_tokens),
          static_cast<unsigned long long>(chain.stats.num_accepted_draft_tokens),
          static_cast<unsigned long long>(chain.stats.num_draft_tokens),
          static_cast<unsigned long long>(tree.stats.num_tree_branch_tokens),
          static_cast<unsigned long long>(tree.stats.num_steps), static_cast<unsigned long long>(chain.stats.num_steps),
          static_cast<unsigned long long>(plain.stats.num_steps));
    }
  }
}

TEST(speculative_engine, token_trees_are_unchanged_under_preemption_by_a_tiny_kv_pool) {
  std::mt19937 rng(12);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(random_prompt(rng, 20 + i % 5, 8));
  const auto plain = run_trees(false, 1, 512, 0, preemption_mode::recompute, prompts, greedy(30));
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    const auto tree = run_trees(true, 4, 48, 64, mode, prompts, greedy(30));
    EXPECT_EQ(tree.tokens, plain.tokens) << to_string(mode);
    EXPECT_GT(tree.stats.num_preemptions_recompute + tree.stats.num_preemptions_swap, 0u) << to_string(mode);
    EXPECT_GT(tree.stats.num_tree_branch_tokens, 0u) << to_string(mode);
  }
}

TEST(speculative_engine, greedy_output_is_unchanged_under_preemption_by_a_tiny_kv_pool) {
  std::mt19937 rng(8);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(random_prompt(rng, 6 + i % 5));
  const auto plain = run_batch<markov_executor>(false, 512, 0, preemption_mode::recompute, prompts, greedy(30));
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    // 40 blocks of 4 slots for 16 sequences of up to 40 tokens: they cannot all stay resident.
    const auto spec = run_batch<markov_executor>(true, 40, 64, mode, prompts, greedy(30));
    EXPECT_EQ(spec.tokens, plain.tokens) << to_string(mode);
    EXPECT_GT(spec.stats.num_preemptions_recompute + spec.stats.num_preemptions_swap, 0u) << to_string(mode);
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << to_string(mode);
  }
}

TEST(speculative_engine, drafts_and_stall_free_prefill_chunks_share_steps) {
  // A step-time target below any step's time: every step with decodes prefills only min_prefill_tokens
  // (3) next to the decodes and their drafts. Requests arrive one by one while the others decode, in a
  // pool too small for all, so draft verification, prompt chunks and preemption share the steps; the
  // output stays plain decoding's.
  std::mt19937 rng(21);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_prompt(rng, 5 + 9 * i));
  const auto plain = run_batch<markov_executor>(false, 512, 0, preemption_mode::recompute, prompts, greedy(30));
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    markov_executor exec(4, 24, 64, vocab);  // 96 slots for 6 sequences of 35-80 tokens
    engine_options o = spec_opts(24, true, 64);
    o.preemption = mode;
    o.target_step_seconds = 1e-6;
    o.min_prefill_tokens = 3;
    llm_engine engine(exec, nullptr, o);
    std::map<request_id, std::map<int32_t, std::vector<token_id>>> tokens;
    for (const auto& p : prompts) {
      engine.add_request(p, greedy(30));
      for (int i = 0; i < 2; ++i)
        for (const request_output& out : engine.step()) {
          auto& t = tokens[out.id][out.index];
          t.insert(t.end(), out.token_ids.begin(), out.token_ids.end());
        }
    }
    const run_result rest = run_checked(engine, exec);
    for (const auto& [id, choices] : rest.tokens)
      for (const auto& [index, t] : choices) tokens[id][index].insert(tokens[id][index].end(), t.begin(), t.end());
    EXPECT_EQ(tokens, plain.tokens) << to_string(mode);
    EXPECT_GT(rest.stats.num_steps_prefill_limited, 0u) << to_string(mode);
    EXPECT_GT(rest.stats.num_accepted_draft_tokens, 0u) << to_string(mode);
    EXPECT_GT(rest.stats.num_preemptions_recompute + rest.stats.num_preemptions_swap, 0u) << to_string(mode);
  }
}

TEST(speculative_engine, many_rejections_leak_no_block_and_change_no_output) {
  // The history-hash model: drafts are almost always wrong, so nearly every verification rejects and
  // returns the blocks it allocated for the drafts. Prompts repeat themselves so drafts exist.
  std::mt19937 rng(21);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 12; ++i) {
    auto p = random_prompt(rng, 3);
    for (int r = 0; r < 4; ++r) p.insert(p.end(), p.begin(), p.begin() + 3);
    prompts.push_back(p);
  }
  const auto plain = run_batch<sim_executor>(false, 96, 0, preemption_mode::recompute, prompts, greedy(24));
  const auto spec = run_batch<sim_executor>(true, 96, 0, preemption_mode::recompute, prompts, greedy(24));
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.num_draft_tokens, 100u);
  EXPECT_LT(spec.stats.num_accepted_draft_tokens * 4, spec.stats.num_draft_tokens);  // mostly rejected
}

TEST(speculative_engine, parallel_sampling_and_logprobs_match_plain_decoding) {
  // Seeded sampling: the verifier draws position t's token with the uniform plain decoding uses, so
  // on an exact executor the seeded tokens and their logprobs are the same with and without drafts.
  std::mt19937 rng(5);
  std::vector<std::vector<token_id>> prompts{random_prompt(rng, 7), random_prompt(rng, 9)};
  sampling_params params;
  params.temperature = 0.3f;
  params.top_p = 0.9f;
  params.presence_penalty = 0.2f;
  params.seed = 77;
  params.n = 3;
  params.logprobs = 2;
  params.max_tokens = 30;
  params.ignore_eos = true;
  const auto plain = run_batch<markov_executor>(false, 512, 0, preemption_mode::recompute, prompts, params);
  const auto spec = run_batch<markov_executor>(true, 512, 0, preemption_mode::recompute, prompts, params);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
}

TEST(speculative_engine, logprobs_of_accepted_tokens_equal_plain_decodings) {
  std::mt19937 rng(6);
  const std::vector<token_id> prompt = random_prompt(rng, 8);
  sampling_params params = greedy(24);
  params.logprobs = 3;
  std::vector<token_logprob> got[2];
  for (const bool speculative : {false, true}) {
    markov_executor exec(4, 128, 0, vocab);
    llm_engine engine(exec, nullptr, spec_opts(128, speculative));
    engine.add_request(prompt, params);
    while (engine.has_unfinished())
      for (const request_output& o : engine.step())
        got[speculative ? 1 : 0].insert(got[speculative ? 1 : 0].end(), o.logprobs.begin(), o.logprobs.end());
    if (speculative) { EXPECT_GT(engine.stats().num_accepted_draft_tokens, 0u); }
  }
  ASSERT_EQ(got[0].size(), 24u);
  ASSERT_EQ(got[1].size(), 24u);
  for (size_t i = 0; i < 24; ++i) {
    EXPECT_EQ(got[1][i].token, got[0][i].token) << i;
    EXPECT_EQ(got[1][i].logprob, got[0][i].logprob) << i;
    EXPECT_EQ(got[1][i].top, got[0][i].top) << i;
  }
}

TEST(speculative_engine, off_per_request_and_above_the_batch_threshold) {
  std::mt19937 rng(9);
  const auto prompt = random_prompt(rng, 6);
  {  // "speculative": false
    markov_executor exec(4, 128, 0, vocab);
    llm_engine engine(exec, nullptr, spec_opts(128, true));
    sampling_params p = greedy(20);
    p.speculative = false;
    engine.add_request(prompt, p);
    run_checked(engine, exec);
    EXPECT_EQ(engine.stats().num_draft_tokens, 0u);
  }
  // Draft tokens verified for `num_seqs` equal requests decoding together under a threshold of 4.
  const auto drafts_with = [&](int num_seqs) {
    markov_executor exec(4, 256, 0, vocab);
    engine_options o = spec_opts(256, true);
    o.speculative.max_batch = 4;
    llm_engine engine(exec, nullptr, o);
    for (int i = 0; i < num_seqs; ++i) engine.add_request(prompt, greedy(20));
    run_checked(engine, exec);
    return engine.stats().num_draft_tokens;
  };
  EXPECT_EQ(drafts_with(5), 0u);  // 5 decoding sequences: no step speculates (they finish together)
  EXPECT_GT(drafts_with(4), 0u);
}

TEST(speculative_engine, structured_output_masks_every_draft_row_and_matches_plain_decoding) {
  // A scripted grammar that at output position k allows the tokens t with (t + k) % 4 != 0 (every
  // fourth is refused, which one changing with k), complete after 36 tokens. Drafts that run into a
  // refused token are cut there; the others are verified under masks computed with the grammar
  // advanced over the drafts before them. Greedy and seeded sampled outputs must be plain decoding's.
  test_support::token_script script(36);
  for (size_t k = 0; k < script.size(); ++k)
    for (token_id t = 1; t < vocab; ++t)
      if ((static_cast<size_t>(t) + k) % 4 != 0) script[k].push_back(t);
  const auto grammar = std::make_shared<test_support::scripted_compiled>(script, 0);
  std::mt19937 rng(12);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_prompt(rng, 5 + i));
  structured_output_spec spec;
  spec.type = structured_output_spec::kind::regex;
  spec.source = "scripted";
  for (const float temperature : {0.0f, 0.5f}) {
    sampling_params params = greedy(48);
    params.ignore_eos = false;
    params.temperature = temperature;
    params.seed = 3;
    params.structured = spec;
    // 0: plain; 1: chains; 2: an executor that verifies token trees and trees of 4 branches asked
    // for, which a constrained request reduces to their first branch (the grammar walks one chain).
    run_result r[3];
    for (const int run : {0, 1, 2}) {
      markov_executor exec(4, 512, 0, vocab);
      exec.set_verifies_trees(run == 2);
      engine_options o = spec_opts(512, run > 0);
      o.speculative.ngram.branches = run == 2 ? 4 : 1;
      o.constraints = std::make_shared<test_support::scripted_backend>(
          [&](const structured_output_spec&) { return compile_result{grammar}; });
      llm_engine engine(exec, nullptr, o);
      for (const auto& p : prompts) engine.add_request(p, params, 0, grammar);
      r[run] = run_checked(engine, exec);
      EXPECT_EQ(exec.num_tree_slices(), 0) << "a constrained request verified a tree";
    }
    EXPECT_EQ(r[1].tokens, r[0].tokens) << "temperature " << temperature;
    EXPECT_EQ(r[2].tokens, r[0].tokens) << "temperature " << temperature;
    for (const auto& [id, choices] : r[1].tokens) {
      const std::vector<token_id>& t = choices.at(0);
      ASSERT_EQ(t.size(), script.size()) << "the grammar completes after 36 tokens";
      for (size_t k = 0; k < t.size(); ++k) EXPECT_NE((static_cast<size_t>(t[k]) + k) % 4, 0u) << k;
    }
    EXPECT_GT(r[1].stats.num_accepted_draft_tokens, 0u) << "temperature " << temperature;
  }
}

TEST(speculative_engine, drafts_respect_max_tokens_and_the_token_budget) {
  std::mt19937 rng(10);
  markov_executor exec(4, 256, 0, vocab);
  engine_options o = spec_opts(256, true);
  o.max_num_batched_tokens = 6;  // two sequences of 1 + 4 tokens do not both fit
  llm_engine engine(exec, nullptr, o);
  const auto a = engine.add_request(random_prompt(rng, 4), greedy(13));
  const auto b = engine.add_request(random_prompt(rng, 4), greedy(7));
  int32_t most = 0;
  run_result r;
  std::map<request_id, int32_t> drafted, accepted;  // as the step records' running rows report them
  while (engine.has_unfinished()) {
    for (const request_output& out : engine.step()) {
      auto& t = r.tokens[out.id][out.index];
      t.insert(t.end(), out.token_ids.begin(), out.token_ids.end());
    }
    most = std::max(most, engine.last_record().num_prefill_tokens + engine.last_record().num_decode_tokens);
    EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
    for (const sequence_blocks& row : engine.last_record().running) {
      EXPECT_GE(row.num_draft_tokens, drafted[row.request]);  // totals so far: they only grow
      EXPECT_LE(row.num_accepted_draft_tokens, row.num_draft_tokens);
      drafted[row.request] = row.num_draft_tokens;
      accepted[row.request] = row.num_accepted_draft_tokens;
      EXPECT_FALSE(row.constrained);
    }
  }
  EXPECT_GT(accepted[a] + accepted[b], 0);  // the dashboard sees the drafts being accepted
  EXPECT_LE(most, 6);
  EXPECT_EQ(r.tokens[a][0].size(), 13u);  // never past max_tokens, though drafts could run on
  EXPECT_EQ(r.tokens[b][0].size(), 7u);
  EXPECT_GT(engine.stats().num_accepted_draft_tokens, 0u);
}

// Runs `total` requests of `prompt` with `params` (seeds 0, 1, ...; 250 at a time) and counts each
// output (params.max_tokens tokens of a vocabulary of `vocab`) as a cell of their joint distribution:
// token j is digit j, most significant first, in base vocab.
std::vector<int64_t> joint_counts(llm_engine& engine, const std::vector<token_id>& prompt, sampling_params params,
                                  int total, int32_t vocab) {
  size_t cells = 1;
  for (int32_t j = 0; j < params.max_tokens; ++j) cells *= static_cast<size_t>(vocab);
  std::vector<int64_t> observed(cells, 0);
  for (int wave = 0; wave < total / 250; ++wave) {
    std::map<request_id, std::vector<token_id>> out;
    for (int i = 0; i < 250; ++i) {
      params.seed = static_cast<uint64_t>(wave * 250 + i);
      out[engine.add_request(prompt, params)];
    }
    while (engine.has_unfinished())
      for (const request_output& r : engine.step())
        out[r.id].insert(out[r.id].end(), r.token_ids.begin(), r.token_ids.end());
    for (const auto& [id, t] : out) {
      EXPECT_EQ(t.size(), static_cast<size_t>(params.max_tokens));
      size_t cell = 0;
      for (token_id x : t) cell = cell * static_cast<size_t>(vocab) + static_cast<size_t>(x);
      if (cell < cells) ++observed[cell];
    }
  }
  return observed;
}

TEST(speculative_engine, sampled_tokens_follow_the_targets_joint_distribution_chi_square) {
  // A 4-token vocabulary and the history-hash model, whose next-token distributions are computable
  // exactly: every request samples 3 tokens, the second step verifying a 1-token n-gram draft (the
  // prompt repeats, so a draft always exists). The empirical joint distribution of (t1, t2, t3) over
  // 60000 seeded requests must be the target's, p(t1) p(t2 | t1) p(t3 | t1 t2).
  constexpr int32_t v = 4;
  const std::vector<token_id> prompt{0, 1, 2, 3, 0, 1, 2, 3};
  sampling_params params;
  params.temperature = 1.0f;
  params.max_tokens = 3;
  params.ignore_eos = true;
  auto probs = [&](std::vector<token_id> history) {
    const std::vector<float> l = fake_logits(history, v);
    const float mx = *std::max_element(l.begin(), l.end());
    std::vector<double> p(v);
    double total = 0;
    for (int32_t t = 0; t < v; ++t)
      total += p[static_cast<size_t>(t)] = std::exp(double(l[static_cast<size_t>(t)]) - mx);
    for (double& x : p) x /= total;
    return p;
  };
  std::vector<double> expected(64, 0.0);
  for (int32_t a = 0; a < v; ++a) {
    std::vector<token_id> h = prompt;
    const double pa = probs(h)[static_cast<size_t>(a)];
    h.push_back(a);
    const auto pb_all = probs(h);
    for (int32_t b = 0; b < v; ++b) {
      std::vector<token_id> h2 = h;
      h2.push_back(b);
      const auto pc_all = probs(h2);
      for (int32_t c = 0; c < v; ++c)
        expected[static_cast<size_t>(a * 16 + b * 4 + c)] =
            pa * pb_all[static_cast<size_t>(b)] * pc_all[static_cast<size_t>(c)];
    }
  }
  sim_executor exec(4, 2048, 0, v);
  engine_options o = spec_opts(2048, true);
  o.speculative.num_tokens = 2;
  o.speculative.max_batch = 256;
  llm_engine engine(exec, nullptr, o);
  constexpr int total = 60000;
  const std::vector<int64_t> observed = joint_counts(engine, prompt, params, total, v);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  const engine_stats s = engine.stats();
  EXPECT_EQ(s.num_draft_tokens, static_cast<uint64_t>(total));  // one draft per request
  EXPECT_GT(s.num_accepted_draft_tokens, static_cast<uint64_t>(total / 20));
  EXPECT_LT(s.num_accepted_draft_tokens, static_cast<uint64_t>(total - total / 20));
  const auto c = chi_square(observed, expected);
  EXPECT_GT(c.p_value, 0.01) << "chi2 " << c.statistic << " dof " << c.degrees_of_freedom;
  const block_manager& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

// The draft model draws its drafts from its own q (a first-order Markov model: far from the
// history-hash target) under the request's temperature and top-k; the verifier accepts with
// min(1, p/q) and resamples the residual, p including the presence penalty that q leaves out. Every
// request samples 4 tokens (drafts of up to 3 after the first); the empirical joint distribution of
// (t1, t2, t3, t4) over 60000 seeded requests must be the target's, p(t1) p(t2 | t1) ... exactly.
// With `branches` > 1 every position offers that many draws from q without replacement, verified as a
// token tree (recursive rejection sampling) by a target that verifies trees.
engine_stats expect_sampled_draft_model_joint_distribution(int32_t branches) {
  constexpr int32_t v = 4;
  const std::vector<token_id> prompt{0, 1, 2, 3, 0, 1, 2, 3};
  sampling_params params;
  params.temperature = 0.9f;
  params.top_k = 3;
  params.presence_penalty = 0.4f;
  params.max_tokens = 4;
  params.ignore_eos = true;
  std::vector<double> expected(256, 0.0);
  for (int32_t cell = 0; cell < 256; ++cell) {
    std::vector<token_id> history = prompt, out;
    double prob = 1;
    for (int32_t j = 0; j < 4; ++j) {
      const token_id t = (cell >> (2 * (3 - j))) & 3;
      prob *= target_distribution(fake_logits(history, v), params, out)[static_cast<size_t>(t)];
      history.push_back(t);
      out.push_back(t);
    }
    expected[static_cast<size_t>(cell)] = prob;
  }
  sim_executor exec(4, 2048, 0, v);
  exec.set_verifies_trees(branches > 1);
  engine_options o = spec_opts(2048, false);
  o.speculative.mode = speculative_mode::draft;
  o.speculative.num_tokens = 3;
  o.speculative.max_batch = 256;
  o.speculative.draft.branches = branches;
  o.speculative.draft_executor = std::make_shared<markov_executor>(4, 2048, 0, v);
  llm_engine engine(exec, nullptr, o);
  constexpr int total = 60000;
  const std::vector<int64_t> observed = joint_counts(engine, prompt, params, total, v);
  EXPECT_TRUE(exec.errors().empty()) << exec.errors()[0];
  const engine_stats s = engine.stats();
  EXPECT_GE(s.num_draft_tokens, static_cast<uint64_t>(total));
  EXPECT_GT(s.num_accepted_draft_tokens, s.num_draft_tokens / 10);
  EXPECT_LT(s.num_accepted_draft_tokens, s.num_draft_tokens - s.num_draft_tokens / 10);
  const auto c = chi_square(observed, expected);
  EXPECT_GT(c.p_value, 0.01) << "chi2 " << c.statistic << " dof " << c.degrees_of_freedom;
  const block_manager& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  const draft_pool_usage pool = engine.proposer()->pool_usage();
  EXPECT_EQ(pool.num_free_blocks, pool.num_blocks);
  EXPECT_EQ(exec.num_tree_slices() > 0, branches > 1);
  return s;
}

TEST(speculative_engine, sampled_drafts_of_a_draft_model_give_the_targets_joint_distribution_chi_square) {
  EXPECT_EQ(expect_sampled_draft_model_joint_distribution(1).num_tree_branch_tokens, 0u);
}

TEST(speculative_engine, trees_of_sampled_drafts_give_the_targets_joint_distribution_and_accept_more) {
  // q's top-k of 3 leaves 3 tokens to draw: three draws per position exhaust it (the verifier's last
  // candidate then has q_3 = its point mass). Tokens come from side branches, and more drafts are
  // accepted per verification than with a chain of the same q.
  const engine_stats chain = expect_sampled_draft_model_joint_distribution(1);
  const engine_stats tree = expect_sampled_draft_model_joint_distribution(3);
  EXPECT_GT(tree.num_tree_branch_tokens, 0u);
  const auto per_verification = [](const engine_stats& s) {
    return static_cast<double>(s.num_accepted_draft_tokens) / static_cast<double>(s.num_spec_verifications);
  };
  EXPECT_GT(per_verification(tree), per_verification(chain));
}

}  // namespace
}  // namespace tessera
