// The draft-model proposer (engine/speculative/draft_model_proposer.hpp) on the simulated executor, as
// target and as draft: each has its own KV pool, and the simulator checks every paging contract of
// both (a stale slot read, a block written while another sequence reads it) while its logits depend
// on the whole history it reads back from the cache. A draft that is the target's own simulator must
// then be accepted every time (any stale or rolled-back-too-little draft K/V would change its logits),
// greedy greedily and sampled requests with drafts sampled from q = p; greedy outputs, and seeded
// sampled outputs with argmax drafts, must be plain decoding's, the draft model must run one forward
// pass per draft position for the whole batch, and the draft pool must be empty after finishes,
// aborts and preemptions.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sim_executor.hpp"
#include "engine/speculative/draft_model_proposer.hpp"
#include "tests/support/greedy_params.hpp"

namespace tessera {
namespace {

using testing::markov_executor;
using testing::ranked_token;
using testing::sim_executor;

constexpr int32_t vocab = 64;
constexpr int32_t k_tokens = 4;

// A draft executor that checks the rollback directly: every position a draft forward pass attends to
// (before its first new token) that the target's sequence already has must hold the sequence's token
// there, not a rejected draft token of an earlier step. It shadows what each slot was written with.
class rollback_checker : public sim_executor {
 public:
  using sim_executor::sim_executor;
  const llm_engine* engine = nullptr;
  int64_t num_reads_checked = 0;
  int64_t num_stale_reads = 0;
  void execute(const step_batch& batch, step_output& out) override {
    const int32_t bs = kv_spec().block_size;
    for (const sequence_slice& s : batch.seqs) {
      const sequence* seq = engine ? engine->get_scheduler().find(s.seq) : nullptr;
      const auto slot = [&](int32_t p) { return std::pair{s.block_table[static_cast<size_t>(p / bs)], p % bs}; };
      for (int32_t p = 0; seq && p < s.num_computed && p < seq->num_tokens(); ++p) {
        auto it = written_.find(slot(p));
        ++num_reads_checked;
        if (it == written_.end() || it->second != seq->tokens[static_cast<size_t>(p)]) ++num_stale_reads;
      }
      for (size_t j = 0; j < s.tokens.size(); ++j)
        written_[slot(s.num_computed + static_cast<int32_t>(j))] = s.tokens[j];
    }
    sim_executor::execute(batch, out);
  }

 private:
  std::map<std::pair<block_id, int32_t>, token_id> written_;
};

// The simulator as a target that verifies token trees (a draft model's runners-up).
class tree_sim_executor : public sim_executor {
 public:
  tree_sim_executor(int32_t block_size, int32_t num_device_blocks, int32_t num_host_blocks, int32_t vocab_size)
      : sim_executor(block_size, num_device_blocks, num_host_blocks, vocab_size) {
    set_verifies_trees(true);
  }
};

engine_options opts(int32_t blocks, int32_t host, std::shared_ptr<executor> draft,
                    preemption_mode mode = preemption_mode::recompute) {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.num_host_blocks = host;
  o.watermark = 0;
  o.preemption = mode;
  if (draft) {
    o.speculative.mode = speculative_mode::draft;
    o.speculative.num_tokens = k_tokens;
    o.speculative.max_batch = 64;
    o.speculative.draft_executor = std::move(draft);
    o.speculative.draft.max_batch_tokens = 32;  // prompts of a batch take several catch-up chunks
  }
  return o;
}

sampling_params greedy(int32_t max_tokens) { return test_support::greedy_to_length(max_tokens); }

sampling_params seeded(int32_t max_tokens, uint64_t seed) {
  sampling_params p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<token_id> random_prompt(std::mt19937& rng, int32_t len) {
  std::vector<token_id> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(static_cast<token_id>(rng() % static_cast<uint32_t>(vocab)));
  return p;
}

struct run_result {
  std::vector<std::vector<token_id>> tokens;  // per request, in submission order (its choices' interleaved)
  std::map<std::pair<size_t, int32_t>, std::vector<token_id>> choices;  // per (request, choice index)
  engine_stats stats;
  draft_model_stats draft;
};

const draft_model_proposer* draft_of(const llm_engine& e) {
  return dynamic_cast<const draft_model_proposer*>(e.proposer());
}

// Runs every prompt to the end (aborting request `abort_index` after `abort_after` steps), checking the
// scheduler's invariants after every step, both executors' contracts, and that both pools are free.
template <class Target = sim_executor>
run_result run(int32_t blocks, int32_t host, std::shared_ptr<sim_executor> draft,
               const std::vector<std::vector<token_id>>& prompts, const std::vector<sampling_params>& params,
               preemption_mode mode = preemption_mode::recompute, int abort_index = -1, int abort_after = 0,
               bool sample_drafts = true, int32_t branches = 1) {
  Target exec(4, blocks, host, vocab);
  engine_options options = opts(blocks, host, draft, mode);
  options.speculative.draft.sample = sample_drafts;
  options.speculative.draft.branches = branches;
  llm_engine engine(exec, nullptr, options);
  if (auto* checker = dynamic_cast<rollback_checker*>(draft.get())) checker->engine = &engine;
  std::map<request_id, size_t> order;
  for (size_t i = 0; i < prompts.size(); ++i) order[engine.add_request(prompts[i], params[i % params.size()])] = i;
  run_result r;
  r.tokens.resize(prompts.size());
  for (int step = 0; step < 100000 && engine.has_unfinished(); ++step) {
    if (step == abort_after && abort_index >= 0)
      for (const auto& [id, i] : order)
        if (static_cast<int>(i) == abort_index) engine.abort(id);
    for (const request_output& o : engine.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      auto& t = r.tokens[order.at(o.id)];
      t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
      auto& c = r.choices[{order.at(o.id), o.index}];
      c.insert(c.end(), o.token_ids.begin(), o.token_ids.end());
    }
    const std::string inv = engine.get_scheduler().check_invariants();
    EXPECT_EQ(inv, "") << "step " << step;
    if (!inv.empty()) break;
  }
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_TRUE(exec.errors().empty()) << exec.errors()[0];
  const block_manager& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  EXPECT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks());
  r.stats = engine.stats();
  if (const draft_model_proposer* d = draft_of(engine)) {
    EXPECT_TRUE(draft->errors().empty()) << draft->errors()[0];
    const draft_pool_usage pool = d->pool_usage();
    EXPECT_EQ(pool.num_free_blocks, pool.num_blocks) << "draft blocks leaked";
    EXPECT_EQ(pool.num_sequences, 0) << "draft state leaked";
    EXPECT_EQ(d->blocks().check_invariants(), "");
    EXPECT_EQ(d->stats().num_resyncs, 0u) << "a draft state was not rolled back after its step";
    r.draft = d->stats();
  }
  return r;
}

std::vector<std::vector<token_id>> prompts_of(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<std::vector<token_id>> p;
  for (int i = 0; i < n; ++i) p.push_back(random_prompt(rng, 5 + i % 9));
  return p;
}

TEST(draft_model_proposer, the_targets_own_model_as_draft_is_always_accepted_batch_1_and_16) {
  for (const int batch : {1, 16}) {
    const auto prompts = prompts_of(3, batch);
    const auto plain = run(512, 0, nullptr, prompts, {greedy(40)});
    auto draft = std::make_shared<sim_executor>(4, 512, 0, vocab);
    const auto spec = run(512, 0, draft, prompts, {greedy(40)});
    EXPECT_EQ(spec.tokens, plain.tokens) << "batch " << batch;
    // The draft reads back exactly the committed history (rolled back after every verification), so
    // its argmax is the target's at every position.
    EXPECT_GT(spec.stats.num_draft_tokens, 0u);
    EXPECT_EQ(spec.stats.num_accepted_draft_tokens, spec.stats.num_draft_tokens) << "batch " << batch;
    EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps);
    EXPECT_EQ(spec.draft.num_failures, 0u);
    EXPECT_EQ(spec.draft.num_no_room, 0u);
  }
}

TEST(draft_model_proposer, one_draft_forward_per_draft_position_for_the_whole_batch) {
  const auto prompts = prompts_of(4, 16);
  auto draft = std::make_shared<sim_executor>(4, 512, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, {greedy(30)});
  ASSERT_GT(spec.draft.num_rounds, 0u);
  // A round is the catch-up pass and k - 1 decode passes for all sequences at once; the first rounds'
  // prompts take a few more catch-up chunks (32 tokens each). One pass per sequence would be 16x this.
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  EXPECT_LE(spec.draft.num_forwards, spec.draft.num_rounds * k_tokens + static_cast<uint64_t>(prompt_tokens / 32 + 1));
  EXPECT_EQ(static_cast<int64_t>(spec.draft.num_forwards), draft->num_steps());
}

TEST(draft_model_proposer, rejected_drafts_are_rolled_back_and_change_no_output) {
  // A Markov target and a history-hash draft: nearly every draft is rejected at its first token.
  const auto prompts = prompts_of(5, 12);
  const auto plain = run<markov_executor>(256, 0, nullptr, prompts, {greedy(32)});
  auto draft = std::make_shared<rollback_checker>(4, 256, 0, vocab);
  const auto spec = run<markov_executor>(256, 0, draft, prompts, {greedy(32)});
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.num_draft_tokens, 100u);
  EXPECT_LT(spec.stats.num_accepted_draft_tokens * 4, spec.stats.num_draft_tokens);
  // The draft model never attended to a rejected position: its K/V was rolled back every step.
  EXPECT_GT(draft->num_reads_checked, 1000);
  EXPECT_EQ(draft->num_stale_reads, 0);
}

TEST(draft_model_proposer, argmax_drafts_keep_seeded_sampling_plain_decodings) {
  const auto prompts = prompts_of(6, 8);
  std::vector<sampling_params> params;
  for (uint64_t s = 0; s < 8; ++s) params.push_back(seeded(30, 100 + s));
  const auto plain = run(512, 0, nullptr, prompts, params);
  auto draft = std::make_shared<rollback_checker>(4, 512, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, params, preemption_mode::recompute, -1, 0, /*sample_drafts=*/false);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
  EXPECT_LT(spec.stats.num_accepted_draft_tokens, spec.stats.num_draft_tokens);  // sampling rejects some
  EXPECT_EQ(draft->num_stale_reads, 0);
}

TEST(draft_model_proposer, sampled_drafts_of_the_targets_own_model_are_all_accepted_and_seeded_runs_repeat) {
  // Drafts drawn from q = the target's own distribution (same logits, temperature and top-p): p = q,
  // so min(1, p/q) = 1 and every draft token is accepted, which only holds when the draft's q rows are
  // the very distributions the verifier's p rows are (any stale draft K/V, misaligned q row or
  // off-by-one position would show as a rejection). A seeded run repeats token for token.
  const auto prompts = prompts_of(6, 8);
  std::vector<sampling_params> params;
  for (uint64_t s = 0; s < 8; ++s) params.push_back(seeded(30, 100 + s));
  auto draft = std::make_shared<rollback_checker>(4, 512, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, params);
  EXPECT_GT(spec.stats.num_draft_tokens, 100u);
  EXPECT_EQ(spec.stats.num_accepted_draft_tokens, spec.stats.num_draft_tokens);
  EXPECT_EQ(draft->num_stale_reads, 0);
  const auto again = run(512, 0, std::make_shared<sim_executor>(4, 512, 0, vocab), prompts, params);
  EXPECT_EQ(again.tokens, spec.tokens);
  // A draft model of its own (a first-order Markov model): some rejected, output still reproducible.
  const auto other = run(512, 0, std::make_shared<markov_executor>(4, 512, 0, vocab), prompts, params);
  EXPECT_LT(other.stats.num_accepted_draft_tokens, other.stats.num_draft_tokens);
  EXPECT_EQ(run(512, 0, std::make_shared<markov_executor>(4, 512, 0, vocab), prompts, params).tokens, other.tokens);
}

TEST(draft_model_proposer, parallel_sampling_gives_every_choice_its_own_draft_state) {
  // n = 3: the forks share the prompt's target blocks; each choice's draft state is its own (built
  // from the prompt on its first round) and released when it finishes.
  const auto prompts = prompts_of(11, 3);
  sampling_params p = seeded(24, 5);
  p.n = 3;
  p.logprobs = 1;
  const auto plain = run(512, 0, nullptr, prompts, {p});
  auto draft = std::make_shared<rollback_checker>(4, 512, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, {p}, preemption_mode::recompute, -1, 0, /*sample_drafts=*/false);
  EXPECT_EQ(plain.choices.size(), 9u);
  EXPECT_EQ(spec.choices, plain.choices);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
  EXPECT_EQ(draft->num_stale_reads, 0);
}

TEST(draft_model_proposer, preemption_by_swap_and_recompute_drops_and_rebuilds_the_draft_state) {
  const auto prompts = prompts_of(7, 16);
  const auto plain = run(512, 0, nullptr, prompts, {greedy(30)});
  for (const preemption_mode mode : {preemption_mode::recompute, preemption_mode::swap}) {
    auto draft = std::make_shared<rollback_checker>(4, 512, 0, vocab);
    // 40 blocks of 4 slots for 16 sequences of up to 43 tokens: they cannot all stay resident.
    const auto spec = run(40, 64, draft, prompts, {greedy(30)}, mode);
    EXPECT_EQ(spec.tokens, plain.tokens) << to_string(mode);
    EXPECT_GT(spec.stats.num_preemptions_recompute + spec.stats.num_preemptions_swap, 0u) << to_string(mode);
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u) << to_string(mode);
    EXPECT_EQ(spec.stats.num_accepted_draft_tokens, spec.stats.num_draft_tokens) << to_string(mode);
    EXPECT_EQ(draft->num_stale_reads, 0) << to_string(mode);
  }
}

TEST(draft_model_proposer, a_full_draft_pool_skips_speculation_never_the_target) {
  const auto prompts = prompts_of(8, 8);
  const auto plain = run(512, 0, nullptr, prompts, {greedy(30)});
  // 12 draft blocks of 4 slots: room for two or three sequences' drafts at a time.
  auto draft = std::make_shared<sim_executor>(4, 12, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, {greedy(30)});
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.draft.num_no_room, 0u);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
  EXPECT_EQ(spec.stats.num_preemptions_recompute + spec.stats.num_preemptions_swap, 0u);
}

TEST(draft_model_proposer, an_aborted_request_frees_its_draft_state) {
  const auto prompts = prompts_of(9, 6);
  auto draft = std::make_shared<sim_executor>(4, 512, 0, vocab);
  const auto spec = run(512, 0, draft, prompts, {greedy(40)}, preemption_mode::recompute, 2, 6);
  EXPECT_LT(spec.tokens[2].size(), 40u);
  EXPECT_EQ(spec.tokens[0].size(), 40u);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
}

TEST(draft_model_proposer, a_failing_draft_model_costs_speculation_not_output) {
  const auto prompts = prompts_of(10, 4);
  const auto plain = run(512, 0, nullptr, prompts, {greedy(30)});
  auto draft = std::make_shared<sim_executor>(4, 512, 0, vocab);
  draft->fail_at_step(3);
  const auto spec = run(512, 0, draft, prompts, {greedy(30)});
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.draft.num_failures, 1u);
  EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
}

TEST(draft_model_proposer, rollback_keeps_the_common_prefix_and_returns_the_rest) {
  auto exec = std::make_shared<sim_executor>(4, 16, 0, vocab);
  draft_model_proposer p(exec, vocab);
  const seq_id s{1};
  const std::vector<token_id> tokens{1, 2, 3, 4, 5, 6};
  const auto drafts = p.propose(std::vector<draft_request>{{s, tokens, 4}});
  ASSERT_EQ(drafts.size(), 1u);
  ASSERT_EQ(drafts[0].tokens.size(), 4u);
  EXPECT_TRUE(drafts[0].probs.empty());  // a greedy request: argmax drafts
  EXPECT_EQ(p.num_computed(s), 6 + 3);   // the tokens and the first three drafts (the fourth is not fed)
  EXPECT_EQ(p.pool_usage().num_free_blocks, 16 - 3);
  // The target accepted one draft token and then chose another: the K/V of tokens + drafts[0] stays.
  std::vector<token_id> committed = tokens;
  committed.push_back(drafts[0].tokens[0]);
  committed.push_back(drafts[0].tokens[1] == 0 ? 1 : 0);
  p.rollback(s, committed);
  EXPECT_EQ(p.num_computed(s), 7);
  EXPECT_EQ(p.pool_usage().num_free_blocks, 16 - 2);
  // Where the target's own token equals what the draft fed at that position, that K/V stays too, but
  // never the sequence's last token: its row is what the next round drafts from.
  std::vector<token_id> lucky = tokens;
  lucky.insert(lucky.end(), drafts[0].tokens.begin(), drafts[0].tokens.begin() + 1);
  p.rollback(s, lucky);
  EXPECT_EQ(p.num_computed(s), 6);
  p.release(s);
  EXPECT_EQ(p.pool_usage().num_free_blocks, 16);
  EXPECT_EQ(p.pool_usage().num_sequences, 0);
  EXPECT_TRUE(exec->errors().empty());
}

TEST(draft_model_proposer, branches_add_runners_up_or_further_draws_as_leaves_beside_the_chain) {
  auto exec = std::make_shared<sim_executor>(4, 16, 0, vocab);
  draft_model_proposer p(exec, vocab, {.max_batch_tokens = 512, .sample = true, .branches = 3});
  const std::vector<token_id> tokens{1, 2, 3, 4, 5, 6};
  const auto drafts = p.propose(std::vector<draft_request>{{seq_id{1}, tokens, 3}});
  ASSERT_EQ(drafts.size(), 1u);
  const draft_proposal& t = drafts[0];
  ASSERT_EQ(t.tokens.size(), 3u + 3u * 2u);
  // The chain first (each node the child of the one before), then position j's ranks 1 and 2 under
  // chain node j - 1.
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, -1, -1, 0, 0, 1, 1}));
  std::vector<token_id> history = tokens;
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(t.tokens[j], ranked_token(history, vocab, 0)) << "position " << j;
    EXPECT_EQ(t.tokens[3 + 2 * j], ranked_token(history, vocab, 1)) << "position " << j;
    EXPECT_EQ(t.tokens[4 + 2 * j], ranked_token(history, vocab, 2)) << "position " << j;
    history.push_back(t.tokens[j]);
  }
  // A request that samples gets the same shape, its leaves further draws from each position's q (the
  // chain's token drawn first): distinct from it and from each other, where q has mass; q's rows come
  // with it, one per position.
  sampling_params sampled = seeded(8, 1);
  draft_request r{seq_id{2}, tokens, 3, &sampled, 7, 0};
  const auto drawn = p.propose(std::vector<draft_request>{r});
  const draft_proposal& d = drawn[0];
  ASSERT_EQ(d.tokens.size(), 3u + 3u * 2u);
  EXPECT_EQ(d.parents, t.parents);
  ASSERT_EQ(d.probs.size(), 3u * vocab);
  for (size_t j = 0; j < 3; ++j) {
    const std::vector<token_id> candidates{d.tokens[j], d.tokens[3 + 2 * j], d.tokens[4 + 2 * j]};
    for (size_t a = 0; a < 3; ++a) {
      EXPECT_GT(d.probs[j * vocab + static_cast<size_t>(candidates[a])], 0.0f) << "position " << j;
      for (size_t b = 0; b < a; ++b) EXPECT_NE(candidates[a], candidates[b]) << "position " << j;
    }
  }
  // The same request drafted again (seeded: the same uniforms) draws the same tree.
  p.release(seq_id{2});
  EXPECT_EQ(p.propose(std::vector<draft_request>{r})[0].tokens, d.tokens);
  p.release(seq_id{1});
  p.release(seq_id{2});
  EXPECT_EQ(p.pool_usage().num_free_blocks, 16);
}

TEST(draft_model_proposer, runner_up_trees_give_plain_decodings_tokens_and_take_side_branches) {
  // A first-order Markov draft for the history-hash target: its argmax is often wrong, and then the
  // target's token is now and then one of its runners-up, accepted from a side branch (the next step
  // computes it, scheduler::accept_draft). Greedy, and seeded sampling with argmax drafts, must still be
  // plain decoding's token for token, at batch 16 and under preemption by a tiny pool.
  const auto prompts = prompts_of(21, 16);
  std::vector<sampling_params> params{greedy(30)};
  for (uint64_t s = 0; s < 3; ++s) params.push_back(seeded(30, 200 + s));
  const auto plain = run(512, 0, nullptr, prompts, params);
  for (const int32_t blocks : {512, 40}) {
    auto draft = std::make_shared<markov_executor>(4, 512, 0, vocab);
    const auto spec = run<tree_sim_executor>(blocks, 0, draft, prompts, params, preemption_mode::recompute, -1, 0,
                                             /*sample_drafts=*/false, /*branches=*/4);
    EXPECT_EQ(spec.tokens, plain.tokens) << blocks << " blocks";
    EXPECT_GT(spec.stats.num_tree_branch_tokens, 0u) << blocks << " blocks";
    EXPECT_GT(spec.stats.num_accepted_draft_tokens, 0u);
  }
  // An executor that does not verify trees gets the chain: the same tokens, nothing from side branches.
  const auto chains = run(512, 0, std::make_shared<markov_executor>(4, 512, 0, vocab), prompts, params,
                          preemption_mode::recompute, -1, 0, /*sample_drafts=*/false, /*branches=*/4);
  EXPECT_EQ(chains.tokens, plain.tokens);
  EXPECT_EQ(chains.stats.num_tree_branch_tokens, 0u);
}

TEST(draft_model_proposer, a_draft_with_another_vocabulary_size_is_refused) {
  auto exec = std::make_shared<sim_executor>(4, 16, 0, 32);
  EXPECT_THROW(draft_model_proposer(exec, vocab), invalid_request);
  sim_executor target(4, 64, 0, vocab);
  EXPECT_THROW(llm_engine(target, nullptr, opts(64, 0, exec)), invalid_request);
  engine_options no_draft = opts(64, 0, exec);
  no_draft.speculative.draft_executor = nullptr;
  EXPECT_THROW(llm_engine(target, nullptr, no_draft), invalid_request);
}

}  // namespace
}  // namespace tessera
