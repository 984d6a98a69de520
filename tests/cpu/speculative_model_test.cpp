// Speculative decoding on real executors (CPU): greedy output with n-gram speculation must be token
// for token the output without it, on the tiny dummy-weight model of tests/support/ and on SmolLM2-135M
// (skipped without models/), alone, in a batch of 16 and under preemption by a tiny KV pool; drafts must
// really be accepted (so the comparison covers verified tokens), and every block must be free after.
// The draft-model proposer likewise on real pairs: SmolLM2-135M from its Hugging Face copy (float) as
// target with the Q4_1 GGUF as draft, and the Q4_1 GGUF as its own draft; greedy output, and seeded
// sampled output with argmax drafts, must be plain decoding's; drafts sampled from the draft's own
// distribution must be accepted more often than argmax drafts; the draft model's own KV pool must be
// empty after every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/speculative/draft_model_proposer.hpp"
#include "engine/speculative/layer_draft.hpp"
#include "engine/speculative/vocabulary_check.hpp"
#include "tests/support/greedy_params.hpp"
#include "tests/support/ngram_speculation.hpp"
#include "tests/support/step_slices.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera {
namespace {

sampling_params greedy(int32_t max_tokens) { return test_support::greedy_to_length(max_tokens); }

// branches > 1: n-gram token trees of that many continuations (the CPU executor verifies trees).
engine_options options(int32_t blocks, int32_t host, bool speculative,
                       preemption_mode mode = preemption_mode::automatic, int32_t branches = 1) {
  engine_options o;
  o.block_size = 16;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = host;
  o.watermark = 0;
  o.preemption = mode;
  if (speculative) o.speculative = test_support::ngram_speculation(4, 16);
  o.speculative.ngram.branches = branches;
  return o;
}

struct run_result {
  std::vector<std::vector<token_id>> tokens;  // per request, in submission order
  engine_stats stats;
};

// Runs the prompts (request i with params[i % size]) to the end, checking the scheduler's invariants
// after every step and that every block of the target's pools, and of a draft model's, is free after.
run_result run(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& o,
               const std::vector<std::vector<token_id>>& prompts, const std::vector<sampling_params>& params) {
  llm_engine engine(exec, std::move(tok), o);
  std::map<request_id, size_t> order;
  for (size_t i = 0; i < prompts.size(); ++i) order[engine.add_request(prompts[i], params[i % params.size()])] = i;
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
  if (const draft_proposer* p = engine.proposer()) {
    const draft_pool_usage pool = p->pool_usage();
    EXPECT_EQ(pool.num_free_blocks, pool.num_blocks) << "draft KV blocks leaked";
    EXPECT_EQ(pool.num_sequences, 0) << "draft state leaked";
    if (const auto* d = dynamic_cast<const draft_model_proposer*>(p)) {
      EXPECT_EQ(d->stats().num_resyncs, 0u) << "a draft state was not rolled back after its step";
      EXPECT_EQ(d->stats().num_failures, 0u);
    }
  }
  r.stats = engine.stats();
  return r;
}

run_result run(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& o,
               const std::vector<std::vector<token_id>>& prompts, int32_t max_tokens) {
  return run(exec, std::move(tok), o, prompts, std::vector<sampling_params>{greedy(max_tokens)});
}

// Plain, speculative with room, and speculative in `small_pool` blocks (preemption forced by the pool).
// branches > 1: with token trees.
void expect_identical(executor& roomy, executor& tight, std::shared_ptr<const tokenizer> tok,
                      const std::vector<std::vector<token_id>>& prompts, int32_t max_tokens, int32_t blocks,
                      int32_t small_pool, int32_t branches = 1) {
  const run_result plain = run(roomy, tok, options(blocks, 0, false), prompts, max_tokens);
  const run_result spec =
      run(roomy, tok, options(blocks, 0, true, preemption_mode::automatic, branches), prompts, max_tokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " of " << prompts.size();
  }
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << "no draft was accepted: the comparison proves nothing";
  // Alone, every accepted draft saves a step (in a batch the slowest sequence sets the step count).
  if (prompts.size() == 1) { EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps); }
  if (small_pool <= 0) return;
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    const run_result crowded = run(tight, tok, options(small_pool, 64, true, mode, branches), prompts, max_tokens);
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

// Token trees (SpecInfer) on the CPU executor: the same identities with n-gram trees of 4 branches.
TEST(speculative_tiny_model, token_trees_give_identical_greedy_output_batch_1_16_and_under_preemption) {
  const model_config config = test_support::tiny_executor_config();
  const auto weights = test_support::f32_dummy_weights(config, 7);
  auto roomy = test_support::cpu_reference_executor(weights, test_support::kv_pool(256), 2);
  auto tight = test_support::cpu_reference_executor(weights, test_support::kv_pool(20, 64), 2);
  expect_identical(*roomy, *tight, nullptr, {repeating_prompt(1, 5, 6)}, 48, 256, 0, 4);
  std::vector<std::vector<token_id>> batch;
  for (int32_t i = 0; i < 16; ++i) batch.push_back(repeating_prompt(i + 2, 3 + i % 5, 5));
  expect_identical(*roomy, *tight, nullptr, batch, 40, 256, 20, 4);
}

// The executor's tree attention itself: every row of a token tree equals the last row of its branch
// computed as a plain chain after the same context (prefilled into other blocks), within the float
// reordering of the two walks. The tree is deeper than the Mistral fixture's window (8), so a deep
// row's window excludes its oldest ancestors and context; Gemma 3's fixture adds interleaved windows,
// per-layer RoPE bases and soft-capping-free (1+w) norms; the tiny model is plain full attention.
// Within `tolerance` of the logit scale; dequantize: as cpu_reference_executor's.
void expect_tree_rows_equal_chains(std::shared_ptr<const model_weights> weights, const char* what,
                                   float tolerance = 1e-4f, bool dequantize = false) {
  auto exec = test_support::cpu_reference_executor(weights, test_support::kv_pool(16), 2, dequantize);
  ASSERT_TRUE(exec->verifies_token_trees());
  const int32_t vocab = weights->config.vocab_size;
  const std::vector<token_id> context = test_support::pseudo_tokens(37, 3, vocab);
  // Root (the last sampled token) and 13 nodes: a first branch 10 deep, a second under the root, a
  // third under node 2, a fourth under node 5.
  const std::vector<int32_t> parents{-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 11, 2, 5};
  std::vector<token_id> nodes = test_support::pseudo_tokens(static_cast<int32_t>(parents.size()), 9, vocab);
  auto run_slice = [&](std::vector<token_id> toks, int32_t num_computed, std::vector<block_id> table,
                       std::vector<int32_t> tree_parents, sequence_slice::logits_mode mode) {
    step_batch b;
    sequence_slice s;
    s.seq = seq_id{table.front() == 0 ? 1u : 2u};
    s.tokens = std::move(toks);
    s.num_computed = num_computed;
    s.block_table = std::move(table);
    s.tree_parents = std::move(tree_parents);
    s.logits = mode;
    b.seqs.push_back(std::move(s));
    step_output out;
    exec->execute(b, out);
    return out;
  };
  const std::vector<block_id> tree_table{0, 1, 2, 3}, chain_table{4, 5, 6, 7};
  run_slice(context, 0, tree_table, {}, sequence_slice::logits_mode::none);
  const step_output tree =
      run_slice(nodes, static_cast<int32_t>(context.size()), tree_table, parents, sequence_slice::logits_mode::all);
  ASSERT_EQ(tree.num_rows[0], static_cast<int32_t>(nodes.size()));
  double worst = 0;
  for (size_t x = 0; x < nodes.size(); ++x) {
    std::vector<token_id> branch;
    for (int32_t at = static_cast<int32_t>(x); at >= 0; at = parents[static_cast<size_t>(at)])
      branch.insert(branch.begin(), nodes[static_cast<size_t>(at)]);
    std::vector<token_id> chain = context;
    chain.insert(chain.end(), branch.begin(), branch.end());
    const step_output want = run_slice(chain, 0, chain_table, {}, sequence_slice::logits_mode::last);
    const auto a = tree.row(static_cast<int32_t>(x)), b = want.row(0);
    float scale = 1.0f, diff = 0.0f;
    for (size_t v = 0; v < b.size(); ++v) {
      scale = std::max(scale, std::fabs(b[v]));
      diff = std::max(diff, std::fabs(a[v] - b[v]));
    }
    EXPECT_LE(diff, tolerance * scale) << what << ": node " << x << " (depth " << branch.size() - 1 << ")";
    worst = std::max(worst, double(diff / scale));
  }
  std::printf("  %s: %zu tree rows vs their chains, max |diff| %.3g of the logit scale\n", what, nodes.size(), worst);
  // Malformed trees are refused before anything is computed.
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0, 0}, std::vector<int32_t>{-1, 1},
                                          std::vector<int32_t>{-1, 0, 3}, std::vector<int32_t>{-1}}) {
    std::vector<token_id> toks(bad.size() == 1 ? 2 : bad.size(), nodes[0]);
    EXPECT_THROW(
        run_slice(toks, static_cast<int32_t>(context.size()), tree_table, bad, sequence_slice::logits_mode::all),
        invalid_request)
        << what;
  }
}

TEST(token_tree_executor, every_row_equals_its_branch_computed_as_a_chain) {
  const model_config config = test_support::tiny_executor_config();
  expect_tree_rows_equal_chains(test_support::f32_dummy_weights(config, 5), "tiny model");
  for (const char* arch : {"mistral", "gemma3"}) {
    const auto dir = std::filesystem::path(TESSERA_TEST_DATA_DIR) / "models" / arch;
    if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing";
    expect_tree_rows_equal_chains(load_model(dir).weights, arch);
  }
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

std::unique_ptr<executor> cpu_executor_of(const loaded_model& m, int32_t blocks, int32_t host) {
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = blocks;
  o.kv.num_host_blocks = host;
  return make_cpu_executor(m.weights, o);
}

std::unique_ptr<executor> smollm_executor(int32_t blocks, int32_t host) {
  return cpu_executor_of(*smollm(), blocks, host);
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

TEST(token_tree_executor, smollm_rows_equal_their_chains_in_fp32_and_within_activation_rounding_quantized) {
  // SmolLM2 Q4_1. With fp32 math (--dequantize-weights) a tree row is its chain's row (measured 7e-7 of
  // the logit scale). On the fast path each row's activations are quantized to int8 per block, and a
  // side branch's row differs from its chain's in the last bits (its own key sits in another column of
  // the softmax's sums), which an int8 rounding now and then turns into a step: measured up to 0.86
  // logits (0.037 of the scale), the size of the fast path's distance from fp32 math itself
  // (cpu_model.quantized_activations_stay_close_to_exact_f32_math: 1.6). A seeded sampled request
  // verified with trees can therefore take another token than plain decoding where its uniform falls
  // that close to a boundary (docs/speculative.md); chains are bit-identical.
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  expect_tree_rows_equal_chains(smollm()->weights, "SmolLM2 Q4_1, fp32 math", 1e-4f, /*dequantize=*/true);
  expect_tree_rows_equal_chains(smollm()->weights, "SmolLM2 Q4_1, quantized activations", 0.1f);
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

TEST(speculative_smollm, token_trees_give_identical_greedy_output_batch_1_16_and_under_preemption) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm()->tok;
  auto roomy = smollm_executor(256, 0);
  auto tight = smollm_executor(24, 64);
  expect_identical(*roomy, *tight, smollm()->tok, {grounded_prompt(tok, 0)}, 40, 256, 0, 4);
  std::vector<std::vector<token_id>> batch;
  for (int32_t i = 0; i < 16; ++i) batch.push_back(grounded_prompt(tok, i));
  expect_identical(*roomy, *tight, smollm()->tok, batch, 24, 256, 24, 4);
}

// ---- the draft-model proposer on real models ---------------------------------------------------------

std::optional<loaded_model>& load_once(const char* name) {
  static std::map<std::string, std::optional<loaded_model>> models;
  auto [it, inserted] = models.try_emplace(name);
  if (inserted) {
    const auto path = std::filesystem::path(TESSERA_MODEL_DIR) / name;
    if (std::filesystem::exists(path)) it->second = load_model(path);
  }
  return it->second;
}
std::optional<loaded_model>& smollm_hf() { return load_once("SmolLM2-135M-Instruct-hf"); }

engine_options draft_options(int32_t blocks, int32_t host, const loaded_model& draft, int32_t draft_blocks,
                             preemption_mode mode = preemption_mode::automatic) {
  engine_options o = options(blocks, host, false, mode);
  o.speculative.mode = speculative_mode::draft;
  o.speculative.num_tokens = 4;
  o.speculative.max_batch = 16;
  o.speculative.draft_executor = cpu_executor_of(draft, draft_blocks, 0);
  return o;
}

// Accepted / verified draft tokens, printed for the record (docs/speculative.md quotes them).
double acceptance(const run_result& r, const char* what) {
  const double rate = r.stats.num_draft_tokens == 0
                          ? 0.0
                          : double(r.stats.num_accepted_draft_tokens) / double(r.stats.num_draft_tokens);
  std::printf("%s: %llu of %llu draft tokens accepted (%.3f), %llu steps\n", what,
              static_cast<unsigned long long>(r.stats.num_accepted_draft_tokens),
              static_cast<unsigned long long>(r.stats.num_draft_tokens), rate,
              static_cast<unsigned long long>(r.stats.num_steps));
  return rate;
}

// Prompts whose continuations are the model's own (not copies of the input): what a draft model is for.
std::vector<token_id> open_prompt(const tokenizer& tok, int32_t i) {
  static const char* texts[] = {
      "The history of the printing press begins",
      "Here is a short story about a lighthouse keeper:",
      "Three reasons to learn a second language are",
      "def fibonacci(n):\n",
  };
  return tok.encode(std::string(texts[i % 4]) + (i >= 4 ? " (" + std::to_string(i) + ")" : std::string()));
}

TEST(draft_model_smollm, float_target_with_its_q4_1_draft_is_plain_decoding_batch_1_and_16) {
  if (!smollm() || !smollm_hf()) GTEST_SKIP() << "no SmolLM2 GGUF and HF copy in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm_hf()->tok;
  ASSERT_EQ(vocabulary_mismatch(tok, *smollm()->tok), "");  // the pair's vocabularies are one
  auto target = cpu_executor_of(*smollm_hf(), 256, 0);
  for (const int batch : {1, 16}) {
    std::vector<std::vector<token_id>> prompts;
    for (int32_t i = 0; i < batch; ++i) prompts.push_back(open_prompt(tok, i));
    const int32_t max_tokens = batch == 1 ? 40 : 20;
    const run_result plain = run(*target, smollm_hf()->tok, options(256, 0, false), prompts, max_tokens);
    const run_result spec = run(*target, smollm_hf()->tok, draft_options(256, 0, *smollm(), 256), prompts, max_tokens);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " of " << batch;
    // The quantized copy of the same model guesses most of the float model's tokens.
    EXPECT_GT(acceptance(spec, batch == 1 ? "float target, Q4_1 draft, batch 1" : "float target, Q4_1 draft, batch 16"),
              0.5)
        << spec.stats.num_accepted_draft_tokens << " of " << spec.stats.num_draft_tokens;
    if (batch == 1) { EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps); }
  }
}

TEST(draft_model_smollm, the_q4_1_model_as_its_own_draft_is_accepted_nearly_always) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm()->tok;
  auto target = smollm_executor(256, 0);
  std::vector<std::vector<token_id>> prompts;
  for (int32_t i = 0; i < 8; ++i) prompts.push_back(open_prompt(tok, i));
  const run_result plain = run(*target, smollm()->tok, options(256, 0, false), prompts, 32);
  const run_result spec = run(*target, smollm()->tok, draft_options(256, 0, *smollm(), 256), prompts, 32);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i;
  // The same weights on the same executor: the draft's argmax is the target's, but for rows computed
  // in another batch shape (int8 activation rounding) where the model is nearly undecided.
  EXPECT_GT(acceptance(spec, "Q4_1 target, Q4_1 draft, batch 8"), 0.97)
      << spec.stats.num_accepted_draft_tokens << " of " << spec.stats.num_draft_tokens;
}

TEST(draft_model_smollm, runner_up_token_trees_give_plain_decodings_tokens) {
  // The Q4_1 model drafting for itself with 3 tokens per position (its argmax and two runners-up as
  // leaves): the CPU executor verifies each tree with tree attention; greedy output must be plain
  // decoding's at batch 1 and 8.
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm()->tok;
  auto target = smollm_executor(256, 0);
  for (const int batch : {1, 8}) {
    std::vector<std::vector<token_id>> prompts;
    for (int32_t i = 0; i < batch; ++i) prompts.push_back(open_prompt(tok, i));
    engine_options trees = draft_options(256, 0, *smollm(), 256);
    trees.speculative.draft.branches = 3;
    const run_result plain = run(*target, smollm()->tok, options(256, 0, false), prompts, 32);
    const run_result spec = run(*target, smollm()->tok, trees, prompts, 32);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " of " << batch;
    // Every node counts as a verified draft token, the leaves too: a third of them can be accepted.
    acceptance(spec, batch == 1 ? "Q4_1 for itself, trees of 3, batch 1" : "Q4_1 for itself, trees of 3, batch 8");
    EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps);
  }
}

// The draft options with argmax drafts for every request (draft_model_options::sample off).
engine_options argmax_draft_options(const loaded_model& draft) {
  engine_options o = draft_options(256, 0, draft, 256);
  o.speculative.draft.sample = false;
  return o;
}

// Six open prompts sampled at temperature 0.8, top-p 0.9, each seeded.
void sampled_requests(const tokenizer& tok, std::vector<std::vector<token_id>>& prompts,
                      std::vector<sampling_params>& params) {
  for (int32_t i = 0; i < 6; ++i) {
    prompts.push_back(open_prompt(tok, i));
    sampling_params p = greedy(24);
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = 1000 + static_cast<uint64_t>(i);
    params.push_back(p);
  }
}

TEST(draft_model_smollm, argmax_drafts_keep_seeded_sampling_plain_decodings) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  auto target = smollm_executor(256, 0);
  std::vector<std::vector<token_id>> prompts;
  std::vector<sampling_params> params;
  sampled_requests(*smollm()->tok, prompts, params);
  const run_result plain = run(*target, smollm()->tok, options(256, 0, false), prompts, params);
  const run_result spec = run(*target, smollm()->tok, argmax_draft_options(*smollm()), prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i;
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
}

TEST(draft_model_smollm, sampled_drafts_of_the_model_for_itself_are_accepted_more_than_argmax_drafts) {
  // The Q4_1 model drafting for itself at temperature 0.8: drafts drawn from q = its own distribution
  // are accepted with min(1, p/q) = 1 but where batch shape rounds p and q apart; argmax drafts only
  // with the target's probability of that argmax. Seeded runs repeat.
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  auto target = smollm_executor(256, 0);
  std::vector<std::vector<token_id>> prompts;
  std::vector<sampling_params> params;
  sampled_requests(*smollm()->tok, prompts, params);
  const run_result greedy_drafts = run(*target, smollm()->tok, argmax_draft_options(*smollm()), prompts, params);
  const run_result sampled = run(*target, smollm()->tok, draft_options(256, 0, *smollm(), 256), prompts, params);
  const double sampled_rate = acceptance(sampled, "Q4_1 for itself, temperature 0.8, sampled drafts");
  const double argmax_rate = acceptance(greedy_drafts, "Q4_1 for itself, temperature 0.8, argmax drafts");
  EXPECT_GT(sampled_rate, 0.9);
  EXPECT_GT(sampled_rate, argmax_rate + 0.1);
  const run_result again = run(*target, smollm()->tok, draft_options(256, 0, *smollm(), 256), prompts, params);
  EXPECT_EQ(again.tokens, sampled.tokens);
}

TEST(draft_model_smollm, preemption_by_swap_and_recompute_leaks_no_draft_block) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const tokenizer& tok = *smollm()->tok;
  std::vector<std::vector<token_id>> prompts;
  for (int32_t i = 0; i < 12; ++i) prompts.push_back(grounded_prompt(tok, i));
  auto roomy = smollm_executor(256, 0);
  const run_result plain = run(*roomy, smollm()->tok, options(256, 0, false), prompts, 20);
  auto tight = smollm_executor(20, 64);
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    // 20 target blocks for 12 sequences of ~65 tokens: preemption is unavoidable; the draft pool of
    // 24 blocks cannot hold them all either (some steps draft for a few sequences only).
    const run_result spec = run(*tight, smollm()->tok, draft_options(20, 64, *smollm(), 24, mode), prompts, 20);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " under " << to_string(mode);
    EXPECT_GT(spec.stats.num_preemptions_recompute + spec.stats.num_preemptions_swap, 0u) << to_string(mode);
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << to_string(mode);
  }
}

// ---- a draft of the model's own first layers (engine/speculative/layer_draft.hpp) -----------------------

// The last row's logits of `prompt` on the exact (fp32) CPU executor of `weights`.
std::vector<float> last_row(std::shared_ptr<const model_weights> weights, const std::vector<token_id>& prompt) {
  auto exec = test_support::cpu_reference_executor(std::move(weights), test_support::kv_pool(8), 1);
  step_batch b;
  b.seqs.push_back(test_support::make_slice(1, prompt, 0, {0, 1, 2}, sequence_slice::logits_mode::last));
  step_output o;
  exec->execute(b, o);
  return {o.row(0).begin(), o.row(0).end()};
}

TEST(layer_draft, all_layers_are_the_target_and_fewer_are_another_model_on_the_same_tensors) {
  const auto target = test_support::f32_dummy_weights(test_support::tiny_executor_config(), 7);
  const std::vector<token_id> prompt = test_support::pseudo_tokens(40, 3);
  EXPECT_EQ(last_row(first_layers_draft(target, 2), prompt), last_row(target, prompt));
  const auto one = first_layers_draft(target, 1);
  EXPECT_EQ(one->config.num_layers, 1);
  EXPECT_EQ(one->layers.size(), 1u);
  EXPECT_EQ(one->layers[0].wq.data, target->layers[0].wq.data);  // the target's tensors, not copies
  EXPECT_EQ(one->output_norm.data, target->output_norm.data);
  EXPECT_NE(last_row(one, prompt), last_row(target, prompt));
  for (const int32_t bad : {0, 3, -1}) {
    try {
      first_layers_draft(target, bad);
      ADD_FAILURE() << bad << " layers accepted";
    } catch (const invalid_request& e) {
      EXPECT_NE(std::string(e.what()).find("--draft-layers"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("2 layers"), std::string::npos) << e.what();
    }
  }
}

TEST(draft_model_smollm, its_own_first_layers_as_draft_give_plain_decodings_tokens_batch_1_and_8) {
  // SmolLM2's first 10 of 30 layers and its head drafting for the whole model (--draft-layers 10).
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  loaded_model draft = *smollm();
  draft.weights = first_layers_draft(smollm()->weights, 10);
  const tokenizer& tok = *smollm()->tok;
  auto target = smollm_executor(256, 0);
  for (const int batch : {1, 8}) {
    std::vector<std::vector<token_id>> prompts;
    for (int32_t i = 0; i < batch; ++i) prompts.push_back(open_prompt(tok, i));
    const run_result plain = run(*target, smollm()->tok, options(256, 0, false), prompts, 24);
    const run_result spec = run(*target, smollm()->tok, draft_options(256, 0, draft, 256), prompts, 24);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i << " of " << batch;
    const double rate = acceptance(spec, batch == 1 ? "first 10 layers as draft, batch 1" : "first 10 layers, batch 8");
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
    EXPECT_LT(rate, 1.0);  // an early exit is another model: some drafts are rejected and rolled back
  }
}

TEST(draft_model_smollm, sampled_trees_of_its_first_layers_take_side_branches_and_seeded_runs_repeat) {
  // SmolLM2's first 20 layers drafting at temperature 0.8, top-p 0.9 (drafts drawn from its q), as a
  // chain and with 3 draws per position without replacement verified as a tree by the CPU executor
  // (recursive rejection sampling): the tree takes tokens from side branches, leaks nothing (run()
  // checks both pools), and a seeded run repeats token for token. That the output keeps the target's
  // distribution, and that a tree accepts more per verification in expectation, is checked where it
  // can be counted (tests/engine/speculative_test.cpp, 60000 requests); here both means are printed.
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  loaded_model draft = *smollm();
  draft.weights = first_layers_draft(smollm()->weights, 20);
  auto target = smollm_executor(256, 0);
  std::vector<std::vector<token_id>> prompts;
  std::vector<sampling_params> params;
  sampled_requests(*smollm()->tok, prompts, params);
  const run_result chain = run(*target, smollm()->tok, draft_options(256, 0, draft, 256), prompts, params);
  engine_options tree_options = draft_options(256, 0, draft, 256);
  tree_options.speculative.draft.branches = 3;
  const run_result tree = run(*target, smollm()->tok, tree_options, prompts, params);
  const auto per_verification = [](const run_result& r, const char* what) {
    const double mean = double(r.stats.num_accepted_draft_tokens) / double(r.stats.num_spec_verifications);
    std::printf("%s: %.3f drafts accepted per verification, %llu from side branches\n", what, mean,
                static_cast<unsigned long long>(r.stats.num_tree_branch_tokens));
    return mean;
  };
  const double chain_mean = per_verification(chain, "first 20 layers, sampled chain");
  const double tree_mean = per_verification(tree, "first 20 layers, sampled trees of 3");
  EXPECT_GT(tree.stats.num_tree_branch_tokens, 0u);
  EXPECT_GT(tree_mean, 0.0);
  EXPECT_GT(chain_mean, 0.0);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(tree.tokens[i].size(), 24u) << "request " << i;
  const run_result again = run(*target, smollm()->tok, tree_options, prompts, params);
  EXPECT_EQ(again.tokens, tree.tokens);
}

TEST(draft_model_smollm, a_draft_with_another_vocabulary_is_refused) {
  if (!smollm()) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const std::optional<loaded_model>& gemma = load_once("gemma-3-270m-q4_k_m.gguf");
  if (!gemma) GTEST_SKIP() << "no gemma-3-270m in " << TESSERA_MODEL_DIR;
  const std::string why = vocabulary_mismatch(*smollm()->tok, *gemma->tok);
  EXPECT_NE(why, "");
  EXPECT_NE(why.find("vocabulary has"), std::string::npos) << why;
  auto target = smollm_executor(64, 0);
  EXPECT_THROW(llm_engine(*target, smollm()->tok, draft_options(64, 0, *gemma, 16)), invalid_request);
}

}  // namespace
}  // namespace tessera
