// Scheduler tests: table-driven scenarios (what runs in step i) and randomized workloads executed
// on the paging-checking simulated executor, compared with an oracle generation.
#include "engine/scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "engine/base/error.hpp"
#include "engine/sim_executor.hpp"

namespace tessera {
namespace {

using testing::ranked_token;
using testing::sim_executor;
using testing::visible_history;

constexpr int32_t vocab = 64;
constexpr token_id eos = 0;

// Drives scheduler + simulated executor the way llm_engine does, with greedy sampling on the fake
// logits; an n > 1 request forks after its prompt, choice c starting from the rank-c token.
struct driver {
  struct request {
    std::vector<token_id> prompt;
    int32_t max_tokens = 0;
    int32_t n = 1;
    bool stop_at_eos = true;
    bool forked = false;
    bool aborted = false;
    int32_t num_live = 0;
    int32_t num_finishes = 0;                          // of sequences; == n once done
    std::map<int32_t, std::vector<token_id>> outputs;  // choice -> generated tokens
  };

  scheduler sched;
  sim_executor exec;
  std::map<request_id, request> requests;
  std::map<seq_id, request_id> seq_request;
  seq_id next_seq = seq_id{1000};
  uint64_t arrival = 0;
  std::vector<std::string> problems;
  // The fake device's step time, fed to the step cost model after every step (null: nothing fed).
  std::function<double(const step_shape&)> fake_seconds;

  // model_window: the fake model's sliding window (-1: the block manager's attention_window; a window
  // with attention_window 0 is the same model with block freeing off).
  explicit driver(const scheduler_options& o, int32_t model_window = -1)
      : sched(o), exec(o.blocks.block_size, o.blocks.num_device_blocks, o.blocks.num_host_blocks, vocab) {
    exec.set_window(model_window < 0 ? o.blocks.attention_window : model_window);  // the sim reads only the window
  }

  // The fake model's token of rank `rank` after `history` (what its window shows of it).
  token_id next_token(std::span<const token_id> history, int32_t rank) const {
    return ranked_token(visible_history(history, exec.window()), vocab, rank);
  }

  void add(request_id id, std::vector<token_id> prompt, int32_t max_tokens, int32_t n = 1, int32_t priority = 0,
           bool stop_at_eos = true) {
    request& r = requests[id];
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.n = n;
    r.stop_at_eos = stop_at_eos;
    auto s = std::make_unique<sequence>();
    s->id = seq_id{id.value()};  // the first sequence of a request takes the request id's number
    s->request = id;
    s->priority = priority;
    s->arrival = arrival++;
    s->tokens = std::move(prompt);
    s->num_prompt_tokens = s->num_tokens();
    sched.add(std::move(s));
    seq_request[seq_id{id.value()}] = id;
    r.num_live = 1;
  }

  void finish_seq(seq_id s, lifecycle_stage stage) {
    auto seq = sched.finish(s, stage);
    if (!seq) {
      problems.push_back("finish of unknown sequence " + std::to_string(s.value()));
      return;
    }
    request& r = requests[seq->request];
    ++r.num_finishes;
    --r.num_live;
  }

  void abort(request_id id) {
    request& r = requests[id];
    r.aborted = true;
    std::vector<seq_id> live;
    for (auto& [s, req] : seq_request)
      if (req == id && sched.find(s)) live.push_back(s);
    for (seq_id s : live) finish_seq(s, lifecycle_stage::aborted);
    // Sequences a fork would have created never come to exist: count them as terminated.
    if (!r.forked) r.num_finishes += r.n - 1;
  }

  // One engine step; returns the plan so tests can inspect it.
  scheduler_output step() {
    scheduler_output plan = sched.schedule();
    step_batch batch = sched.make_batch(plan);
    step_output out;
    exec.execute(batch, out);
    sched.commit(plan);
    if (fake_seconds && !plan.scheduled.empty()) sched.observe_step(plan, fake_seconds(plan.shape));
    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const scheduled_sequence& s = plan.scheduled[i];
      if (!s.samples) continue;
      if (out.num_rows[i] != 1) problems.push_back("missing logits");
      sequence* seq = s.seq;
      request& r = requests[seq->request];
      if (r.n > 1 && !r.forked) {
        r.forked = true;
        for (int32_t c = 1; c < r.n; ++c) {
          const seq_id child = next_seq;
          next_seq = next_seq.next();
          sched.fork(seq->id, child, c);
          seq_request[child] = seq->request;
          ++r.num_live;
          append(child, next_token(seq->tokens, c));
        }
      }
      append(seq->id, next_token(seq->tokens, 0));
    }
    std::string inv = sched.check_invariants();
    if (!inv.empty()) problems.push_back("step " + std::to_string(plan.step) + ": " + inv);
    return plan;
  }

  void append(seq_id id, token_id t) {
    sched.append_token(id, t);
    sequence* seq = sched.find(id);
    request& r = requests[seq->request];
    r.outputs[seq->choice_index].push_back(t);
    if ((r.stop_at_eos && t == eos) || seq->num_generated() >= r.max_tokens || seq->num_tokens() >= sched.max_seq_len())
      finish_seq(id, lifecycle_stage::finished);
  }

  std::vector<token_id> oracle(const request& r, int32_t choice) const {
    std::vector<token_id> history = r.prompt, out;
    while (true) {
      const token_id t = next_token(history, out.empty() ? choice : 0);
      history.push_back(t);
      out.push_back(t);
      if ((r.stop_at_eos && t == eos) || static_cast<int32_t>(out.size()) >= r.max_tokens ||
          static_cast<int32_t>(history.size()) >= sched.max_seq_len())
        return out;
    }
  }
};

// "A:5 B:3 | -B(recompute,kv_full) +B(swap_in)": scheduled chunks, then preemption/swap-in events.
std::string describe(const scheduler_output& plan, const std::map<request_id, char>& names) {
  std::ostringstream os;
  bool first = true;
  for (const auto& s : plan.scheduled) {
    os << (first ? "" : " ") << names.at(s.request) << ':' << s.num_new_tokens;
    first = false;
  }
  for (const auto& e : plan.events) {
    if (e.kind == event_kind::preempted_recompute || e.kind == event_kind::preempted_swap) {
      os << " -" << names.at(e.request) << '(' << (e.kind == event_kind::preempted_swap ? "swap" : "recompute") << ','
         << to_string(e.reason) << ')';
    } else if (e.kind == event_kind::swapped_in) {
      os << " +" << names.at(e.request) << "(swap_in)";
    } else if (e.kind == event_kind::prefix_cache_hit) {
      os << " " << names.at(e.request) << "(cached " << e.num_blocks << ")";
    }
  }
  return os.str();
}

scheduler_options small_options(int32_t block_size, int32_t num_blocks, int32_t num_host, int32_t max_seqs,
                                int32_t max_tokens, preemption_mode mode, bool caching = true) {
  scheduler_options o;
  o.blocks = {block_size, num_blocks, num_host, caching};
  o.max_num_seqs = max_seqs;
  o.max_num_batched_tokens = max_tokens;
  o.preemption = mode;
  o.watermark = 0;
  o.kv_block_bytes = 1024;
  return o;
}

std::vector<token_id> prompt(int32_t n, token_id base) {
  std::vector<token_id> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(base + i % 50 + 1);  // never eos
  return p;
}

struct table_case {
  const char* name;
  scheduler_options options;
  // (step at which it arrives, name, prompt length, max_tokens, priority)
  struct arrival {
    int step;
    char name;
    int32_t prompt_len;
    int32_t max_tokens;
    int32_t priority;
  };
  std::vector<arrival> arrivals;
  std::vector<std::string> expected;  // per step
};

void run_table(const table_case& tc) {
  driver d(tc.options);
  std::map<request_id, char> names;
  for (size_t step = 0; step < tc.expected.size(); ++step) {
    for (const auto& a : tc.arrivals) {
      if (a.step != static_cast<int>(step)) continue;
      const request_id id = static_cast<request_id>(a.name);
      names[id] = a.name;
      // Distinct token bases per request so prompts never share a prefix by accident.
      d.add(id, prompt(a.prompt_len, static_cast<token_id>(a.name - 'A') * 5 + 1), a.max_tokens, 1, a.priority, false);
    }
    const std::string got = describe(d.step(), names);
    EXPECT_EQ(got, tc.expected[step]) << tc.name << ", step " << step;
  }
  EXPECT_TRUE(d.problems.empty()) << tc.name << ": " << (d.problems.empty() ? "" : d.problems[0]);
  EXPECT_TRUE(d.exec.errors().empty()) << tc.name << ": " << (d.exec.errors().empty() ? "" : d.exec.errors()[0]);
}

TEST(scheduler, table_driven_steps) {
  const std::vector<table_case> cases = {
      {"chunked prefill: decodes first, prompt chunks fill the token budget",
       small_options(4, 64, 0, 8, 8, preemption_mode::recompute),
       {{0, 'A', 5, 3, 0}, {0, 'B', 12, 2, 0}},
       {"A:5 B:3", "A:1 B:7", "A:1 B:2", "B:1", ""}},
      {"max_num_seqs holds the third request back",
       small_options(4, 64, 0, 2, 64, preemption_mode::recompute),
       {{0, 'A', 4, 2, 0}, {0, 'B', 4, 2, 0}, {0, 'C', 4, 2, 0}},
       {"A:4 B:4", "A:1 B:1", "C:4", "C:1", ""}},
      {"kv full: the later request is preempted by recompute, then revives its cached prompt",
       small_options(4, 4, 0, 8, 64, preemption_mode::recompute),
       {{0, 'A', 8, 3, 0}, {0, 'B', 8, 2, 0}},
       // A's new block evicts B's least recently freed (tail) block: only B's first block is reused.
       {"A:8 B:8", "A:1 -B(recompute,kv_full)", "A:1", "B:5 B(cached 1)", ""}},
      {"kv full without prefix caching recomputes everything",
       small_options(4, 4, 0, 8, 64, preemption_mode::recompute, false),
       {{0, 'A', 8, 3, 0}, {0, 'B', 8, 2, 0}},
       {"A:8 B:8", "A:1 -B(recompute,kv_full)", "A:1", "B:9", ""}},
      {"kv full with swap: swapped back in once blocks are free, before new admissions",
       small_options(4, 4, 8, 8, 64, preemption_mode::swap),
       {{0, 'A', 8, 3, 0}, {0, 'B', 8, 2, 0}, {2, 'C', 4, 1, 0}},
       // step 2: C would fit in the free block but waits behind the swapped B.
       {"A:8 B:8", "A:1 -B(swap,kv_full)", "A:1", "B:1 C:4 +B(swap_in)", ""}},
      {"swap falls back to recompute when the host pool is too small",
       small_options(4, 4, 1, 8, 64, preemption_mode::swap),
       {{0, 'A', 8, 3, 0}, {0, 'B', 8, 2, 0}},
       {"A:8 B:8", "A:1 -B(recompute,kv_full)", "A:1", "B:5 B(cached 1)", ""}},
      {"a more important request preempts a running one",
       small_options(4, 4, 0, 8, 64, preemption_mode::recompute),
       {{0, 'A', 12, 4, 1}, {1, 'B', 8, 1, 0}},
       {"A:12", "B:8 -A(recompute,priority)", "A:5 A(cached 2)", "A:1", "A:1", ""}},
      {"waiting requests are admitted by priority, then arrival",
       small_options(4, 64, 0, 1, 64, preemption_mode::recompute),
       {{0, 'A', 4, 2, 0}, {1, 'B', 4, 1, 2}, {1, 'C', 4, 1, 1}, {1, 'D', 4, 1, 1}},
       {"A:4", "A:1", "C:4", "D:4", "B:4", ""}},
      {"the last running sequence preempts itself when it cannot grow",
       small_options(4, 3, 0, 8, 64, preemption_mode::recompute, false),
       {{0, 'A', 4, 2, 0}, {0, 'B', 4, 2, 0}},
       {"A:4 B:4", "A:1 -B(recompute,kv_full)", "B:5", ""}},
  };
  for (const auto& tc : cases) run_table(tc);
}

TEST(scheduler, rejects_requests_that_can_never_run) {
  scheduler_options o = small_options(4, 8, 0, 8, 64, preemption_mode::recompute);
  o.max_model_len = 20;
  driver d(o);
  EXPECT_THROW(d.add(request_id{1}, prompt(21, 1), 4), invalid_request);
  EXPECT_THROW(d.add(request_id{2}, {}, 4), invalid_request);
  scheduler_options big = small_options(4, 8, 0, 8, 64, preemption_mode::recompute);
  driver d2(big);
  EXPECT_THROW(d2.add(request_id{3}, prompt(33, 1), 4), invalid_request);  // 9 blocks > 8
  d2.add(request_id{4}, prompt(32, 1), 4);                                 // exactly the whole cache
  while (d2.sched.has_unfinished()) d2.step();
  EXPECT_EQ(d2.requests[request_id{4}].outputs[0].size(), 1u);  // max_seq_len reached after one token
  EXPECT_TRUE(d2.exec.errors().empty());
}

// ---- sliding-window attention ------------------------------------------------------------------

scheduler_options window_options(int32_t block_size, int32_t num_blocks, int32_t num_host, int32_t max_tokens,
                                 int32_t window, preemption_mode mode = preemption_mode::recompute) {
  scheduler_options o = small_options(block_size, num_blocks, num_host, 8, max_tokens, mode);
  o.blocks.attention_window = window;
  return o;
}

std::vector<token_id> run_alone(driver& d, request_id id, const std::vector<token_id>& p, int32_t max_tokens,
                                std::vector<int32_t>* held = nullptr) {
  d.add(id, p, max_tokens, 1, 0, false);
  while (d.sched.has_unfinished()) {
    d.step();
    for (const sequence* s : d.sched.running())
      if (held) held->push_back(d.sched.blocks().num_blocks(s->id));
  }
  return d.requests[id].outputs[0];
}

TEST(scheduler, window_frees_blocks_and_changes_no_output) {
  // Block size 4, window 6, prefill chunks of 8: between steps a sequence holds the blocks of its last
  // 5 positions, at most ceil(5 / 4) + 1 = 3; without freeing it holds its whole length.
  for (const int32_t chunk : {8, 64}) {
    driver on(window_options(4, 64, 0, chunk, 6));
    driver off(window_options(4, 64, 0, chunk, 0), /*model_window=*/6);
    std::vector<int32_t> held_on, held_off;
    const auto p = prompt(50, 3);
    const auto got_on = run_alone(on, request_id{1}, p, 30, &held_on);
    const auto got_off = run_alone(off, request_id{1}, p, 30, &held_off);
    EXPECT_EQ(got_on, on.oracle(on.requests[request_id{1}], 0));
    EXPECT_EQ(got_on, got_off) << "freeing blocks the window no longer reads changes nothing";
    ASSERT_FALSE(held_on.empty());
    EXPECT_LE(*std::max_element(held_on.begin(), held_on.end()), 3) << "chunk " << chunk;
    EXPECT_EQ(*std::max_element(held_off.begin(), held_off.end()), on.sched.blocks().blocks_for(79));
    EXPECT_EQ(on.sched.blocks().num_window_freed_blocks(), (79 - 5) / 4) << "every dead block, once";
    EXPECT_EQ(off.sched.blocks().num_window_freed_blocks(), 0);
    for (driver* d : {&on, &off}) {
      EXPECT_TRUE(d->problems.empty()) << d->problems.front();
      EXPECT_TRUE(d->exec.errors().empty()) << d->exec.errors().front();
      EXPECT_EQ(d->sched.blocks().num_free_blocks(), 64);
    }
  }
}

TEST(scheduler, window_record_reports_held_and_freed_blocks) {
  driver d(window_options(4, 64, 0, 64, 6));
  d.add(request_id{1}, prompt(30, 1), 4, 1, 0, false);
  step_record r;
  d.sched.fill_record(d.step(), r);
  ASSERT_EQ(r.running.size(), 1u);
  EXPECT_EQ(r.running[0].num_window_freed, (30 - 5) / 4);
  EXPECT_EQ(r.running[0].num_blocks, 8 - (30 - 5) / 4);
  EXPECT_EQ(r.device.num_used, r.running[0].num_blocks);
  EXPECT_EQ(r.device.num_cached, (30 - 5) / 4) << "freed full blocks stay in the prefix cache";
}

TEST(scheduler, window_lets_a_sequence_outgrow_the_cache) {
  // 6 blocks of 4 = 24 slots. With window 6 and chunks of at most 8, a lone sequence holds at most
  // ceil((6 + 8 - 2) / 4) + 1 = 4 blocks during a step: it runs to max_model_len, past the cache size.
  scheduler_options o = window_options(4, 6, 0, 8, 6);
  o.max_model_len = 200;
  driver d(o);
  EXPECT_EQ(d.sched.max_seq_len(), 200);
  const auto p = prompt(60, 5);
  const auto got = run_alone(d, request_id{1}, p, 40);
  EXPECT_EQ(got.size(), 40u);
  EXPECT_EQ(got, d.oracle(d.requests[request_id{1}], 0));
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
  EXPECT_TRUE(d.exec.errors().empty()) << d.exec.errors().front();
  // Without a window, or with chunks too large for the worst step to fit, the cache bounds the length.
  for (const auto& [window, chunk] : {std::pair{0, 8}, std::pair{6, 64}}) {
    scheduler_options small = window_options(4, 6, 0, chunk, window);
    small.max_model_len = 200;
    driver bounded(small);
    EXPECT_EQ(bounded.sched.max_seq_len(), 24);
    EXPECT_THROW(bounded.add(request_id{2}, p, 4), invalid_request);
  }
}

TEST(scheduler, window_preemption_swaps_only_held_blocks_and_readmits) {
  for (const preemption_mode mode : {preemption_mode::swap, preemption_mode::recompute}) {
    // Window 17 (at most 5 blocks of 4 held between steps), 8 blocks, chunks of 8 (so sequences may
    // outgrow the cache: max_model_len). A (priority 1) runs alone until its leading blocks are freed;
    // then B and C, more important, arrive and preempt it (priority); meanwhile they outgrow the cache
    // together until the window caps them (kv_full). A comes back by swap-in (its freed entries stay
    // freed) or is recomputed from position 0 in chunks, freeing as it goes.
    scheduler_options o = window_options(4, 8, 32, 8, 17, mode);
    o.max_model_len = 100;
    driver d(o);
    ASSERT_EQ(d.sched.max_seq_len(), 100);
    d.add(request_id{1}, prompt(8, 10), 40, 1, /*priority=*/1, false);
    while (d.sched.find(seq_id{1})->num_computed < 28) d.step();
    ASSERT_GT(d.sched.blocks().num_freed_blocks(seq_id{1}), 0);
    d.add(request_id{2}, prompt(16, 20), 24, 1, 0, false);
    d.add(request_id{3}, prompt(16, 30), 24, 1, 0, false);
    int64_t preemptions = 0, of_a = 0;
    while (d.sched.has_unfinished()) {
      const scheduler_output plan = d.step();
      for (const engine_event& e : plan.events) {
        const block_manager& bm = d.sched.blocks();
        if (e.kind == event_kind::preempted_swap) {
          ++preemptions;
          EXPECT_EQ(e.num_blocks, bm.num_host_blocks_of(e.seq)) << "a swap moves the held blocks";
          EXPECT_EQ(e.num_blocks + bm.num_freed_blocks(e.seq), bm.num_logical_blocks(e.seq)) << "and only those";
          EXPECT_LE(e.num_blocks, 5);
          EXPECT_EQ(e.swap_bytes, int64_t{e.num_blocks} * 1024);
          of_a += e.seq == seq_id{1} && bm.num_freed_blocks(e.seq) > 0;
        }
        if (e.kind == event_kind::preempted_recompute) {
          ++preemptions;
          EXPECT_LE(e.num_blocks, 5) << "the blocks it held";
          of_a += e.seq == seq_id{1} && bm.blocks_outside_window(e.recompute_tokens) > 0;
        }
      }
      ASSERT_LT(plan.step, 2000u);
    }
    EXPECT_GT(preemptions, 1) << to_string(mode);
    EXPECT_GT(of_a, 0) << to_string(mode) << ": A was preempted with freed leading blocks";
    for (uint64_t r = 1; r <= 3; ++r)
      EXPECT_EQ(d.requests[request_id{r}].outputs[0], d.oracle(d.requests[request_id{r}], 0))
          << to_string(mode) << " " << r;
    EXPECT_EQ(d.requests[request_id{1}].outputs[0].size(), 40u);
    EXPECT_TRUE(d.problems.empty()) << d.problems.front();
    EXPECT_TRUE(d.exec.errors().empty()) << d.exec.errors().front();
    EXPECT_EQ(d.sched.blocks().num_free_blocks(), 8);
    EXPECT_EQ(d.sched.blocks().num_free_host_blocks(), 32);
  }
}

TEST(scheduler, window_forks_share_the_window_blocks) {
  driver d(window_options(4, 64, 0, 64, 6));
  const auto p = prompt(30, 2);
  d.add(request_id{1}, p, 10, 3, 0, false);
  d.step();  // the prompt, then the fork into 3 choices
  ASSERT_EQ(d.sched.num_running(), 3);
  const auto& first = d.sched.blocks().block_table(d.sched.running()[0]->id);
  for (const sequence* s : d.sched.running()) {
    EXPECT_EQ(d.sched.blocks().num_freed_blocks(s->id), (30 - 5) / 4);
    EXPECT_EQ(d.sched.blocks().block_table(s->id), first) << "shared, freed entries included";
  }
  while (d.sched.has_unfinished()) d.step();
  const auto& r = d.requests[request_id{1}];
  for (int32_t c = 0; c < 3; ++c) EXPECT_EQ(r.outputs.at(c), d.oracle(r, c)) << "choice " << c;
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
  EXPECT_TRUE(d.exec.errors().empty()) << d.exec.errors().front();
  EXPECT_EQ(d.sched.blocks().num_free_blocks(), 64);
}

TEST(scheduler, window_prefix_hit_after_the_leading_blocks_were_evicted) {
  // A 40-token prompt finishes; its blocks are cached-free, the leading ones (freed first, for the
  // window) at the front of the LRU list. A filler request evicts some of them. The same prompt again
  // still hits 9 blocks (36 tokens): it needs only the blocks its window reads (positions 31..35).
  driver d(window_options(4, 14, 0, 64, 6));
  const auto p = prompt(40, 4);
  run_alone(d, request_id{1}, p, 2);
  EXPECT_EQ(d.sched.blocks().num_cached_free_blocks(), 10);
  run_alone(d, request_id{2}, prompt(24, 30), 1);  // 6 blocks: the 4 plain free ones, then the 2 oldest cached
  const std::vector<token_id> head(p.begin(), p.begin() + 9);
  EXPECT_EQ(d.sched.blocks().cached_prefix_tokens(head), 0) << "blocks 0 and 1 were evicted";
  d.add(request_id{3}, p, 6, 1, 0, false);
  const scheduler_output plan = d.step();
  bool hit = false;
  for (const engine_event& e : plan.events) {
    if (e.kind != event_kind::prefix_cache_hit) continue;
    hit = true;
    EXPECT_EQ(e.num_blocks, 9);
  }
  EXPECT_TRUE(hit);
  // Admitted at 36 computed with blocks 7..8 taken (0..6 are outside its window), then 40 committed.
  EXPECT_EQ(d.sched.blocks().num_freed_blocks(seq_id{3}), (40 - 5) / 4);
  while (d.sched.has_unfinished()) d.step();
  EXPECT_EQ(d.requests[request_id{3}].outputs[0], d.oracle(d.requests[request_id{3}], 0));
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
  EXPECT_TRUE(d.exec.errors().empty()) << d.exec.errors().front();
}

TEST(scheduler, waiting_reasons_and_watermark) {
  scheduler_options o = small_options(4, 100, 0, 8, 512, preemption_mode::recompute);
  o.watermark = 0.10;  // 10 blocks
  driver d(o);
  d.add(request_id{1}, prompt(85 * 4, 1), 50, 1, 0, false);  // 85 blocks
  d.step();
  d.add(request_id{2}, prompt(9 * 4, 7), 5, 1, 0, false);  // 9 more blocks + watermark 10 > 15 free
  d.step();
  const sequence* s2 = d.sched.find(seq_id{2});
  ASSERT_NE(s2, nullptr);
  EXPECT_EQ(s2->status, sequence_status::waiting);
  EXPECT_EQ(s2->waiting, waiting_reason::kv_full);
  step_record r;
  d.sched.fill_record(d.step(), r);
  EXPECT_EQ(r.num_waiting_by_reason[static_cast<size_t>(waiting_reason::kv_full)], 1);
  EXPECT_EQ(r.num_running, 1);
  d.abort(request_id{1});
  d.step();
  EXPECT_EQ(d.sched.find(seq_id{2})->status, sequence_status::running);

  scheduler_options o2 = small_options(4, 100, 0, 1, 512, preemption_mode::recompute);
  driver d2(o2);
  d2.add(request_id{1}, prompt(8, 1), 5);
  d2.add(request_id{2}, prompt(8, 9), 5);
  d2.step();
  EXPECT_EQ(d2.sched.find(seq_id{2})->waiting, waiting_reason::max_seqs);
  scheduler_options o3 = small_options(4, 100, 0, 8, 10, preemption_mode::recompute);
  driver d3(o3);
  d3.add(request_id{1}, prompt(10, 1), 5);
  d3.add(request_id{2}, prompt(8, 9), 5);
  d3.step();
  EXPECT_EQ(d3.sched.find(seq_id{2})->waiting, waiting_reason::token_budget);
}

TEST(scheduler, automatic_mode_follows_the_cost_model) {
  for (const bool cheap_swap : {true, false}) {
    scheduler_options o = small_options(4, 4, 8, 8, 64, preemption_mode::automatic);
    o.kv_block_bytes = 1 << 20;
    o.swap_bytes_per_second = cheap_swap ? 1e12 : 1e6;  // 2 MiB out+in: 2 us vs 2 s
    o.prefill_tokens_per_second = 1000;                 // 8 tokens: 8 ms
    driver d(o);
    d.add(request_id{1}, prompt(8, 1), 3, 1, 0, false);
    d.add(request_id{2}, prompt(8, 20), 2, 1, 0, false);
    d.step();
    auto plan = d.step();
    ASSERT_EQ(plan.events.size(), 1u);
    const engine_event& e = plan.events[0];
    EXPECT_EQ(e.kind, cheap_swap ? event_kind::preempted_swap : event_kind::preempted_recompute);
    EXPECT_EQ(e.request, request_id{2});
    EXPECT_EQ(e.reason, preemption_reason::kv_full);
    if (cheap_swap) {
      EXPECT_EQ(e.swap_bytes, 2 << 20);
      EXPECT_EQ(e.num_blocks, 2);
    } else {
      EXPECT_EQ(e.recompute_tokens, 8);
    }
    while (d.sched.has_unfinished()) d.step();
    EXPECT_TRUE(d.exec.errors().empty());
  }
}

TEST(scheduler, lifecycle_timeline_records_preemption_and_swap) {
  driver d(small_options(4, 4, 8, 8, 64, preemption_mode::swap));
  d.add(request_id{1}, prompt(8, 1), 3, 1, 0, false);
  d.add(request_id{2}, prompt(8, 20), 4, 1, 0, false);
  d.step();
  d.step();
  const sequence* s = d.sched.find(seq_id{2});
  ASSERT_NE(s, nullptr);
  std::vector<lifecycle_stage> stages;
  for (const auto& e : s->timeline) stages.push_back(e.stage);
  EXPECT_EQ(stages, (std::vector<lifecycle_stage>{lifecycle_stage::queued, lifecycle_stage::scheduled,
                                                  lifecycle_stage::swapped_out}));
  while (d.sched.find(seq_id{2}) && d.sched.find(seq_id{2})->status != sequence_status::running) d.step();
  ASSERT_NE(d.sched.find(seq_id{2}), nullptr);
  EXPECT_EQ(d.sched.find(seq_id{2})->timeline.back().stage, lifecycle_stage::swapped_in);
  for (size_t i = 1; i < d.sched.find(seq_id{2})->timeline.size(); ++i)
    EXPECT_LE(d.sched.find(seq_id{2})->timeline[i - 1].at, d.sched.find(seq_id{2})->timeline[i].at);
}

// ---- randomized workloads ------------------------------------------------------------------------

struct workload_result {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t swaps = 0;
  int64_t cache_hits = 0;
  int64_t copies = 0;
  int64_t window_freed = 0;
  int64_t swaps_of_windowed = 0;  // swap-outs of sequences with freed window entries
  int64_t forks_of_windowed = 0;  // forks of sequences with freed window entries
  int64_t prefill_limited = 0;    // steps whose prefill the step-time target cut
};

// window > 0: a one-layer sliding-window model (the sim reads only the window, the oracle sees only
// it), and the block manager frees what falls out of it.
// stall_free: a step-time target on a fake device whose speed changes during the run, so that prefill
// chunks take every size from the minimum to the hard cap.
// global_group: a second KV layer group without a window (as Gemma's global layers) next to the
// windowed one, its table allocated, shared, swapped and freed with the first (the sim computes
// through group 0's table only; the block manager's invariants and the leak checks cover both).
void run_random_workload(uint32_t seed, workload_result& total, int32_t window = 0, bool stall_free = false,
                         bool global_group = false) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1)); };
  const int32_t bs = std::array{1, 2, 4, 16}[rng() % 4];
  const int32_t max_prompt = 40;
  const int32_t min_blocks = (max_prompt + 20 + bs - 1) / bs;  // the longest sequence fits alone
  scheduler_options o;
  o.blocks.block_size = bs;
  const int32_t groups = global_group ? 2 : 1;
  o.blocks.num_device_blocks = (min_blocks + pick(0, min_blocks)) * groups;
  o.blocks.num_host_blocks = pick(0, 2 * min_blocks) * groups;
  o.blocks.enable_prefix_caching = rng() % 4 != 0;
  o.max_num_seqs = pick(1, 8);
  o.max_num_batched_tokens = pick(1, 64);
  o.preemption = static_cast<preemption_mode>(seed % 3);
  o.watermark = rng() % 2 ? 0.0 : 0.05;
  o.kv_block_bytes = 1 << 16;
  o.swap_bytes_per_second = rng() % 2 ? 1e12 : 1e3;
  o.blocks.attention_window = window;
  if (global_group) o.blocks.group_windows = {window, 0};
  if (stall_free) {
    o.target_step_seconds = 0.02;
    o.min_prefill_tokens = pick(1, 8);
    o.long_prefill_token_threshold = rng() % 2 ? 0 : pick(1, 16);
  }
  driver d(o, window);
  if (stall_free) {
    const double per_prefill = 0.0005 * pick(1, 8);
    d.fake_seconds = [per_prefill, &d](const step_shape& s) {
      const double slow = d.sched.cost_model().num_observations() % 50 < 25 ? 1.0 : 4.0;
      return slow * (0.004 + 0.001 * s.decode_tokens + per_prefill * s.prefill_tokens +
                     1e-7 * static_cast<double>(s.attention_positions));
    };
  }

  // Shared "system prompts" so prefixes repeat across requests.
  std::vector<std::vector<token_id>> prefixes(3);
  for (auto& p : prefixes)
    for (int i = pick(0, 24); i > 0; --i) p.push_back(static_cast<token_id>(pick(1, vocab - 1)));
  const int num_requests = pick(1, 12);
  std::vector<int> arrival_step(static_cast<size_t>(num_requests));
  for (int& a : arrival_step) a = pick(0, 20);
  int added = 0;
  for (int step = 0; step < 5000; ++step) {
    for (int r = 0; r < num_requests; ++r) {
      if (arrival_step[static_cast<size_t>(r)] != step) continue;
      std::vector<token_id> p = prefixes[rng() % 3];
      for (int i = pick(1, 16); i > 0; --i) p.push_back(static_cast<token_id>(pick(0, vocab - 1)));
      p.resize(std::min<size_t>(p.size(), max_prompt));
      d.add(static_cast<request_id>(r + 1), p, pick(1, 20), rng() % 4 == 0 ? pick(2, 3) : 1, pick(0, 2) * (rng() % 2),
            rng() % 3 != 0);
      ++added;
    }
    if (added == num_requests && !d.sched.has_unfinished()) break;
    if (rng() % 40 == 0) {  // abort a random live request
      std::vector<request_id> live;
      for (auto& [id, r] : d.requests)
        if (r.num_live > 0) live.push_back(id);
      if (!live.empty()) d.abort(live[rng() % live.size()]);
    }
    std::map<seq_id, int32_t> freed_before;
    for (const sequence* s : d.sched.running()) freed_before[s->id] = d.sched.blocks().num_freed_blocks(s->id);
    const scheduler_output plan = d.step();
    ++total.steps;
    total.prefill_limited += plan.prefill_limited;
    total.copies += static_cast<int64_t>(plan.copies.size());
    for (const auto& e : plan.events) {
      total.preemptions += e.kind == event_kind::preempted_recompute || e.kind == event_kind::preempted_swap;
      total.swaps += e.kind == event_kind::preempted_swap;
      total.cache_hits += e.kind == event_kind::prefix_cache_hit;
      if (e.kind == event_kind::preempted_swap && d.sched.blocks().num_freed_blocks(e.seq) > 0)
        ++total.swaps_of_windowed;
    }
    if (window > 0) {
      // Between steps a sequence holds the blocks of positions [n - w + 1, n) at most.
      for (const sequence* s : d.sched.running()) {
        const int32_t global = global_group ? d.sched.blocks().blocks_for(s->num_computed) : 0;
        ASSERT_LE(d.sched.blocks().num_blocks(s->id), (window - 1 + bs - 1) / bs + 1 + global)
            << "seed " << seed << " step " << step << " seq " << s->id;
        if (s->choice_index > 0 && freed_before.count(s->id) == 0 && d.sched.blocks().num_freed_blocks(s->id) > 0)
          ++total.forks_of_windowed;
      }
    }
    // Block accounting: allocated slots beyond the computed ones are only the tails of last blocks.
    const auto slots = d.sched.blocks().slots();
    ASSERT_LE(slots.num_allocated - slots.num_filled, int64_t{bs - 1} * groups * (d.sched.num_running() + 1))
        << "seed " << seed << " step " << step;
    if (!d.problems.empty() || !d.exec.errors().empty()) break;
  }
  ASSERT_TRUE(d.problems.empty()) << "seed " << seed << ": " << d.problems[0];
  ASSERT_TRUE(d.exec.errors().empty()) << "seed " << seed << ": " << d.exec.errors()[0];
  ASSERT_FALSE(d.sched.has_unfinished()) << "seed " << seed << ": workload did not terminate";
  for (auto& [id, r] : d.requests) {
    ASSERT_EQ(r.num_finishes, r.n) << "seed " << seed << " request " << id;
    ASSERT_EQ(r.num_live, 0);
    for (int32_t c = 0; c < (r.forked ? r.n : 1); ++c) {
      const std::vector<token_id> expected = d.oracle(r, c);
      const std::vector<token_id>& got = r.outputs[c];
      if (r.aborted) {
        ASSERT_LE(got.size(), expected.size()) << "seed " << seed;
        ASSERT_TRUE(std::equal(got.begin(), got.end(), expected.begin())) << "seed " << seed << " request " << id;
      } else {
        ASSERT_EQ(got, expected) << "seed " << seed << " request " << id << " choice " << c;
      }
    }
  }
  const block_manager& bm = d.sched.blocks();
  total.window_freed += bm.num_window_freed_blocks();
  if (window == 0) { ASSERT_EQ(bm.num_window_freed_blocks(), 0); }
  ASSERT_EQ(bm.num_free_blocks(), bm.num_device_blocks()) << "seed " << seed << ": leaked blocks";
  ASSERT_EQ(bm.num_free_host_blocks(), bm.num_host_blocks()) << "seed " << seed << ": leaked host blocks";
  ASSERT_EQ(bm.check_invariants(), "") << "seed " << seed;
}

TEST(scheduler, random_workloads_match_the_oracle_and_leak_nothing) {
  workload_result total;
  for (uint32_t seed = 0; seed < 2000; ++seed) {
    run_random_workload(seed, total);
    if (HasFatalFailure()) return;
  }
  // The workloads must actually exercise the interesting paths.
  EXPECT_GT(total.preemptions, 100);
  EXPECT_GT(total.swaps, 20);
  EXPECT_GT(total.cache_hits, 100);
  EXPECT_GT(total.copies, 20);
}

// The same workloads on a sliding-window model: the outputs are the windowed oracle's, nothing leaks,
// every step passes check_invariants (exactly the dead leading blocks freed), and the interesting paths
// (swap-out and fork of a sequence whose leading blocks are gone, prefix hits, copy-on-write) are hit.
TEST(scheduler, random_workloads_with_a_window_match_the_oracle_and_leak_nothing) {
  workload_result total;
  for (uint32_t seed = 0; seed < 1500; ++seed) {
    run_random_workload(seed, total, 1 + static_cast<int32_t>(seed % 13));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(total.window_freed, 1000);
  EXPECT_GT(total.preemptions, 100);
  EXPECT_GT(total.swaps, 20);
  EXPECT_GT(total.swaps_of_windowed, 5);
  EXPECT_GT(total.forks_of_windowed, 5);
  EXPECT_GT(total.cache_hits, 50);
  EXPECT_GT(total.copies, 20);
}

// KV layer groups: the windowed workloads with a global group next to the windowed one (Gemma's
// interleaving): the same outputs, nothing leaks in either group, every step passes the invariants.
TEST(scheduler, random_workloads_with_layer_groups_match_the_oracle_and_leak_nothing) {
  workload_result total;
  for (uint32_t seed = 0; seed < 800; ++seed) {
    run_random_workload(seed, total, 1 + static_cast<int32_t>(seed % 13), false, true);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(total.window_freed, 500);
  EXPECT_GT(total.preemptions, 50);
  EXPECT_GT(total.swaps, 10);
  EXPECT_GT(total.swaps_of_windowed, 2);
  EXPECT_GT(total.forks_of_windowed, 2);
  EXPECT_GT(total.cache_hits, 20);
  EXPECT_GT(total.copies, 10);
}

// The same workloads with stall-free batching: the budget split changes which tokens run when, never
// what any sequence computes, and every preemption / swap / fork / prefix-cache path still holds.
TEST(scheduler, random_workloads_with_a_step_time_target_match_the_oracle_and_leak_nothing) {
  workload_result total;
  for (uint32_t seed = 0; seed < 1500; ++seed) {
    run_random_workload(seed, total, seed % 3 == 0 ? 1 + static_cast<int32_t>(seed % 13) : 0, true);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(total.prefill_limited, total.steps / 20)
      << "the target cut prefill in " << total.prefill_limited << " of " << total.steps << " steps";
  EXPECT_GT(total.preemptions, 100);
  EXPECT_GT(total.swaps, 20);
  EXPECT_GT(total.cache_hits, 100);
  EXPECT_GT(total.copies, 20);
}

// ---- stall-free batching: the prefill share ---------------------------------------------------------

// A cost model that starts from (and, unfed, stays at) a known linear cost: base 10 ms, 1 ms per
// decode row, 2 ms per prefill row, attention free.
scheduler_options stall_free_options(double target_seconds, int32_t max_tokens = 2048, int32_t min_prefill = 4) {
  scheduler_options o = small_options(16, 4096, 0, 64, max_tokens, preemption_mode::recompute);
  o.target_step_seconds = target_seconds;
  o.min_prefill_tokens = min_prefill;
  o.cost.prior = {0.010, 0.001, 0.002, 0.0};
  return o;
}

// n short requests, prefilled in the first step; after it they all decode (500 tokens, no EOS stop).
void start_decoders(driver& d, int n) {
  for (int i = 0; i < n; ++i)
    d.add(request_id{static_cast<uint64_t>(i + 1)}, prompt(4, static_cast<token_id>(i)), 500, 1, 0, false);
  const scheduler_output first = d.step();
  ASSERT_EQ(first.num_prefill_tokens, 4 * n);
}

TEST(scheduler, stall_free_decodes_first_then_the_prefill_the_target_leaves) {
  driver d(stall_free_options(0.050));
  start_decoders(d, 8);
  d.add(request_id{100}, prompt(1000, 7), 4);
  const scheduler_output plan = d.step();
  // (50 ms - 10 ms - 8 x 1 ms) / 2 ms = 16 prompt tokens next to the 8 decodes.
  EXPECT_EQ(plan.num_decode_tokens, 8);
  EXPECT_EQ(plan.num_prefill_tokens, 16);
  EXPECT_EQ(plan.prefill_budget, 16);
  EXPECT_TRUE(plan.prefill_limited);
  EXPECT_NEAR(plan.predicted_seconds, 0.050, 1e-12);
  EXPECT_EQ(plan.shape.decode_tokens, 8);
  EXPECT_EQ(plan.shape.prefill_tokens, 16);
  // The long prompt goes on at 16 tokens a step while all 8 keep decoding, and then decodes itself.
  int steps = 1;
  while (d.sched.find(seq_id{100})->num_uncomputed() > 1) {
    const scheduler_output p = d.step();
    ASSERT_EQ(p.num_decode_tokens, 8);
    ASSERT_LE(p.num_prefill_tokens, 16);
    ++steps;
  }
  EXPECT_EQ(steps, (1000 + 15) / 16);
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
}

TEST(scheduler, stall_free_without_decodes_prefills_up_to_the_hard_cap) {
  // Nobody waits for a token: the target does not apply.
  driver d(stall_free_options(0.050, 512));
  d.add(request_id{1}, prompt(1000, 3), 4);
  const scheduler_output plan = d.step();
  EXPECT_EQ(plan.num_prefill_tokens, 512);
  EXPECT_EQ(plan.prefill_budget, 512);
  EXPECT_FALSE(plan.prefill_limited);
}

TEST(scheduler, stall_free_respects_the_hard_cap) {
  driver d(stall_free_options(10.0, 20));  // a target that would allow thousands of tokens
  start_decoders(d, 4);
  d.add(request_id{100}, prompt(1000, 7), 4);
  const scheduler_output plan = d.step();
  EXPECT_EQ(plan.num_decode_tokens, 4);
  EXPECT_EQ(plan.num_prefill_tokens, 16);
  EXPECT_EQ(plan.prefill_budget, 16);
  EXPECT_FALSE(plan.prefill_limited) << "max_num_batched_tokens, not the target, limited this step";
}

TEST(scheduler, stall_free_minimum_progress_when_the_decodes_alone_exceed_the_target) {
  // 1 ms target, 18 ms of decodes: every step still prefills min_prefill_tokens (12), split across
  // prompts in arrival order, and decodes all 8.
  driver d(stall_free_options(0.001, 2048, 12));
  start_decoders(d, 8);
  d.add(request_id{100}, prompt(30, 7), 4);
  d.add(request_id{101}, prompt(30, 9), 4);
  // Request 100: 12, 12, 6 (then it decodes); 101: 6 in the third step, 12, 12.
  const std::vector<std::string> expected = {"100:12", "100:12", "100:6 101:6", "101:12", "101:12"};
  for (int i = 0; i < 5; ++i) {
    const scheduler_output p = d.step();
    EXPECT_EQ(p.num_decode_tokens, i < 3 ? 8 : 9) << "step " << i;
    EXPECT_EQ(p.prefill_budget, 12);
    EXPECT_EQ(p.prefill_limited, i < 4) << "step " << i << ": the last one takes what is left";
    std::string chunks;
    for (const scheduled_sequence& s : p.scheduled)
      if (s.request.value() >= 100 && s.num_new_tokens > 1)
        chunks +=
            (chunks.empty() ? "" : " ") + std::to_string(s.request.value()) + ":" + std::to_string(s.num_new_tokens);
    EXPECT_EQ(chunks, expected[static_cast<size_t>(i)]) << "step " << i;
    EXPECT_EQ(p.num_prefill_tokens, 12);
  }
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
}

TEST(scheduler, stall_free_chunks_grow_on_a_fast_device_and_shrink_on_a_slow_one) {
  // The fake device: 10 ms + 1 ms per decode row + `per_prefill` per prompt row. Fed back after every
  // step, the model learns it and the chunk follows: (50 - 10 - 8) ms / per_prefill.
  driver d(stall_free_options(0.050, 2048, 4));
  double per_prefill = 0.0005;
  start_decoders(d, 8);
  d.fake_seconds = [&](const step_shape& s) {
    return 0.010 + 0.001 * s.decode_tokens + per_prefill * s.prefill_tokens;
  };
  d.add(request_id{100}, prompt(100000 / 4, 7), 4);  // long enough for the whole test
  const auto chunk_after = [&](int steps) {
    scheduler_output p;
    for (int i = 0; i < steps; ++i) {
      p = d.step();
      EXPECT_EQ(p.num_decode_tokens, 8);
    }
    return p.num_prefill_tokens;
  };
  EXPECT_EQ(chunk_after(1), 16) << "the prior: 2 ms a prompt token";
  const int32_t fast = chunk_after(60);
  EXPECT_NEAR(fast, 64, 3) << "learned: 0.5 ms a prompt token";
  per_prefill = 0.004;
  const int32_t slow = chunk_after(60);
  EXPECT_NEAR(slow, 8, 1) << "learned: 4 ms a prompt token";
  per_prefill = 0.001;
  EXPECT_NEAR(chunk_after(60), 32, 2);
  EXPECT_LT(d.sched.cost_model().mean_relative_error(), 0.05);
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
}

TEST(scheduler, stall_free_counts_each_chunks_attention) {
  // Attention 20 ms per million positions: a chunk deep into a long prompt gets fewer tokens.
  // Attention 2 s per million positions: a chunk deep into a long prompt gets fewer tokens (at depth 0
  // (50 - 10 - 1) ms / 2 ms = 19 rows less their attention; at depth 1000 about 4 ms a row).
  scheduler_options o = stall_free_options(0.050, 2048, 1);
  o.cost.prior.attention_mpos = 2.0;
  driver d(o);
  start_decoders(d, 1);
  d.add(request_id{100}, prompt(1500, 7), 4);
  const scheduler_output first = d.step();
  int32_t last = first.num_prefill_tokens;
  EXPECT_EQ(last, 19);
  while (d.sched.find(seq_id{100})->num_computed < 1000) {
    const scheduler_output p = d.step();
    EXPECT_LE(p.num_prefill_tokens, last) << "deeper chunks read more keys";
    EXPECT_LE(p.predicted_seconds, 0.050 + 1e-12);
    last = p.num_prefill_tokens;
  }
  EXPECT_LE(last, 10);
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
}

TEST(scheduler, long_prefill_threshold_lets_prompts_share_a_step) {
  scheduler_options o = small_options(4, 1024, 0, 64, 64, preemption_mode::recompute);
  o.long_prefill_token_threshold = 8;
  driver d(o);
  std::map<request_id, char> names{{request_id{'A'}, 'A'}, {request_id{'B'}, 'B'}, {request_id{'C'}, 'C'}};
  d.add(request_id{'A'}, prompt(20, 1), 2, 1, 0, false);
  d.add(request_id{'B'}, prompt(12, 5), 2, 1, 0, false);
  d.add(request_id{'C'}, prompt(3, 9), 2, 1, 0, false);
  EXPECT_EQ(describe(d.step(), names), "A:8 B:8 C:3");
  EXPECT_EQ(describe(d.step(), names), "C:1 A:8 B:4");
  EXPECT_EQ(describe(d.step(), names), "B:1 A:4");
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
}

TEST(scheduler, stall_free_options_are_checked) {
  scheduler_options o = stall_free_options(-1.0);
  EXPECT_THROW(scheduler{o}, invalid_request);
  o = stall_free_options(0.05);
  o.min_prefill_tokens = 0;
  EXPECT_THROW(scheduler{o}, invalid_request);
  o = stall_free_options(0.05);
  o.long_prefill_token_threshold = -1;
  EXPECT_THROW(scheduler{o}, invalid_request);
}

TEST(scheduler, kv_waste_is_only_last_block_tails) {
  // Long sequences, block size 16: waste = unused tail slots / allocated slots stays below 4%.
  scheduler_options o = small_options(16, 2048, 0, 32, 2048, preemption_mode::recompute);
  driver d(o);
  std::mt19937 rng(7);
  for (uint64_t r = 1; r <= 24; ++r)
    d.add(request_id{r}, prompt(200 + static_cast<int32_t>(rng() % 200), static_cast<token_id>(r)), 64, 1, 0, false);
  double worst = 0;
  int64_t measured = 0;
  while (d.sched.has_unfinished()) {
    d.step();
    const auto slots = d.sched.blocks().slots();
    if (d.sched.num_running() == 24) {
      worst = std::max(worst, slots.waste());
      ++measured;
    }
  }
  EXPECT_GT(measured, 10);
  EXPECT_LT(worst, 0.04);
  EXPECT_GT(worst, 0.0);
}

}  // namespace
}  // namespace tessera
