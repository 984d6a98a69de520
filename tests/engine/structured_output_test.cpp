// Constrained decoding in the engine core, without the grammar engine: a scripted constraint backend
// (its masks filled on a thread of its own, as the real one does) against the simulated executor.
// Checks that the mask decides every token whatever the model prefers, that every sampling parameter
// composes with it, that a complete grammar finishes the sequence with reason stop, that n > 1 forks
// carry the constraint, and that unconstrained requests in the same batch are unaffected.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sampler.hpp"
#include "engine/sim_executor.hpp"
#include "engine/structured_output.hpp"
#include "tests/support/char_tokenizer.hpp"
#include "tests/support/scripted_constraints.hpp"

namespace tessera {
namespace {

using test_support::char_tokenizer;
using testing::ranked_token;
using testing::sim_executor;

constexpr int32_t vocab = test_support::char_vocab;
constexpr token_id eos_id = 0;

using test_support::scripted_compiled;
using test_support::token_script;

// "Compiles" a regex-kind spec whose source is a word: the output must spell it (one char per token);
// the source "?" means "any of a, b" three times; anything else fails.
compile_result compile_word(const structured_output_spec& spec) {
  if (spec.source == "?") return {std::make_shared<scripted_compiled>(token_script(3, {1, 2}), eos_id)};
  if (spec.source.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) {
    return {nullptr, "'" + spec.field + "': the regular expression does not compile"};
  }
  token_script script;
  for (char c : spec.source) script.push_back({static_cast<token_id>(1 + (c - 'a'))});
  return {std::make_shared<scripted_compiled>(std::move(script), eos_id)};
}

std::shared_ptr<test_support::scripted_backend> make_backend() {
  return std::make_shared<test_support::scripted_backend>(compile_word, std::chrono::milliseconds(1));
}

engine_options opts(std::shared_ptr<constraint_backend> backend, int32_t blocks = 64) {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = 0;
  o.watermark = 0;
  o.constraints = std::move(backend);
  return o;
}

sampling_params constrained(std::string word, int32_t max_tokens = 32) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  structured_output_spec s;
  s.type = structured_output_spec::kind::regex;
  s.source = std::move(word);
  s.field = "guided_regex";
  p.structured = s;
  return p;
}

struct result {
  std::map<int32_t, std::vector<token_id>> tokens;
  std::map<int32_t, std::string> text;
  std::map<int32_t, finish_reason> reason;
  std::map<int32_t, std::string> error;
};

// `after_step`: called after every step (to look at engine.last_record()).
std::map<request_id, result> run(llm_engine& engine, const std::function<void()>& after_step = {}) {
  std::map<request_id, result> all;
  for (int i = 0; i < 10000 && engine.has_unfinished(); ++i) {
    const std::vector<request_output> outs = engine.step();
    if (after_step) after_step();
    for (const request_output& o : outs) {
      result& r = all[o.id];
      r.tokens[o.index].insert(r.tokens[o.index].end(), o.token_ids.begin(), o.token_ids.end());
      r.text[o.index] += o.text;
      if (o.finished) r.reason[o.index] = o.reason, r.error[o.index] = o.error;
    }
  }
  return all;
}

std::vector<token_id> spell(const std::string& word) {
  std::vector<token_id> ids;
  for (char c : word) ids.push_back(static_cast<token_id>(1 + (c - 'a')));
  return ids;
}

TEST(structured_output, the_mask_decides_every_token_and_completion_stops) {
  auto backend = make_backend();
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(backend));
  const std::vector<token_id> prompt = {5, 6, 7};
  const request_id a = engine.add_request(prompt, constrained("structured"));
  sampling_params free_params;
  free_params.temperature = 0;
  free_params.max_tokens = 12;
  const request_id b = engine.add_request(prompt, free_params);
  // The step records' running rows say which sequence is constrained (the dashboard marks it).
  int rows_of_a = 0, rows_of_b = 0;
  auto all = run(engine, [&] {
    for (const sequence_blocks& row : engine.last_record().running) {
      rows_of_a += row.request == a;
      rows_of_b += row.request == b;
      EXPECT_EQ(row.constrained, row.request == a);
    }
  });
  EXPECT_GT(rows_of_a, 5);
  EXPECT_GT(rows_of_b, 5);
  ASSERT_TRUE(exec.errors().empty()) << exec.errors()[0];
  EXPECT_EQ(all[a].tokens[0], spell("structured"));  // not one token of the model's own choice
  EXPECT_EQ(all[a].text[0], "structured");
  EXPECT_EQ(all[a].reason[0], finish_reason::stop);  // completed: no end token needed
  // The unconstrained request in the same batches is the model's greedy continuation.
  std::vector<token_id> history = prompt, expected;
  while (expected.size() < 12) {
    const token_id t = ranked_token(history, vocab, 0);
    expected.push_back(t);
    history.push_back(t);
    if (t == eos_id) break;
  }
  EXPECT_EQ(all[b].tokens[0], expected);
  EXPECT_GT(backend->masks.load(), 9);  // one mask per constrained step, off the engine thread
  EXPECT_EQ(engine.stats().num_token_masks, static_cast<uint64_t>(backend->masks.load()));
}

TEST(structured_output, every_sampling_parameter_composes_with_the_mask) {
  auto backend = make_backend();
  sim_executor exec(4, 256, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(backend, 256));
  std::vector<request_id> ids;
  for (int i = 0; i < 24; ++i) {
    sampling_params p = constrained("?");
    p.temperature = 0.3f + 0.1f * static_cast<float>(i % 8);
    p.seed = 100 + static_cast<uint64_t>(i);
    if (i % 4 == 1) p.top_k = 1 + i % 3;
    if (i % 4 == 2) p.top_p = 0.5f, p.min_p = 0.1f;
    if (i % 4 == 3) p.repetition_penalty = 1.5f, p.presence_penalty = 1.0f, p.frequency_penalty = 0.5f;
    if (i % 5 == 0) p.logit_bias = {{1, -100.0f}, {30, 100.0f}};  // token 30 is outside the grammar
    if (i % 6 == 0) p.logprobs = 3;
    ids.push_back(engine.add_request({3, static_cast<token_id>(4 + i % 7)}, p));
  }
  auto all = run(engine);
  std::set<std::vector<token_id>> distinct;
  for (request_id id : ids) {
    const auto& t = all[id].tokens[0];
    ASSERT_EQ(t.size(), 3u) << id;
    for (token_id x : t) EXPECT_TRUE(x == 1 || x == 2) << id;
    EXPECT_EQ(all[id].reason[0], finish_reason::stop);
    distinct.insert(t);
  }
  EXPECT_GT(distinct.size(), 2u);  // sampling still samples within the allowed set
}

TEST(structured_output, forks_of_n_gt_1_each_follow_the_grammar) {
  auto backend = make_backend();
  sim_executor exec(4, 64, 0, vocab);
  llm_engine engine(exec, char_tokenizer(), opts(backend));
  sampling_params p = constrained("?");
  p.n = 4;
  p.temperature = 1.0f;
  p.seed = 7;
  const request_id id = engine.add_request({9, 9, 9}, p);
  auto all = run(engine);
  ASSERT_EQ(all[id].tokens.size(), 4u);
  for (int c = 0; c < 4; ++c) {
    ASSERT_EQ(all[id].tokens[c].size(), 3u) << c;
    for (token_id x : all[id].tokens[c]) EXPECT_TRUE(x == 1 || x == 2);
    EXPECT_EQ(all[id].reason[c], finish_reason::stop);
  }
}

TEST(structured_output, refusals_name_the_field) {
  sim_executor exec(4, 64, 0, vocab);
  {
    llm_engine engine(exec, char_tokenizer(), opts(nullptr));
    try {
      engine.add_request({1, 2}, constrained("abc"));
      FAIL() << "no backend: refused";
    } catch (const invalid_request& e) {
      EXPECT_NE(std::string(e.what()).find("'guided_regex'"), std::string::npos) << e.what();
    }
  }
  auto backend = make_backend();
  llm_engine engine(exec, char_tokenizer(), opts(backend));
  try {
    engine.add_request({1, 2}, constrained("a(b"));
    FAIL() << "a spec that does not compile is refused";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("does not compile"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine.has_unfinished());
  sampling_params too_big = constrained(std::string(70 * 1024, 'a'));
  EXPECT_THROW(engine.add_request({1, 2}, too_big), invalid_request);  // over max_structured_output_bytes
}

TEST(structured_output, the_host_sampler_masks_before_logprobs_and_falls_back_inside_the_mask) {
  const int32_t n = 100;
  std::vector<float> logits(n, 0.0f);
  logits[7] = 10.0f;  // the model's favourite, outside the mask
  logits[42] = 1.0f;
  std::vector<uint32_t> mask(token_mask_words(n), 0u);
  for (token_id t : {40, 41, 42}) mask[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  sampling_params p;
  p.temperature = 0;
  p.logprobs = 2;
  sampler s(p, 0, {});
  const sample_result r = s.sample(logits, mask);
  EXPECT_EQ(r.token, 42);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 42);  // the constrained distribution: 7 is not in it
  // min_tokens masks the only allowed tokens: the fallback stays inside the grammar's mask.
  sampling_params q;
  q.min_tokens = 5;
  q.max_tokens = 10;
  q.stop_token_ids = {40, 41, 42};
  sampler s2(q, 0, {});
  EXPECT_EQ(s2.sample(logits, mask).token, 42);
}

}  // namespace
}  // namespace tessera
