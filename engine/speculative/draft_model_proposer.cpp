#include "engine/speculative/draft_model_proposer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/base/error.hpp"
#include "engine/sampler.hpp"
#include "engine/speculative/verifier.hpp"

namespace tessera {

namespace {

// Greedy: the lowest id among the largest logits (max_element returns the first).
token_id argmax(std::span<const float> row) {
  return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Draws from sampling: non-null and not greedy (greedy params draw the argmax anyway).
bool samples(const draft_request& r, const draft_model_options& o) {
  return o.sample && r.sampling != nullptr && !r.sampling->greedy();
}

// The `count` most likely tokens of `row` after its argmax `best`, most likely first (ties: lower id).
void runners_up(std::span<const float> row, token_id best, int32_t count, std::vector<token_id>& out) {
  out.clear();
  for (int32_t n = 0; n < count; ++n) {
    token_id next = -1;
    for (size_t i = 0; i < row.size(); ++i) {
      const auto t = static_cast<token_id>(i);
      if (t == best || std::find(out.begin(), out.end(), t) != out.end()) continue;
      if (next < 0 || row[i] > row[static_cast<size_t>(next)]) next = t;
    }
    if (next < 0) return;
    out.push_back(next);
  }
}

block_manager_options pool_options(const executor& exec, const draft_model_options& o) {
  const kv_cache_spec& spec = exec.kv_spec();
  if (o.num_kv_blocks < 0 || o.num_kv_blocks > spec.num_device_blocks)
    throw invalid_request("the draft pool of " + std::to_string(o.num_kv_blocks) +
                          " blocks exceeds the draft executor's " + std::to_string(spec.num_device_blocks));
  block_manager_options b;
  b.block_size = spec.block_size;
  b.num_device_blocks = o.num_kv_blocks > 0 ? o.num_kv_blocks : spec.num_device_blocks;
  b.num_host_blocks = 0;  // a preempted sequence's draft state is dropped, not swapped
  // Draft K/V is rolled back below the computed length (rollback()): blocks are never indexed as
  // holding a prefix, and no window is freed (the tables stay whole, whatever the draft model).
  b.enable_prefix_caching = false;
  b.attention_window = 0;
  b.group_windows.assign(static_cast<size_t>(exec.kv_groups().num_groups()), 0);
  return b;
}

}  // namespace

// One request of a propose() round.
struct draft_model_proposer::active {
  size_t index = 0;  // into the requests and drafts
  seq_id seq;
  seq_state* state = nullptr;
  std::span<const token_id> tokens;
  int32_t k = 0;
  const draft_request* request = nullptr;
  bool samples = false;
  // A tree (options.branches > 1): per draft position, the leaves beside the chain's token there (its
  // row's runners-up, or further draws from its q).
  std::vector<std::vector<token_id>> leaves;
};

draft_model_proposer::draft_model_proposer(std::shared_ptr<executor> exec, int32_t target_vocab,
                                           const draft_model_options& options)
    : exec_(std::move(exec)),
      options_(options),
      blocks_(
          pool_options(exec_ ? *exec_ : throw invalid_request("the draft model proposer needs an executor"), options)) {
  const int32_t vocab = exec_->config().vocab_size;
  if (vocab != target_vocab)
    throw invalid_request("the draft model has " + std::to_string(vocab) + " logits per token, the target " +
                          std::to_string(target_vocab) + ": a draft model must share the target's vocabulary");
  if (options.max_batch_tokens < 1)
    throw invalid_request("the draft model's tokens per forward pass must be at least 1, got " +
                          std::to_string(options.max_batch_tokens));
  if (options.branches < 1)
    throw invalid_request("the draft model's branches per position must be at least 1, got " +
                          std::to_string(options.branches));
}

std::vector<draft_proposal> draft_model_proposer::propose(std::span<const draft_request> requests) {
  std::vector<draft_proposal> drafts(requests.size());
  const int32_t context = exec_->config().context_length;
  std::vector<active> batch;
  for (size_t i = 0; i < requests.size(); ++i) {
    const draft_request& r = requests[i];
    const auto n = static_cast<int32_t>(r.tokens.size());
    // The draft's last token is predicted from position n + k - 2: inside the draft model's context.
    const int32_t k = context > 0 ? std::min(r.max_tokens, context - n + 1) : r.max_tokens;
    if (k <= 0 || n == 0) continue;
    seq_state& st = seqs_[r.seq];
    // rollback() after every step keeps what the draft holds a strict prefix of the tokens (the last
    // token's row is what drafts). Anything else would be drafting from K/V of tokens the sequence
    // does not have: the state is rebuilt instead (counted; the tests require none).
    if (static_cast<int32_t>(st.computed.size()) >= n ||
        !std::equal(st.computed.begin(), st.computed.end(), r.tokens.begin())) {
      ++stats_.num_resyncs;
      st.computed.clear();
      blocks_.free(r.seq);
    }
    const auto c = static_cast<int32_t>(st.computed.size());
    const int32_t end = n + k - 1;                 // positions [c, end) get draft K/V this round
    scratch_.assign(static_cast<size_t>(end), 0);  // allocate_slots reads only its length here
    std::vector<block_copy> copies;
    if (!blocks_.allocate_slots(r.seq, scratch_, c, end - c, 0, copies)) {
      ++stats_.num_no_room;  // this sequence does not speculate this step
      continue;
    }
    if (!copies.empty()) throw std::logic_error("draft_model_proposer: a draft block was shared");
    batch.push_back({i, r.seq, &st, r.tokens, k, &r, samples(r, options_)});
  }
  if (batch.empty()) return drafts;
  ++stats_.num_rounds;
  try {
    // 1. Catch-up: every sequence's unseen tokens, chunked to max_batch_tokens per forward pass; the
    //    chunk that reaches a sequence's last token returns its row, which gives the first draft token.
    while (true) {
      step_batch step;
      std::vector<active*> who;
      int32_t budget = options_.max_batch_tokens;
      for (active& a : batch) {
        const auto c = static_cast<int32_t>(a.state->computed.size()), n = static_cast<int32_t>(a.tokens.size());
        if (c >= n || budget <= 0) continue;
        const int32_t m = std::min(n - c, budget);
        budget -= m;
        sequence_slice s;
        s.seq = a.seq;
        s.tokens.assign(a.tokens.begin() + c, a.tokens.begin() + c + m);
        s.num_computed = c;
        blocks_.tables_into(a.seq, s);
        s.logits = c + m == n ? sequence_slice::logits_mode::last : sequence_slice::logits_mode::none;
        step.seqs.push_back(std::move(s));
        who.push_back(&a);
      }
      if (step.seqs.empty()) break;
      forward(step);
      for (size_t j = 0; j < who.size(); ++j) {
        const sequence_slice& s = step.seqs[j];
        who[j]->state->computed.insert(who[j]->state->computed.end(), s.tokens.begin(), s.tokens.end());
        if (s.logits == sequence_slice::logits_mode::last)
          draw(*who[j], out_.row(out_.first_row[j] + out_.num_rows[j] - 1), drafts[who[j]->index]);
      }
    }
    // 2. Decode: one forward pass per draft position, every sequence that wants more at once.
    for (size_t have = 1;; ++have) {
      step_batch step;
      std::vector<active*> who;
      for (active& a : batch) {
        const std::vector<token_id>& d = drafts[a.index].tokens;
        if (d.size() != have || static_cast<int32_t>(have) >= a.k) continue;
        sequence_slice s;
        s.seq = a.seq;
        s.tokens = {d.back()};
        s.num_computed = static_cast<int32_t>(a.state->computed.size());
        blocks_.tables_into(a.seq, s);
        s.logits = sequence_slice::logits_mode::last;
        step.seqs.push_back(std::move(s));
        who.push_back(&a);
      }
      if (step.seqs.empty()) break;
      forward(step);
      for (size_t j = 0; j < who.size(); ++j) {
        who[j]->state->computed.push_back(step.seqs[j].tokens.front());
        draw(*who[j], out_.row(out_.first_row[j] + out_.num_rows[j] - 1), drafts[who[j]->index]);
      }
    }
    for (active& a : batch) add_leaves(a, drafts[a.index]);
  } catch (const std::exception&) {
    // A failing draft model costs speculation, never the target's step: this round proposes nothing,
    // and the state it may have half-written is dropped (rebuilt when the sequences speculate again).
    ++stats_.num_failures;
    for (const active& a : batch) {
      drafts[a.index] = {};
      release(a.seq);
    }
  }
  return drafts;
}

void draft_model_proposer::draw(active& a, std::span<const float> row, draft_proposal& into) {
  if (!a.samples) {
    const token_id best = argmax(row);
    into.tokens.push_back(best);
    if (options_.branches > 1) {
      a.leaves.emplace_back();
      runners_up(row, best, options_.branches - 1, a.leaves.back());
    }
    return;
  }
  // Draft token j of this round sits at output position request.position + j: its own uniform there.
  const draft_request& r = *a.request;
  draft_distribution(row, *r.sampling, q_);
  const uint64_t position = r.position + into.tokens.size();
  const token_id t = draw_from(q_, speculative_uniform(r.stream_key, speculative_draw::draft, position));
  into.tokens.push_back(t >= 0 ? t : argmax(row));
  into.probs.insert(into.probs.end(), q_.begin(), q_.end());
  if (options_.branches > 1) {
    // More draws from the same q, without replacement: verify_sampled_tree's candidates after the
    // chain's token (recursive rejection sampling keeps the output the target's).
    a.leaves.emplace_back();
    draw_further_candidates(q_, into.tokens.back(), options_.branches, r.stream_key, position, a.leaves.back());
  }
}

// The chain is nodes 0 .. k-1 (each the child of the one before); position j's leaves hang under
// node j - 1 (-1: the sequence's last token), after the chain, so parents come before children, in
// the order they were found (a sampled tree's draw order, which its verification follows).
void draft_model_proposer::add_leaves(const active& a, draft_proposal& into) {
  if (a.leaves.empty() || into.tokens.empty()) return;
  const size_t chain = into.tokens.size();
  for (size_t i = 0; i < chain; ++i) into.parents.push_back(static_cast<int32_t>(i) - 1);
  for (size_t j = 0; j < chain && j < a.leaves.size(); ++j) {
    for (token_id t : a.leaves[j]) {
      into.tokens.push_back(t);
      into.parents.push_back(static_cast<int32_t>(j) - 1);
    }
  }
  if (into.tokens.size() == chain) into.parents.clear();  // no runner-up: a chain
}

void draft_model_proposer::forward(step_batch& step) {
  exec_->execute(step, out_);
  ++stats_.num_forwards;
  for (const sequence_slice& s : step.seqs) stats_.num_tokens_computed += s.tokens.size();
  for (size_t j = 0; j < step.seqs.size(); ++j) {
    const bool wants = step.seqs[j].logits != sequence_slice::logits_mode::none;
    if (wants && (out_.num_rows.size() <= j || out_.num_rows[j] < 1))
      throw std::runtime_error("the draft executor returned no logits");
  }
}

void draft_model_proposer::rollback(seq_id seq, std::span<const token_id> tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  std::vector<token_id>& computed = it->second.computed;
  // Draft K/V is valid exactly for the committed prefix it was computed on: positions past the first
  // difference (a rejected draft token, or the target's own token where the draft guessed another)
  // hold K/V of tokens the sequence does not have.
  const size_t common = static_cast<size_t>(
      std::mismatch(computed.begin(), computed.end(), tokens.begin(), tokens.end()).first - computed.begin());
  // The last token's row is what the next round drafts from: it is computed then, not kept now.
  const size_t keep = std::min(common, tokens.empty() ? size_t{0} : tokens.size() - 1);
  computed.resize(keep);
  blocks_.truncate(seq, static_cast<int32_t>(keep));
}

void draft_model_proposer::release(seq_id seq) {
  blocks_.free(seq);
  seqs_.erase(seq);
}

draft_pool_usage draft_model_proposer::pool_usage() const {
  return {blocks_.num_device_blocks(), blocks_.num_free_blocks(), static_cast<int32_t>(seqs_.size())};
}

int32_t draft_model_proposer::num_computed(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.computed.size());
}

}  // namespace tessera
