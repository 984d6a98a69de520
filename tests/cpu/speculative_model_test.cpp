// Speculative decoding on real executors (CPU): greedy output with n-gram speculation must be token
// for token the output without it, on the tiny dummy-weight model of tests/support/ and on SmolLM2-135M
// (skipped without models/), alone, in a batch of 16 and under preemption by a tiny KV pool; drafts must
// really be accepted (so the comparison covers verified tokens), and every block must be free after.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/model_loader.hpp"
#include "tests/support/ngram_speculation.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera {
namespace {

sampling_params greedy(int32_t max_tokens) {
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;  // always max_tokens: the comparison covers the whole output
  return p;
}

engine_options options(int32_t blocks, int32_t host, bool speculative,
                       preemption_mode mode = preemption_mode::automatic) {
  engine_options o;
  o.block_size = 16;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = host;
  o.watermark = 0;
  o.preemption = mode;
  if (speculative) o.speculative = test_support::ngram_speculation(4, 16);
  return o;
}

struct run_result {
  std::vector<std::vector<token_id>> tokens;  // per request, in submission order
  engine_stats stats;
};

run_result run(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& o,
               const std::vector<std::vector<token_id>>& prompts, int32_t max_tokens) {
  llm_engine engine(exec, std::move(tok), o);
  std::map<request_id, size_t> order;
  for (size_t i = 0; i < prompts.size(); ++i) order[engine.add_request(prompts[i], greedy(max_tokens))] = i;
  run_result r;
  r.tokens.resize(prompts.size());
  while (engine.has_unfinished()) {
    for (const request_output& out : engine.step()) {
      EXPECT_TRUE(out.error.empty()) << out.error;
      auto& t = r.tokens[order.at(out.id)];
      t.insert(t.end(), out.token_ids.begin(), out.token_ids.end());
    }
    const std::string inv = engine.get_scheduler().check_invariants();
    EXPECT_EQ(inv, "");
    if (!inv.empty()) break;
  }
  const block_manager& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  EXPECT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks());
  r.stats = engine.stats();
  return r;
}

// Plain, speculative with room, and speculative in `small_pool` blocks (preemption forced by the pool).
void expect_identical(executor& roomy, executor& tight, std::shared_ptr<const tokenizer> tok,
                      const std::vector<std::vector<token_id>>& prompts, int32_t max_tokens, int32_t blocks,
                      int32_t small_pool) {
  const run_result plain = run(roomy, tok, options(blocks, 0, false), prompts, max_tokens);
  const run_result spec = run(roomy, tok, options(blocks, 0, true), prompts, max_tokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " of " << prompts.size();
  }
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << "no draft was accepted: the comparison proves nothing";
  // Alone, every accepted draft saves a step (in a batch the slowest sequence sets the step count).
  if (prompts.size() == 1) { EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps); }
  if (small_pool <= 0) return;
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    const run_result crowded = run(tight, tok, options(small_pool, 64, true, mode), prompts, max_tokens);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(crowded.tokens[i], plain.tokens[i]) << "request " << i << " under " << to_string(mode);
    EXPECT_GT(crowded.stats.num_preemptions_recompute + crowded.stats.num_preemptions_swap, 0u) << to_string(mode);
    EXPECT_GT(crowded.stats.num_accepted_draft_tokens, 0u) << to_string(mode);
  }
}

// A prompt that repeats a short pattern: the tiny random model tends to continue such a pattern, and
// the n-gram proposer then drafts it.
std::vector<token_id> repeating_prompt(int32_t seed, int32_t period, int32_t repeats) {
  const std::vector<token_id> unit = test_support::pseudo_tokens(period, seed);
  std::vector<token_id> p;
  for (int32_t r = 0; r < repeats; ++r) p.insert(p.end(), unit.begin(), unit.end());
  return p;
}

TEST(speculative_tiny_model, greedy_output_is_identical_batch_1_16_and_under_preemption) {
  const model_config config = test_support::tiny_executor_config();
  const auto weights = test_support::f32_dummy_weights(config, 7);
  auto roomy = test_support::cpu_reference_executor(weights, test_support::kv_pool(256), 2);
  auto tight = test_support::cpu_reference_executor(weights, test_support::kv_pool(20, 64), 2);
  expect_identical(*roomy, *tight, nullptr, {repeating_prompt(1, 5, 6)}, 48, 256, 0);
  std::vector<std::vector<token_id>> batch;
  for (int32_t i = 0; i < 16; ++i) batch.push_back(repeating_prompt(i + 2, 3 + i % 5, 5));
  // 20 blocks of 16 slots for 16 sequences of up to ~70 tokens: preemption is unavoidable.
  expect_identical(*roomy, *tight, nullptr, batch, 40, 256, 20);
}

// ---- SmolLM2-135M ------------------------------------------------------------------------------------

std::optional<loaded_model>& smollm() {
  static std::optional<loaded_model> model = []() -> std::optional<loaded_model> {
    const auto path = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) return std::nullopt;
    return load_model(path);
  }();
  return model;
}

std::unique_ptr<executor> smollm_executor(int32_t blocks, int32_t host) {
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = blocks;
  o.kv.num_host_blocks = host;
  return make_cpu_executor(smollm()->weights, o);
}

// Input-grounded prompts: the continuation quotes the given text, so n-gram drafts are mostly right.
std::vector<token_id> grounded_prompt(const tokenizer& tok, int32_t i) {
  static const char* texts[] = {
      "The committee met on Tuesday to review the budget for the coming year and agreed to fund the new library.",
      "Water boils at one hundred degrees Celsius at sea level, and at lower temperatures on high mountains.",
      "To install the package, run the setup script, then restart the server and check the log for errors.",
      "The fox ran through the forest, crossed the river at dawn and hid beneath the old oak tree until night.",
  };
  const std::string text = texts[i % 4];
  const std::string prompt = "Text: " + text + "\nRepeat the text exactly.\nText: " + text +
                             "\nRepeat: " + text.substr(0, static_cast<size_t>(12 + i));
  return tok.encode(prompt);
}

TEST(speculative_smollm, greedy_output_is_identical_batch_1_16_and_under_preemption) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm()->tok;
  auto roomy = smollm_executor(256, 0);
  auto tight = smollm_executor(24, 64);
  expect_identical(*roomy, *tight, smollm()->tok, {grounded_prompt(tok, 0)}, 40, 256, 0);
  std::vector<std::vector<token_id>> batch;
  for (int32_t i = 0; i < 16; ++i) batch.push_back(grounded_prompt(tok, i));
  // 24 blocks of 16 slots for 16 sequences of ~70 tokens: preemption is unavoidable.
  expect_identical(*roomy, *tight, smollm()->tok, batch, 24, 256, 24);
}

}  // namespace
}  // namespace tessera
