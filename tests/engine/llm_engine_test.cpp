// llm_engine on the simulated executor: the step loop, sampling/detokenization/stop handling, n > 1
// forks, aborts, executor failures and observability, with outputs compared to an oracle that
// recomputes the fake model's greedy generation from the true token history.
#include "engine/llm_engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "engine/base/error.hpp"
#include "engine/sim_executor.hpp"
#include "tests/support/char_tokenizer.hpp"
#include "tests/support/random_prompt.hpp"

namespace tessera {
namespace {

using testing::fake_logits;
using testing::ranked_token;
using testing::sim_executor;

constexpr int32_t vocab = test_support::char_vocab;
constexpr token_id eos_id = 0;

using test_support::char_tokenizer;

std::string text_of(const std::vector<token_id>& ids) {
  static const auto tok = char_tokenizer();
  return tok->decode(ids, true);
}

// Greedy continuation of `prompt` under the fake model; choice c starts from the rank-c token.
std::vector<token_id> oracle(std::vector<token_id> history, int32_t max_tokens, bool stop_at_eos, int32_t choice = 0,
                             int32_t max_len = 1 << 30) {
  std::vector<token_id> out;
  while (static_cast<int32_t>(out.size()) < max_tokens && static_cast<int32_t>(history.size()) < max_len) {
    const token_id t = ranked_token(history, vocab, out.empty() ? choice : 0);
    if (stop_at_eos && t == eos_id) break;  // the EOS token ends the output (not included in the text)
    out.push_back(t);
    history.push_back(t);
  }
  return out;
}

// Ids in [1, vocab) (tests/support/random_prompt.hpp).
std::vector<token_id> random_prompt(std::mt19937& rng, int32_t len) {
  return test_support::random_prompt(rng, vocab, len);
}

sampling_params greedy(int32_t max_tokens) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

struct collected {
  std::map<int32_t, std::vector<token_id>> tokens;
  std::map<int32_t, std::string> text;
  std::map<int32_t, finish_reason> reason;
  std::map<int32_t, int> num_final;
  std::map<int32_t, request_output> last;
};

std::map<request_id, collected> run_to_end(llm_engine& engine, int max_steps = 100000) {
  std::map<request_id, collected> all;
  for (int i = 0; i < max_steps && engine.has_unfinished(); ++i) {
    for (const request_output& o : engine.step()) {
      collected& c = all[o.id];
      c.tokens[o.index].insert(c.tokens[o.index].end(), o.token_ids.begin(), o.token_ids.end());
      c.text[o.index] += o.text;
      if (o.finished) {
        c.reason[o.index] = o.reason;
        ++c.num_final[o.index];
      }
      c.last[o.index] = o;
    }
  }
  return all;
}

engine_options opts(int32_t blocks, int32_t host = 0) {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = host;
  o.watermark = 0;
  return o;
}

TEST(llm_engine, greedy_generation_matches_the_oracle) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  std::mt19937 rng(1);
  std::map<request_id, std::vector<token_id>> prompts;
  for (int i = 0; i < 6; ++i) {
    auto p = random_prompt(rng, 3 + i * 5);
    prompts[engine.add_request(p, greedy(12))] = p;
  }
  auto all = run_to_end(engine);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  for (auto& [id, p] : prompts) {
    const auto expected = oracle(p, 12, true);
    EXPECT_EQ(all[id].tokens[0].size() >= expected.size(), true);
    // Tokens include the EOS when it ended the output; the text never does.
    std::vector<token_id> got = all[id].tokens[0];
    if (!got.empty() && got.back() == eos_id) got.pop_back();
    EXPECT_EQ(got, expected) << "request " << id;
    EXPECT_EQ(all[id].text[0], text_of(expected));
    EXPECT_EQ(all[id].num_final[0], 1);
    EXPECT_EQ(all[id].reason[0], expected.size() == 12 ? finish_reason::length : finish_reason::stop);
    EXPECT_EQ(all[id].last[0].num_prompt_tokens, static_cast<int32_t>(p.size()));
  }
  EXPECT_FALSE(engine.has_unfinished());
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

// Sliding window (every layer windowed, here the sim's one layer of 6): the engine frees what no
// window reaches only with free_window_blocks and an executor that reads_only_window; the outputs are
// the same either way (those of the windowed oracle), only the blocks held differ.
TEST(llm_engine, sliding_window_frees_blocks_and_changes_no_output) {
  struct full_reader : sim_executor {
    using sim_executor::sim_executor;
    bool reads_only_window() const override { return false; }  // as an executor that reads whole tables
  };
  std::mt19937 rng(3);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_prompt(rng, 10 + i * 9));
  struct result {
    std::vector<std::vector<token_id>> tokens;
    uint64_t freed = 0;
    int32_t peak_used = 0;
  };
  auto run = [&](bool free_blocks, bool window_reader) {
    std::unique_ptr<sim_executor> exec = window_reader ? std::make_unique<sim_executor>(4, 64, 0, vocab)
                                                       : std::make_unique<full_reader>(4, 64, 0, vocab);
    exec->set_window(6);
    engine_options o = opts(64);
    o.free_window_blocks = free_blocks;
    llm_engine engine(*exec, char_tokenizer(), o);
    std::vector<request_id> ids;
    sampling_params two = greedy(20);
    two.n = 2;
    two.temperature = 0;
    for (size_t i = 0; i < prompts.size(); ++i)
      ids.push_back(engine.add_request(prompts[i], i == 2 ? two : greedy(20)));
    result r;
    std::map<request_id, collected> all;
    while (engine.has_unfinished()) {
      for (const request_output& out : engine.step()) {
        auto& t = all[out.id].tokens[out.index];
        t.insert(t.end(), out.token_ids.begin(), out.token_ids.end());
      }
      r.peak_used = std::max(r.peak_used, engine.last_record().device.num_used);
      EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
      for (const sequence_blocks& b : engine.last_record().running) {
        // Between steps: the blocks of the last 5 positions, at most ceil(5 / 4) + 1.
        if (free_blocks && window_reader) { EXPECT_LE(b.num_blocks, (6 - 1 + 3) / 4 + 1); }
        if (!free_blocks || !window_reader) { EXPECT_EQ(b.num_window_freed, 0); }
      }
    }
    EXPECT_TRUE(exec->errors().empty()) << exec->errors().front();
    for (request_id id : ids)
      for (auto& [index, t] : all[id].tokens) r.tokens.push_back(t);
    r.freed = engine.stats().num_window_freed_blocks;
    const auto& bm = engine.get_scheduler().blocks();
    EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
    return r;
  };
  const result on = run(true, true);
  const result off = run(false, true);
  const result not_window_reader = run(true, false);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.tokens, not_window_reader.tokens);
  EXPECT_GT(on.freed, 20u);
  EXPECT_EQ(off.freed, 0u);
  EXPECT_EQ(not_window_reader.freed, 0u);
  EXPECT_LT(on.peak_used, off.peak_used);
  // The windowed fake model's own greedy continuation, request by request (greedy choices of the
  // n = 2 request both follow it; EOS ends an output and is part of its tokens).
  for (size_t i = 0, k = 0; i < prompts.size(); ++i) {
    std::vector<token_id> history = prompts[i];
    for (int32_t choice = 0; choice < (i == 2 ? 2 : 1); ++choice, ++k) {
      std::vector<token_id> h = history, want;
      while (want.size() < 20) {
        const token_id t = ranked_token(testing::visible_history(h, 6), vocab, 0);
        want.push_back(t);
        if (t == eos_id) break;
        h.push_back(t);
      }
      ASSERT_LT(k, on.tokens.size());
      EXPECT_EQ(on.tokens[k], want) << "prompt " << i << " choice " << choice;
    }
  }
}

TEST(llm_engine, add_request_validates) {
  sim_executor exec(4, 8, 0, vocab);
  engine_options o = opts(8);
  o.max_model_len = 20;
  llm_engine engine(exec, char_tokenizer(), o);
  EXPECT_THROW(engine.add_request({}, greedy(4)), invalid_request);
  EXPECT_THROW(engine.add_request(std::vector<token_id>(21, 5), greedy(4)), invalid_request);
  EXPECT_THROW(engine.add_request({1, 2, vocab}, greedy(4)), invalid_request);
  EXPECT_THROW(engine.add_request({1, -1}, greedy(4)), invalid_request);
  sampling_params bad = greedy(4);
  bad.top_p = 2;
  EXPECT_THROW(engine.add_request({1, 2}, bad), invalid_request);
  EXPECT_FALSE(engine.has_unfinished());
  // Options that do not fit the executor.
  engine_options wrong_bs = opts(8);
  wrong_bs.block_size = 8;
  EXPECT_THROW(llm_engine(exec, nullptr, wrong_bs), invalid_request);
  EXPECT_THROW(llm_engine(exec, nullptr, opts(9)), invalid_request);
}

TEST(llm_engine, stops_at_max_model_len) {
  sim_executor exec(4, 64, 0, vocab);
  engine_options o = opts(64);
  o.max_model_len = 12;
  llm_engine engine(exec, char_tokenizer(), o);
  sampling_params p = greedy(100);
  p.ignore_eos = true;
  const request_id id = engine.add_request({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, p);
  auto all = run_to_end(engine);
  EXPECT_EQ(all[id].tokens[0].size(), 2u);
  EXPECT_EQ(all[id].reason[0], finish_reason::length);
}

TEST(llm_engine, stop_strings_are_held_back_and_cut) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  std::mt19937 rng(3);
  // Find a prompt whose greedy continuation has >= 8 tokens, then stop at the text of tokens 4..5.
  std::vector<token_id> p, expected;
  do {
    p = random_prompt(rng, 6);
    expected = oracle(p, 10, true);
  } while (expected.size() < 8);
  const std::string full = text_of(expected);
  sampling_params params = greedy(10);
  params.stop = {full.substr(4, 2)};
  const request_id id = engine.add_request(p, params);
  auto all = run_to_end(engine);
  EXPECT_EQ(all[id].reason[0], finish_reason::stop);
  EXPECT_EQ(all[id].text[0], full.substr(0, full.find(params.stop[0])));
}

TEST(llm_engine, parallel_sampling_forks_after_prefill_and_shares_the_prompt) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  std::mt19937 rng(5);
  auto p = random_prompt(rng, 10);  // 2.5 blocks: the partial third block is copied on write
  // Greedy choices all follow the argmax path, so every choice must equal the oracle; a missing
  // copy-on-write would still be caught by the simulator (two sequences writing one block).
  sampling_params params = greedy(6);
  params.n = 3;
  params.ignore_eos = true;
  const request_id id = engine.add_request(p, params);
  engine.step();  // prefill + fork
  const step_record& r = engine.last_record();
  int forks = 0;
  for (const auto& e : r.events) forks += e.kind == event_kind::forked;
  EXPECT_EQ(forks, 2);
  EXPECT_EQ(r.device.num_used, 3);  // three sequences, one copy of the prompt
  auto all = run_to_end(engine);
  auto all_first = all[id];
  const auto expected = oracle(p, 6, false);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  for (int32_t c = 0; c < 3; ++c) {
    // The first token came from the first step's outputs, which run_to_end did not see.
    ASSERT_EQ(all_first.tokens[c].size(), 5u) << "choice " << c;
    EXPECT_TRUE(std::equal(all_first.tokens[c].begin(), all_first.tokens[c].end(), expected.begin() + 1));
    EXPECT_EQ(all_first.num_final[c], 1);
  }
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(llm_engine, random_sampling_is_reproducible_with_a_seed_across_batching_and_preemption) {
  // The same seeded request gives the same tokens alone and inside a crowded, preempting engine.
  std::mt19937 rng(11);
  auto p = random_prompt(rng, 9);
  sampling_params params;
  params.temperature = 1.0f;
  params.seed = 1234;
  params.n = 2;
  params.max_tokens = 16;
  params.ignore_eos = true;

  sim_executor alone_exec(4, 64, 0, vocab);
  llm_engine alone(alone_exec, char_tokenizer(), opts(64));
  const request_id a = alone.add_request(p, params);
  auto ref = run_to_end(alone)[a];

  for (preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    sim_executor exec(4, 16, 32, vocab);
    engine_options o = opts(16, 32);
    o.preemption = mode;
    o.max_num_batched_tokens = 8;
    llm_engine crowded(exec, char_tokenizer(), o);
    for (int i = 0; i < 5; ++i) crowded.add_request(random_prompt(rng, 12), greedy(20));
    const request_id b = crowded.add_request(p, params);
    auto all = run_to_end(crowded);
    ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
    EXPECT_GT(crowded.stats().num_preemptions_swap + crowded.stats().num_preemptions_recompute, 0u);
    for (int32_t c = 0; c < 2; ++c) EXPECT_EQ(all[b].tokens[c], ref.tokens[c]) << "choice " << c;
  }
}

TEST(llm_engine, abort_in_every_state_frees_everything) {
  sim_executor exec(4, 12, 8, vocab);
  engine_options o = opts(12, 8);
  o.max_num_batched_tokens = 8;
  o.preemption = preemption_mode::swap;
  llm_engine engine(exec, char_tokenizer(), o);
  std::mt19937 rng(9);
  std::vector<request_id> ids;
  for (int i = 0; i < 6; ++i) {
    sampling_params p = greedy(30);
    p.ignore_eos = true;
    p.n = i % 2 + 1;
    ids.push_back(engine.add_request(random_prompt(rng, 10), p));
  }
  std::map<std::pair<request_id, int32_t>, int> finals;  // per (request, choice)
  std::map<request_id, finish_reason> reasons;
  int step = 0;
  while (engine.has_unfinished()) {
    if (step == 1) engine.abort(ids[5]);  // waiting (budget 8 admits one or two)
    if (step == 3) engine.abort(ids[0]);  // running
    if (step % 4 == 2) {
      // Abort whatever is swapped, if anything.
      for (const sequence* s : engine.get_scheduler().swapped()) {
        engine.abort(s->request);
        break;
      }
    }
    for (const auto& out : engine.step())
      if (out.finished) {
        ++finals[{out.id, out.index}];
        reasons[out.id] = out.reason;
      }
    ++step;
    ASSERT_EQ(engine.get_scheduler().check_invariants(), "") << "step " << step;
  }
  for (const auto& [k, n] : finals) EXPECT_EQ(n, 1) << k.first << "/" << k.second;
  EXPECT_EQ(reasons[ids[5]], finish_reason::abort);
  EXPECT_EQ(reasons[ids[0]], finish_reason::abort);
  engine.abort(ids[1]);  // finished: ignored
  EXPECT_TRUE(engine.step().empty());
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  EXPECT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks());
  EXPECT_TRUE(exec.errors().empty());
}

TEST(llm_engine, executor_failure_fails_the_step_requests_cleanly) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  std::mt19937 rng(2);
  const auto p1 = random_prompt(rng, 8);
  const request_id a = engine.add_request(p1, greedy(5));
  engine.step();
  exec.fail_at_step(2);
  auto outs = engine.step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].id, a);
  EXPECT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].reason, finish_reason::error);
  EXPECT_NE(outs[0].error.find("injected"), std::string::npos);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
  // The engine keeps working, and the failed step left no bogus prefix-cache entries: a request
  // with the same prompt generates exactly the oracle tokens.
  const request_id b = engine.add_request(p1, greedy(5));
  auto all = run_to_end(engine);
  std::vector<token_id> got = all[b].tokens[0];
  if (!got.empty() && got.back() == eos_id) got.pop_back();
  EXPECT_EQ(got, oracle(p1, 5, true));
  EXPECT_TRUE(exec.errors().empty());
  EXPECT_EQ(engine.stats().num_failed_steps, 1u);

  // An n = 2 request failing in its prefill step reports both choices.
  sampling_params two = greedy(5);
  two.n = 2;
  const request_id c = engine.add_request(p1, two);
  exec.fail_at_step(exec.num_steps() + 1);
  auto failed = engine.step();
  ASSERT_EQ(failed.size(), 2u);
  for (const auto& o : failed) {
    EXPECT_EQ(o.id, c);
    EXPECT_EQ(o.reason, finish_reason::error);
  }
  EXPECT_NE(failed[0].index, failed[1].index);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.get_scheduler().blocks().num_free_blocks(), 64);
}

TEST(llm_engine, prefix_cache_skips_the_shared_prompt_prefill) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  std::mt19937 rng(4);
  auto system = random_prompt(rng, 16);
  auto p1 = system, p2 = system;
  for (token_id t : random_prompt(rng, 3)) p1.push_back(t);
  for (token_id t : random_prompt(rng, 5)) p2.push_back(t);
  const request_id a = engine.add_request(p1, greedy(4));
  run_to_end(engine);
  const int64_t computed_before = exec.num_computed_tokens();
  const request_id b = engine.add_request(p2, greedy(4));
  auto all = run_to_end(engine);
  (void)a;
  EXPECT_EQ(all[b].last[0].num_cached_prompt_tokens, 16);
  // Only the 5 new prompt tokens and the decodes were computed.
  const int64_t generated = static_cast<int64_t>(all[b].tokens[0].size());
  EXPECT_EQ(exec.num_computed_tokens() - computed_before, 5 + generated - 1);
  std::vector<token_id> got = all[b].tokens[0];
  if (!got.empty() && got.back() == eos_id) got.pop_back();
  EXPECT_EQ(got, oracle(p2, 4, true));
}

TEST(llm_engine, every_executed_step_feeds_the_step_cost_model) {
  // The engine measures its steps and feeds them to the scheduler's cost model (stall-free
  // batching): every step that ran a batch and swapped nothing, once; what it reports is that step's.
  sim_executor exec(4, 8, 16, vocab);
  engine_options o = opts(8, 16);
  o.max_num_batched_tokens = 8;
  o.preemption = preemption_mode::swap;  // a small pool: some steps swap, and are not fed
  o.target_step_seconds = 0.05;
  llm_engine engine(exec, char_tokenizer(), o);
  std::mt19937 rng(4);
  for (int i = 0; i < 4; ++i) engine.add_request(random_prompt(rng, 9), greedy(6));
  int64_t fed = 0, swapped = 0;
  while (engine.has_unfinished()) {
    engine.step();
    const step_record& r = engine.last_record();
    const bool swaps = r.num_swap_in_blocks + r.num_swap_out_blocks > 0;
    fed += r.num_batch_seqs > 0 && !swaps;
    swapped += swaps;
    if (r.num_batch_seqs == 0) continue;
    const engine_stats st = engine.stats();
    EXPECT_EQ(st.measured_step_seconds, r.step_seconds);
    EXPECT_EQ(st.predicted_step_seconds, r.predicted_seconds);
    EXPECT_EQ(st.prefill_budget_tokens, r.prefill_budget);
    EXPECT_GT(r.predicted_seconds, 0.0);
    EXPECT_GE(r.prefill_budget, 1);
    EXPECT_LE(r.prefill_budget, 8);
  }
  EXPECT_GT(swapped, 0);
  EXPECT_EQ(engine.get_scheduler().cost_model().num_observations(), fed);
  const engine_stats st = engine.stats();
  EXPECT_EQ(st.target_step_seconds, 0.05);
  EXPECT_GE(st.step_time_prediction_error, 0.0);
  EXPECT_GT(st.step_cost.prefill_token, 0.0);
}

TEST(llm_engine, step_records_describe_the_step) {
  sim_executor exec(4, 16, 16, vocab);
  engine_options o = opts(16, 16);
  o.max_num_batched_tokens = 16;
  llm_engine engine(exec, char_tokenizer(), o);
  std::mt19937 rng(8);
  for (int i = 0; i < 3; ++i) engine.add_request(random_prompt(rng, 10), greedy(3));
  engine.step();
  const step_record& r = engine.last_record();
  EXPECT_EQ(r.step, 1u);
  EXPECT_EQ(r.num_prefill_tokens, 16);  // 10 + a 6-token chunk of the second prompt
  EXPECT_EQ(r.num_decode_tokens, 0);
  EXPECT_EQ(r.num_batch_seqs, 2);
  EXPECT_EQ(r.num_running, 2);
  EXPECT_EQ(r.num_waiting, 1);
  EXPECT_EQ(r.num_waiting_by_reason[static_cast<size_t>(waiting_reason::token_budget)], 1);
  EXPECT_EQ(r.device.num_total, 16);
  EXPECT_EQ(r.device.num_used, 3 + 2);  // ceil(10/4) + ceil(6/4)
  ASSERT_EQ(r.running.size(), 2u);
  int admitted = 0;
  for (const auto& e : r.events) admitted += e.kind == event_kind::admitted;
  EXPECT_EQ(admitted, 2);
  EXPECT_GE(r.step_seconds, r.execute_seconds);
  auto snap = engine.block_snapshot();
  ASSERT_EQ(snap.size(), 16u + 16u);  // the device pool's blocks, then the host pool's
  int owned = 0;
  for (const auto& b : snap) owned += b.ref_count > 0 && b.owner_request;
  EXPECT_EQ(owned, 5);
  auto all = run_to_end(engine);
  // Final outputs carry the lifecycle timeline.
  for (auto& [id, c] : all) {
    const auto& tl = c.last[0].timeline;
    ASSERT_FALSE(tl.empty());
    EXPECT_EQ(tl.front().stage, lifecycle_stage::queued);
    EXPECT_EQ(tl.back().stage, lifecycle_stage::finished);
    EXPECT_TRUE(std::any_of(tl.begin(), tl.end(),
                            [](const lifecycle_entry& e) { return e.stage == lifecycle_stage::first_token; }));
  }
}

// Each sequence's events, in the order the step records carry them: a lifecycle a viewer can replay.
struct sequence_events {
  request_id request;
  std::vector<event_kind> kinds;
};

std::map<seq_id, sequence_events> events_per_sequence(llm_engine& engine,
                                                      const std::function<void(int)>& before_step = {}) {
  std::map<seq_id, sequence_events> out;
  const auto add = [&](const engine_event& e) {
    sequence_events& s = out[e.seq];
    EXPECT_TRUE(!s.request || s.request == e.request);
    s.request = e.request;
    s.kinds.push_back(e.kind);
  };
  for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) {
    if (before_step) before_step(step);
    engine.step();
    engine_clock::time_point last{};
    for (const engine_event& e : engine.last_record().events) {
      EXPECT_NE(e.at, engine_clock::time_point{}) << to_string(e.kind) << " has no time";
      EXPECT_GE(e.at, last) << to_string(e.kind) << " is out of time order";
      last = e.at;
      add(e);
    }
  }
  engine.step();  // aborts after the last step are reported by the next
  for (const engine_event& e : engine.last_record().events) add(e);
  return out;
}

std::string kinds_text(const std::vector<event_kind>& kinds) {
  std::string s;
  for (event_kind k : kinds) s += std::string(s.empty() ? "" : " ") + std::string(to_string(k));
  return s;
}

TEST(llm_engine, every_request_is_queued_gets_a_first_token_and_ends_once_in_order) {
  // Crowded enough to preempt (both ways) and swap back in, with a request of n = 2 and one aborted
  // while it waits: queued comes first and exactly once, first_token once per sequence after its
  // admission, one end event last.
  for (preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    sim_executor exec(4, 14, 32, vocab);
    engine_options o = opts(14, 32);
    o.preemption = mode;
    o.max_num_batched_tokens = 8;
    llm_engine engine(exec, char_tokenizer(), o);
    std::mt19937 rng(21);
    std::vector<request_id> ids;
    for (int i = 0; i < 6; ++i) {
      sampling_params p = greedy(16);
      p.ignore_eos = true;
      p.n = i == 2 ? 2 : 1;
      ids.push_back(engine.add_request(random_prompt(rng, 10), p));
    }
    const request_id aborted = ids.back();
    auto per_seq = events_per_sequence(engine, [&](int step) {
      if (step == 1) engine.abort(aborted);  // still waiting: 8 tokens a step admit one prompt at a time
    });
    ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
    int num_preempted = 0;
    for (const auto& [seq, events] : per_seq) {
      const std::vector<event_kind>& kinds = events.kinds;
      const std::string text = kinds_text(kinds);
      ASSERT_FALSE(kinds.empty());
      const auto count = [&](event_kind k) { return std::count(kinds.begin(), kinds.end(), k); };
      const bool is_fork = kinds.front() == event_kind::forked;
      EXPECT_EQ(count(event_kind::forked), is_fork ? 1 : 0) << text;
      EXPECT_EQ(kinds.front(), is_fork ? event_kind::forked : event_kind::queued) << text;
      EXPECT_EQ(count(event_kind::queued), is_fork ? 0 : 1) << text;
      EXPECT_EQ(count(event_kind::finished) + count(event_kind::aborted) + count(event_kind::failed), 1) << text;
      num_preempted += static_cast<int>(count(event_kind::preempted_swap) + count(event_kind::preempted_recompute));
      if (kinds.back() == event_kind::aborted && count(event_kind::admitted) == 0) {
        EXPECT_EQ(text, "queued aborted");
        continue;
      }
      EXPECT_EQ(kinds.back(), event_kind::finished) << text;
      EXPECT_EQ(count(event_kind::first_token), 1) << text;
      // The first token follows the (first) admission of the sequence, or its fork.
      const auto first = std::find(kinds.begin(), kinds.end(), event_kind::first_token);
      const auto admitted = std::find(kinds.begin(), kinds.end(), event_kind::admitted);
      EXPECT_TRUE(is_fork || admitted < first) << text;
    }
    EXPECT_EQ(per_seq.size(), ids.size() + 1) << "one sequence per request, plus the fork of n = 2";
    EXPECT_GT(num_preempted, 0) << "the test must exercise preemption";
    std::map<request_id, std::string> by_request;
    for (const auto& [seq, events] : per_seq) by_request[events.request] += "[" + kinds_text(events.kinds) + "]";
    EXPECT_EQ(by_request.size(), ids.size());
    EXPECT_EQ(by_request[aborted], "[queued aborted]");
  }
}

TEST(llm_engine, logprobs_are_reported_per_token) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(64));
  sampling_params p = greedy(3);
  p.logprobs = 2;
  p.ignore_eos = true;
  const std::vector<token_id> prompt{5, 6, 7};
  const request_id id = engine.add_request(prompt, p);
  std::vector<token_logprob> lps;
  while (engine.has_unfinished())
    for (const auto& o : engine.step())
      if (o.id == id) lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
  ASSERT_EQ(lps.size(), 3u);
  // Independent check of the first one: log_softmax of the fake logits.
  const auto l = fake_logits(prompt, vocab);
  double z = 0;
  const float mx = *std::max_element(l.begin(), l.end());
  for (float x : l) z += std::exp(double(x) - mx);
  const double expected = double(l[size_t(lps[0].token)]) - mx - std::log(z);
  EXPECT_NEAR(lps[0].logprob, expected, 1e-4);
  EXPECT_EQ(lps[0].top.size(), 2u);
  EXPECT_EQ(lps[0].top[0].first, lps[0].token);
}

TEST(llm_engine, random_workloads_terminate_once_and_match_the_oracle) {
  for (uint32_t seed = 0; seed < 150; ++seed) {
    std::mt19937 rng(seed);
    const int32_t blocks = 12 + static_cast<int32_t>(rng() % 20);
    const int32_t host = static_cast<int32_t>(rng() % 24);
    sim_executor exec(4, blocks, host, vocab);
    engine_options o = opts(blocks, host);
    o.max_num_batched_tokens = 4 + static_cast<int32_t>(rng() % 40);
    o.max_num_seqs = 1 + static_cast<int32_t>(rng() % 6);
    o.preemption = static_cast<preemption_mode>(seed % 3);
    o.enable_prefix_caching = rng() % 3 != 0;
    llm_engine engine(exec, char_tokenizer(), o);
    std::map<request_id, std::vector<token_id>> prompts;
    std::map<request_id, int32_t> max_tokens;
    std::set<request_id> aborted;
    const auto shared = random_prompt(rng, 8);
    for (int i = 0; i < 8; ++i) {
      auto p = rng() % 2 ? shared : std::vector<token_id>{};
      for (token_id t : random_prompt(rng, 1 + static_cast<int32_t>(rng() % 12))) p.push_back(t);
      const int32_t mt = 1 + static_cast<int32_t>(rng() % 12);
      const request_id id = engine.add_request(p, greedy(mt), static_cast<int32_t>(rng() % 2));
      prompts[id] = p;
      max_tokens[id] = mt;
    }
    std::map<request_id, collected> all;
    for (int step = 0; engine.has_unfinished() && step < 10000; ++step) {
      if (rng() % 30 == 0) {
        const request_id victim{1 + rng() % prompts.size()};
        if (!all[victim].num_final.count(0)) aborted.insert(victim);
        engine.abort(victim);
      }
      for (const auto& out : engine.step()) {
        collected& c = all[out.id];
        c.tokens[out.index].insert(c.tokens[out.index].end(), out.token_ids.begin(), out.token_ids.end());
        if (out.finished) ++c.num_final[out.index];
        c.reason[out.index] = out.reason;
      }
    }
    ASSERT_FALSE(engine.has_unfinished()) << "seed " << seed;
    ASSERT_TRUE(exec.errors().empty()) << "seed " << seed << ": " << exec.errors()[0];
    for (auto& [id, p] : prompts) {
      ASSERT_EQ(all[id].num_final[0], 1) << "seed " << seed << " request " << id;
      std::vector<token_id> got = all[id].tokens[0];
      if (!got.empty() && got.back() == eos_id) got.pop_back();
      const auto expected = oracle(p, max_tokens[id], true);
      if (all[id].reason[0] == finish_reason::abort) {
        ASSERT_TRUE(aborted.count(id));
        ASSERT_TRUE(std::equal(got.begin(), got.end(), expected.begin())) << "seed " << seed;
      } else {
        ASSERT_EQ(got, expected) << "seed " << seed << " request " << id;
      }
    }
    const auto& bm = engine.get_scheduler().blocks();
    ASSERT_EQ(bm.num_free_blocks(), bm.num_device_blocks()) << "seed " << seed;
    ASSERT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace tessera
