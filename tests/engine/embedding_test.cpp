// Embedding requests through the real step loop on the simulated executor (its hidden rows are a
// function of the token history as read back from the KV cache, tests/engine/sim_executor.hpp): the
// pooled vector equals the oracle's (mean or last over the true prompt) when the prompt is prefilled
// in chunks, batched with generations, preempted and recomputed, or already in the prefix cache; an
// embedding samples nothing, ends in the step of its last prompt chunk and frees its blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sim_executor.hpp"
#include "tests/support/greedy_params.hpp"
#include "tests/support/random_prompt.hpp"

namespace tessera {
namespace {

using testing::fake_hidden;
using testing::sim_executor;

constexpr int32_t vocab = 64;

// Ids in [1, vocab) (tests/support/random_prompt.hpp).
std::vector<token_id> random_prompt(std::mt19937& rng, int32_t len) {
  return test_support::random_prompt(rng, vocab, len);
}

// What the fake model's embedding of `prompt` is, computed from the prompt alone.
std::vector<float> oracle(const std::vector<token_id>& prompt, pooling_type type) {
  const int32_t hs = 4;
  std::vector<double> sum(hs, 0.0);
  const size_t n = prompt.size();
  for (size_t p = type == pooling_type::last ? n - 1 : 0; p < n; ++p) {
    const std::vector<float> h = fake_hidden(std::span(prompt).first(p + 1), hs);
    for (int32_t d = 0; d < hs; ++d) sum[static_cast<size_t>(d)] += h[static_cast<size_t>(d)];
  }
  double norm = 0;
  for (double& v : sum) {
    if (type == pooling_type::mean) v /= static_cast<double>(n);
    norm += v * v;
  }
  std::vector<float> out;
  for (double v : sum) out.push_back(static_cast<float>(v / std::sqrt(norm)));
  return out;
}

void expect_vector_near(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "element " << i;
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

struct result {
  std::vector<request_output> outputs;  // every output of the request, in order
};

std::map<request_id, result> run_to_end(llm_engine& engine, std::vector<engine_event>* events = nullptr) {
  std::map<request_id, result> all;
  for (int i = 0; i < 10000 && engine.has_unfinished(); ++i) {
    for (const request_output& o : engine.step()) all[o.id].outputs.push_back(o);
    if (events) events->insert(events->end(), engine.last_record().events.begin(), engine.last_record().events.end());
  }
  return all;
}

sampling_params greedy(int32_t max_tokens) { return test_support::greedy_to_length(max_tokens); }

// One output, final, no tokens: the vector only.
const std::vector<float>& embedding_of(const result& r) {
  EXPECT_EQ(r.outputs.size(), 1u);
  const request_output& o = r.outputs.back();
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.reason, finish_reason::stop);
  EXPECT_TRUE(o.token_ids.empty());
  EXPECT_EQ(o.num_generated_tokens, 0);
  return o.embedding;
}

TEST(embedding, mean_and_last_pooling_over_chunked_prefill_match_the_oracle) {
  for (const int32_t budget : {2048, 5}) {  // one chunk; chunks of 5 tokens across 7 steps
    sim_executor exec(4, 64, 0, vocab);
    llm_engine engine(exec, nullptr, opts(64, budget));
    std::mt19937 rng(7);
    const std::vector<token_id> prompt = random_prompt(rng, 33);
    const request_id mean = engine.add_embedding_request(prompt, pooling_type::mean);
    const request_id last = engine.add_embedding_request(prompt, pooling_type::last);
    auto all = run_to_end(engine);
    ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
    expect_vector_near(embedding_of(all[mean]), oracle(prompt, pooling_type::mean));
    expect_vector_near(embedding_of(all[last]), oracle(prompt, pooling_type::last));
    EXPECT_EQ(all[mean].outputs.back().num_prompt_tokens, 33);
    // The two poolings differ (the test could tell them apart), and so would a pool of the last chunk only.
    EXPECT_GT(std::fabs(oracle(prompt, pooling_type::mean)[0] - oracle(prompt, pooling_type::last)[0]), 1e-3);
    EXPECT_FALSE(engine.has_unfinished());
    const auto& bm = engine.get_scheduler().blocks();
    EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
    EXPECT_EQ(engine.stats().num_generated_tokens, 0u);
  }
}

// An executor that records what each step batched.
struct recording_executor : sim_executor {
  using sim_executor::sim_executor;
  int32_t steps_with_both = 0;  // steps holding an embedding chunk and a generation's slice
  void execute(const step_batch& batch, step_output& out) override {
    bool hidden = false, logits = false;
    for (const sequence_slice& s : batch.seqs) {
      hidden = hidden || s.hidden != sequence_slice::hidden_mode::none;
      logits = logits || s.logits != sequence_slice::logits_mode::none;
      EXPECT_FALSE(s.hidden != sequence_slice::hidden_mode::none && s.logits != sequence_slice::logits_mode::none);
    }
    steps_with_both += hidden && logits;
    sim_executor::execute(batch, out);
  }
};

TEST(embedding, is_batched_with_generations_that_stay_unchanged) {
  std::mt19937 rng(11);
  std::vector<std::vector<token_id>> gen_prompts, emb_prompts;
  for (int i = 0; i < 3; ++i) gen_prompts.push_back(random_prompt(rng, 5 + 3 * i));
  for (int i = 0; i < 3; ++i) emb_prompts.push_back(random_prompt(rng, 20 + 7 * i));
  // The generations alone, for comparison.
  std::map<size_t, std::vector<token_id>> alone;
  {
    sim_executor exec(4, 128, 0, vocab);
    llm_engine engine(exec, nullptr, opts(128, 16));
    std::map<request_id, size_t> ids;
    for (size_t i = 0; i < gen_prompts.size(); ++i) ids[engine.add_request(gen_prompts[i], greedy(10))] = i;
    for (auto& [id, r] : run_to_end(engine))
      for (const auto& o : r.outputs)
        alone[ids[id]].insert(alone[ids[id]].end(), o.token_ids.begin(), o.token_ids.end());
  }
  recording_executor exec(4, 128, 0, vocab);
  llm_engine engine(exec, nullptr, opts(128, 16));
  std::map<request_id, size_t> gens, embs;
  for (size_t i = 0; i < gen_prompts.size(); ++i) {
    gens[engine.add_request(gen_prompts[i], greedy(10))] = i;
    embs[engine.add_embedding_request(emb_prompts[i], pooling_type::mean)] = i;
  }
  auto all = run_to_end(engine);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  EXPECT_GT(exec.steps_with_both, 0);
  for (auto& [id, i] : embs) expect_vector_near(embedding_of(all[id]), oracle(emb_prompts[i], pooling_type::mean));
  for (auto& [id, i] : gens) {
    std::vector<token_id> got;
    for (const auto& o : all[id].outputs) got.insert(got.end(), o.token_ids.begin(), o.token_ids.end());
    EXPECT_EQ(got, alone[i]) << "generation " << i;
    EXPECT_TRUE(all[id].outputs.back().embedding.empty());
  }
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(embedding, takes_no_cached_prefix_and_recomputes_every_token) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, nullptr, opts(64));
  std::mt19937 rng(5);
  const std::vector<token_id> prompt = random_prompt(rng, 24);
  // A generation of the same prompt fills the prefix cache with its 6 full blocks.
  engine.add_request(prompt, greedy(2));
  run_to_end(engine);
  for (int round = 0; round < 2; ++round) {  // twice: the embedding's own blocks are cached too
    const int64_t before = exec.num_computed_tokens();
    const request_id id = engine.add_embedding_request(prompt, pooling_type::mean);
    auto all = run_to_end(engine);
    EXPECT_EQ(exec.num_computed_tokens() - before, 24) << "round " << round;
    EXPECT_EQ(all[id].outputs.back().num_cached_prompt_tokens, 0);
    expect_vector_near(embedding_of(all[id]), oracle(prompt, pooling_type::mean));
  }
  // A generation still reuses the cache afterwards.
  const request_id g = engine.add_request(prompt, greedy(2));
  auto all = run_to_end(engine);
  EXPECT_EQ(all[g].outputs.back().num_cached_prompt_tokens, 20);  // all but the last block's tokens
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
}

TEST(embedding, preempted_by_recompute_starts_its_pool_over) {
  // 6 blocks of 4: the embedding (20 tokens, 5 blocks) and a more important generation (16 + 8
  // tokens, 6 blocks) cannot both fit, and chunks of 4 let both run at once: the embedding is the victim.
  sim_executor exec(4, 6, 0, vocab);
  engine_options o = opts(6, 8);
  o.long_prefill_token_threshold = 4;
  o.preemption = preemption_mode::recompute;
  llm_engine engine(exec, nullptr, o);
  std::mt19937 rng(3);
  const std::vector<token_id> prompt = random_prompt(rng, 20);
  const request_id emb = engine.add_embedding_request(prompt, pooling_type::mean, /*priority=*/1);
  std::vector<engine_event> events;
  std::map<request_id, result> all;
  for (int i = 0; i < 2; ++i)
    for (const request_output& out : engine.step()) all[out.id].outputs.push_back(out);
  const request_id gen = engine.add_request(random_prompt(rng, 16), greedy(8), /*priority=*/0);
  for (auto& [id, r] : run_to_end(engine, &events)) all[id].outputs = r.outputs;
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  bool preempted = false;
  for (const engine_event& e : events)
    preempted = preempted || (e.kind == event_kind::preempted_recompute && e.request == emb);
  ASSERT_TRUE(preempted) << "the embedding was never preempted: the test does not test what it says";
  expect_vector_near(embedding_of(all[emb]), oracle(prompt, pooling_type::mean));
  EXPECT_TRUE(all[gen].outputs.back().finished);
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(embedding, aborted_mid_prefill_frees_its_blocks) {
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, nullptr, opts(64, 4));
  std::mt19937 rng(9);
  const request_id id = engine.add_embedding_request(random_prompt(rng, 40), pooling_type::mean);
  engine.step();
  engine.step();
  engine.abort(id);
  EXPECT_FALSE(engine.has_unfinished());
  const std::vector<request_output> outs = engine.step();  // the abort's output comes with the next step
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].id, id);
  EXPECT_EQ(outs[0].reason, finish_reason::abort);
  EXPECT_TRUE(outs[0].embedding.empty());
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
}

TEST(embedding, refusals_name_the_problem) {
  sim_executor exec(4, 8, 0, vocab);
  llm_engine engine(exec, nullptr, opts(8));
  auto refused = [&](std::vector<token_id> prompt, pooling_type type, const std::string& needle) {
    try {
      engine.add_embedding_request(std::move(prompt), type);
      ADD_FAILURE() << "accepted; expected a refusal with '" << needle << "'";
    } catch (const invalid_request& e) { EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); }
  };
  refused({1, 2}, pooling_type::none, "pooling");
  refused({}, pooling_type::mean, "empty");
  refused({1, vocab}, pooling_type::mean, "outside the vocabulary");
  refused(std::vector<token_id>(33, 1), pooling_type::mean, "");  // more than the 8 x 4 slots of the cache
  // An executor that returns no hidden states.
  struct no_pooling : sim_executor {
    using sim_executor::sim_executor;
    bool pools_hidden_states() const override { return false; }
  } plain(4, 8, 0, vocab);
  llm_engine other(plain, nullptr, opts(8));
  try {
    other.add_embedding_request({1, 2}, pooling_type::mean);
    ADD_FAILURE() << "accepted";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("sim executor"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine.has_unfinished());
}

}  // namespace
}  // namespace tessera
