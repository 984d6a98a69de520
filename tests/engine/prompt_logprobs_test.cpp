// Prompt logprobs (sampling_params::prompt_logprobs) through the real step loop on the simulated
// executor, whose logits are a function of the token history as read back from its KV cache
// (tests/engine/sim_executor.hpp): every prompt position's logprob, rank and top tokens equal the
// oracle's, computed here from the prompt alone (a log-softmax in double of the fake model's logits
// after each prefix), when the prompt is prefilled in chunks, batched with other requests, preempted
// and recomputed (each prompt row scored once), or already in the prefix cache (not taken); the
// generation itself is unchanged, max_tokens 0 generates nothing, and an executor that cannot score or
// drops its rows is refused or fails the request by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/prompt_logprobs.hpp"
#include "engine/sim_executor.hpp"
#include "tests/support/greedy_params.hpp"
#include "tests/support/random_prompt.hpp"

namespace tessera {
namespace {

using testing::fake_logits;
using testing::sim_executor;

constexpr int32_t vocab = 64;

// Ids in [1, vocab) (tests/support/random_prompt.hpp).
std::vector<token_id> random_prompt(std::mt19937& rng, int32_t len) {
  return test_support::random_prompt(rng, vocab, len);
}

struct expected_position {
  double logprob = 0;
  int32_t rank = 0;
  std::vector<token_id> top;  // most likely first, ties by the lower id
};

// The fake model's logprob of each prompt token after the tokens before it (position 0: none).
std::vector<expected_position> oracle(const std::vector<token_id>& prompt, int32_t top_k) {
  std::vector<expected_position> out(prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<float> l = fake_logits(std::span(prompt).first(i), vocab);
    double mx = -1e30, sum = 0;
    for (float v : l) mx = std::max(mx, double(v));
    for (float v : l) sum += std::exp(double(v) - mx);
    const float t = l[static_cast<size_t>(prompt[i])];
    out[i].logprob = double(t) - (mx + std::log(sum));
    out[i].rank = 1 + static_cast<int32_t>(std::count_if(l.begin(), l.end(), [&](float v) { return v > t; }));
    std::vector<token_id> ids(l.size());
    for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<token_id>(k);
    std::stable_sort(ids.begin(), ids.end(), [&](token_id a, token_id b) { return l[size_t(a)] > l[size_t(b)]; });
    out[i].top.assign(ids.begin(), ids.begin() + top_k);
  }
  return out;
}

void expect_matches_oracle(const std::vector<prompt_logprob>& got, const std::vector<token_id>& prompt, int32_t top_k) {
  const std::vector<expected_position> want = oracle(prompt, top_k);
  ASSERT_EQ(got.size(), prompt.size());
  EXPECT_FALSE(got[0].has_logprob()) << "the first prompt token has no logprob";
  EXPECT_EQ(got[0].token, prompt[0]);
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_EQ(got[i].token, prompt[i]) << "position " << i;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-5) << "position " << i;
    EXPECT_EQ(got[i].rank, want[i].rank) << "position " << i;
    ASSERT_EQ(got[i].top.size(), static_cast<size_t>(top_k)) << "position " << i;
    for (int32_t k = 0; k < top_k; ++k) EXPECT_EQ(got[i].top[size_t(k)].first, want[i].top[size_t(k)]) << i << "/" << k;
  }
}

engine_options opts(int32_t blocks, int32_t budget = 2048) {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = 0;
  o.watermark = 0;
  o.max_num_batched_tokens = budget;
  return o;
}

std::map<request_id, std::vector<request_output>> run_to_end(llm_engine& engine,
                                                             std::vector<engine_event>* events = nullptr) {
  std::map<request_id, std::vector<request_output>> all;
  for (int i = 0; i < 10000 && engine.has_unfinished(); ++i) {
    for (const request_output& o : engine.step()) all[o.id].push_back(o);
    if (events) events->insert(events->end(), engine.last_record().events.begin(), engine.last_record().events.end());
  }
  return all;
}

sampling_params scoring(int32_t max_tokens, int32_t top_k) {
  sampling_params p = test_support::greedy_to_length(max_tokens);
  p.prompt_logprobs = top_k;
  return p;
}

std::vector<token_id> tokens_of(const std::vector<request_output>& outs, int32_t index = 0) {
  std::vector<token_id> t;
  for (const request_output& o : outs)
    if (o.index == index) t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
  return t;
}

// The prompt logprobs of choice `index`: exactly one of its outputs has them, the one with its first token.
const std::vector<prompt_logprob>& prompt_logprobs_of(const std::vector<request_output>& outs, int32_t index = 0) {
  static const std::vector<prompt_logprob> none;
  const std::vector<prompt_logprob>* found = &none;
  int32_t carriers = 0;
  bool before_first_token = true;
  for (const request_output& o : outs) {
    if (o.index != index) continue;
    if (!o.prompt_logprobs.empty()) {
      ++carriers;
      found = &o.prompt_logprobs;
      EXPECT_TRUE(before_first_token) << "the prompt logprobs come with the first token, not later";
    }
    if (!o.token_ids.empty()) before_first_token = false;
  }
  EXPECT_EQ(carriers, 1) << "choice " << index;
  return *found;
}

TEST(prompt_logprobs, match_the_oracle_over_chunked_prefill_and_leave_the_generation_unchanged) {
  std::mt19937 rng(7);
  const std::vector<token_id> prompt = random_prompt(rng, 33);
  std::vector<token_id> plain;
  {
    sim_executor exec(4, 64, 0, vocab);
    llm_engine engine(exec, nullptr, opts(64));
    const request_id id = engine.add_request(prompt, test_support::greedy_to_length(6));
    plain = tokens_of(run_to_end(engine)[id]);
  }
  for (const int32_t budget : {2048, 5, 1}) {  // one chunk; chunks of 5; one token a step
    for (const int32_t top_k : {0, 3}) {
      sim_executor exec(4, 64, 0, vocab);
      llm_engine engine(exec, nullptr, opts(64, budget));
      const request_id id = engine.add_request(prompt, scoring(6, top_k));
      auto all = run_to_end(engine);
      ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
      expect_matches_oracle(prompt_logprobs_of(all[id]), prompt, top_k);
      EXPECT_EQ(tokens_of(all[id]), plain) << "budget " << budget;
      // Every prompt row but the last (which samples) was scored exactly once.
      for (int32_t p = 0; p + 1 < 33; ++p) EXPECT_EQ(exec.scored_rows().count({seq_id{1}, p}), 1u) << p;
      EXPECT_EQ(exec.scored_rows().size(), 32u);
      const auto& bm = engine.get_scheduler().blocks();
      EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
    }
  }
}

// An executor that records whether a step scored prompt rows next to another sequence's slice.
struct recording_executor : sim_executor {
  using sim_executor::sim_executor;
  int32_t steps_with_both = 0;
  void execute(const step_batch& batch, step_output& out) override {
    bool scored = false, other = false;
    for (const sequence_slice& s : batch.seqs) (s.prompt_targets.empty() ? other : scored) = true;
    steps_with_both += scored && other;
    sim_executor::execute(batch, out);
  }
};

TEST(prompt_logprobs, batched_with_other_requests_each_gets_its_own) {
  std::mt19937 rng(11);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(rng, 9 + 6 * i));
  std::map<size_t, std::vector<token_id>> alone;
  {
    sim_executor exec(4, 128, 0, vocab);
    llm_engine engine(exec, nullptr, opts(128, 16));
    std::map<request_id, size_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i)
      ids[engine.add_request(prompts[i], test_support::greedy_to_length(8))] = i;
    for (auto& [id, outs] : run_to_end(engine)) alone[ids[id]] = tokens_of(outs);
  }
  recording_executor exec(4, 128, 0, vocab);
  llm_engine engine(exec, nullptr, opts(128, 16));
  std::map<request_id, size_t> ids;
  // Requests 0 and 2 ask for prompt logprobs (with different top-k), 1 and 3 do not.
  for (size_t i = 0; i < prompts.size(); ++i) {
    const sampling_params p = i % 2 == 0 ? scoring(8, static_cast<int32_t>(i)) : test_support::greedy_to_length(8);
    ids[engine.add_request(prompts[i], p)] = i;
  }
  auto all = run_to_end(engine);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  EXPECT_GT(exec.steps_with_both, 0) << "never batched: the test does not test what it says";
  for (auto& [id, i] : ids) {
    EXPECT_EQ(tokens_of(all[id]), alone[i]) << "request " << i;
    if (i % 2 == 0) {
      expect_matches_oracle(prompt_logprobs_of(all[id]), prompts[i], static_cast<int32_t>(i));
    } else {
      for (const request_output& o : all[id]) EXPECT_TRUE(o.prompt_logprobs.empty());
    }
  }
}

TEST(prompt_logprobs, preempted_by_recompute_mid_prompt_scores_each_row_once) {
  // 6 blocks of 4: the scoring request (20 + 4 tokens) and a more important generation (16 + 8) cannot
  // both fit, and chunks of 4 let both run at once: the scoring request is the victim, mid-prompt.
  sim_executor exec(4, 6, 0, vocab);
  engine_options o = opts(6, 8);
  o.long_prefill_token_threshold = 4;
  o.preemption = preemption_mode::recompute;
  llm_engine engine(exec, nullptr, o);
  std::mt19937 rng(3);
  const std::vector<token_id> prompt = random_prompt(rng, 20);
  const request_id id = engine.add_request(prompt, scoring(4, 2), /*priority=*/1);
  std::map<request_id, std::vector<request_output>> all;
  for (int i = 0; i < 2; ++i)
    for (const request_output& out : engine.step()) all[out.id].push_back(out);
  const request_id gen = engine.add_request(random_prompt(rng, 16), test_support::greedy_to_length(8), 0);
  std::vector<engine_event> events;
  for (auto& [rid, outs] : run_to_end(engine, &events)) all[rid].insert(all[rid].end(), outs.begin(), outs.end());
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  int32_t preemptions = 0;
  for (const engine_event& e : events) preemptions += e.kind == event_kind::preempted_recompute && e.request == id;
  ASSERT_GT(preemptions, 0) << "never preempted: the test does not test what it says";
  expect_matches_oracle(prompt_logprobs_of(all[id]), prompt, 2);
  // The recomputation re-ran the prompt's K/V but asked for no row already scored.
  for (const auto& [key, count] : exec.scored_rows()) EXPECT_EQ(count, 1) << "row " << key.second << " scored twice";
  EXPECT_EQ(exec.scored_rows().size(), prompt.size() - 1);
  std::vector<token_id> alone;
  {
    sim_executor e2(4, 64, 0, vocab);
    llm_engine other(e2, nullptr, opts(64));
    const request_id a = other.add_request(prompt, test_support::greedy_to_length(4));
    alone = tokens_of(run_to_end(other)[a]);
  }
  EXPECT_EQ(tokens_of(all[id]), alone);
  EXPECT_TRUE(all[gen].back().finished);
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(prompt_logprobs, preempted_after_its_first_token_does_not_send_them_again) {
  // The same squeeze, the victim preempted while it generates: its recomputation covers prompt and
  // generated tokens, and the prompt logprobs went out once, with the first token.
  sim_executor exec(4, 6, 0, vocab);
  engine_options o = opts(6, 64);
  o.preemption = preemption_mode::recompute;
  llm_engine engine(exec, nullptr, o);
  std::mt19937 rng(21);
  const std::vector<token_id> prompt = random_prompt(rng, 10);
  const request_id id = engine.add_request(prompt, scoring(12, 1), /*priority=*/1);
  std::map<request_id, std::vector<request_output>> all;
  for (int i = 0; i < 3; ++i)
    for (const request_output& out : engine.step()) all[out.id].push_back(out);
  ASSERT_FALSE(tokens_of(all[id]).empty());
  engine.add_request(random_prompt(rng, 12), test_support::greedy_to_length(8), 0);
  std::vector<engine_event> events;
  for (auto& [rid, outs] : run_to_end(engine, &events)) all[rid].insert(all[rid].end(), outs.begin(), outs.end());
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  int32_t preemptions = 0;
  for (const engine_event& e : events) preemptions += e.kind == event_kind::preempted_recompute && e.request == id;
  ASSERT_GT(preemptions, 0) << "never preempted: the test does not test what it says";
  expect_matches_oracle(prompt_logprobs_of(all[id]), prompt, 1);  // exactly one carrier
  EXPECT_EQ(tokens_of(all[id]).size(), 12u);
}

TEST(prompt_logprobs, take_no_cached_prefix_but_leave_theirs_to_later_generations) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, nullptr, opts(64));
  std::mt19937 rng(5);
  const std::vector<token_id> prompt = random_prompt(rng, 24);
  engine.add_request(prompt, test_support::greedy_to_length(2));  // fills the cache with 5 full blocks
  run_to_end(engine);
  const int64_t before = exec.num_computed_tokens();
  const request_id id = engine.add_request(prompt, scoring(2, 2));
  auto all = run_to_end(engine);
  EXPECT_EQ(exec.num_computed_tokens() - before, 24 + 1) << "the whole prompt, then one decode";
  EXPECT_EQ(all[id].back().num_cached_prompt_tokens, 0);
  expect_matches_oracle(prompt_logprobs_of(all[id]), prompt, 2);
  const request_id g = engine.add_request(prompt, test_support::greedy_to_length(2));
  all = run_to_end(engine);
  EXPECT_EQ(all[g].back().num_cached_prompt_tokens, 20);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
}

TEST(prompt_logprobs, max_tokens_zero_scores_the_prompt_and_generates_nothing) {
  recording_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, nullptr, opts(64, 7));
  std::mt19937 rng(13);
  const std::vector<token_id> prompt = random_prompt(rng, 30);
  sampling_params p = scoring(0, 2);
  p.n = 2;
  p.truncate_to_context = false;
  const request_id id = engine.add_request(prompt, p);
  auto all = run_to_end(engine);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  ASSERT_EQ(all[id].size(), 2u) << "one final output per choice";
  for (int32_t c = 0; c < 2; ++c) {
    const request_output& o = all[id][static_cast<size_t>(c)];
    EXPECT_EQ(o.index, c);
    EXPECT_TRUE(o.finished);
    EXPECT_EQ(o.reason, finish_reason::length);
    EXPECT_TRUE(o.token_ids.empty());
    EXPECT_EQ(o.num_generated_tokens, 0);
    expect_matches_oracle(o.prompt_logprobs, prompt, 2);
  }
  EXPECT_EQ(exec.num_computed_tokens(), 30);
  EXPECT_EQ(engine.stats().num_generated_tokens, 0u);
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  // A one-token prompt has nothing to score: its only position is null.
  const request_id one = engine.add_request({5}, scoring(0, 1));
  all = run_to_end(engine);
  ASSERT_EQ(all[one].size(), 1u);
  ASSERT_EQ(all[one][0].prompt_logprobs.size(), 1u);
  EXPECT_FALSE(all[one][0].prompt_logprobs[0].has_logprob());
}

TEST(prompt_logprobs, an_executor_that_cannot_or_does_not_score_is_named) {
  sim_executor plain(4, 16, 0, vocab);
  plain.set_scores_prompts(false);
  llm_engine refuses(plain, nullptr, opts(16));
  try {
    refuses.add_request({1, 2, 3}, scoring(2, 0));
    ADD_FAILURE() << "accepted by an executor that does not score prompts";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("sim executor"), std::string::npos) << e.what();
    EXPECT_EQ(e.param(), "prompt_logprobs");
  }
  EXPECT_FALSE(refuses.has_unfinished());
  // One that says it scores but returns no rows from its second step on: the request fails, the other runs.
  sim_executor broken(4, 16, 0, vocab);
  broken.drop_scores_from_step(2);
  llm_engine engine(broken, nullptr, opts(16, 4));
  std::mt19937 rng(1);
  const request_id bad = engine.add_request(random_prompt(rng, 12), scoring(3, 0));
  const request_id good = engine.add_request(random_prompt(rng, 6), test_support::greedy_to_length(3));
  auto all = run_to_end(engine);
  EXPECT_EQ(all[bad].back().reason, finish_reason::error);
  EXPECT_NE(all[bad].back().error.find("no prompt logprobs"), std::string::npos) << all[bad].back().error;
  EXPECT_EQ(tokens_of(all[good]).size(), 3u);
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(prompt_logprobs, scoring_a_row_follows_the_raw_distribution) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {1.0f, 3.0f, nan, 3.0f, -inf, 0.5f};
  // log-softmax over exp(1) + 2 exp(3) + exp(0.5) (NaN and -inf weigh nothing), written out.
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(0.5));
  const prompt_logprob a = score_prompt_row(row, 3, 3);
  EXPECT_NEAR(a.logprob, 3.0 - lse, 1e-6);
  EXPECT_EQ(a.rank, 1) << "a tie does not rank above";
  ASSERT_EQ(a.top.size(), 3u);
  EXPECT_EQ(a.top[0].first, 1);  // ties: the lower id first
  EXPECT_EQ(a.top[1].first, 3);
  EXPECT_EQ(a.top[2].first, 0);
  EXPECT_NEAR(a.top[2].second, 1.0 - lse, 1e-6);
  const prompt_logprob b = score_prompt_row(row, 5, 0);
  EXPECT_EQ(b.rank, 4);
  EXPECT_TRUE(b.top.empty());
  const prompt_logprob c = score_prompt_row(row, 2, 0);  // a NaN logit: -inf, last
  EXPECT_EQ(c.logprob, -inf);
  EXPECT_EQ(c.rank, 5);
  EXPECT_FALSE(score_prompt_row(row, 6, 1).has_logprob()) << "a target outside the row is not scored";
}

TEST(prompt_logprobs, the_collector_skips_known_positions_and_refuses_gaps_and_wrong_tokens) {
  const std::vector<token_id> prompt = {4, 5, 6, 7, 8};
  prompt_logprob_collector c(prompt, 0);
  auto rows = [&](int32_t first, int32_t n) {
    std::vector<prompt_logprob> r;
    for (int32_t p = first; p < first + n; ++p) r.push_back({prompt[size_t(p)], -0.5f * float(p), 1, {}});
    return r;
  };
  EXPECT_EQ(c.next_position(), 1);
  EXPECT_TRUE(c.add(1, rows(1, 2)));
  EXPECT_EQ(c.next_position(), 3);
  EXPECT_FALSE(c.add(4, rows(4, 1))) << "a gap at position 3";
  std::vector<prompt_logprob> wrong = rows(3, 1);
  wrong[0].token = 9;
  EXPECT_FALSE(c.add(3, wrong));
  std::vector<prompt_logprob> again = rows(1, 3);
  again[0].logprob = 42;  // a repeated position is not taken again
  EXPECT_TRUE(c.add(1, again));
  EXPECT_EQ(c.next_position(), 4);
  EXPECT_EQ(c.all()[1].logprob, -0.5f);
  EXPECT_FALSE(c.complete());
  EXPECT_TRUE(c.add(4, rows(4, 1)));
  EXPECT_TRUE(c.complete());
  EXPECT_FALSE(c.add(5, rows(4, 1))) << "past the prompt";
}

}  // namespace
}  // namespace tessera
