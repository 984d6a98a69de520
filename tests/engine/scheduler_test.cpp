// Scheduler tests: table-driven scenarios (what runs in step i) and randomized workloads executed
// on the paging-checking simulated executor, compared with an oracle generation.
#include "engine/scheduler.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <sstream>

#include "engine/base/error.hpp"
#include "engine/sim_executor.hpp"

namespace tessera {
namespace {

using testing::ranked_token;
using testing::sim_executor;

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
    int32_t num_finishes = 0;  // of sequences; == n once done
    std::map<int32_t, std::vector<token_id>> outputs;  // choice -> generated tokens
  };

  scheduler sched;
  sim_executor exec;
  std::map<request_id, request> requests;
  std::map<seq_id, request_id> seq_request;
  seq_id next_seq = seq_id{1000};
  uint64_t arrival = 0;
  std::vector<std::string> problems;

  explicit driver(const scheduler_options& o)
      : sched(o), exec(o.blocks.block_size, o.blocks.num_device_blocks, o.blocks.num_host_blocks, vocab) {}

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
          append(child, ranked_token(seq->tokens, vocab, c));
        }
      }
      append(seq->id, ranked_token(seq->tokens, vocab, 0));
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
      const token_id t = ranked_token(history, vocab, out.empty() ? choice : 0);
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
  struct arrival { int step; char name; int32_t prompt_len; int32_t max_tokens; int32_t priority; };
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
  d2.add(request_id{4}, prompt(32, 1), 4);                                  // exactly the whole cache
  while (d2.sched.has_unfinished()) d2.step();
  EXPECT_EQ(d2.requests[request_id{4}].outputs[0].size(), 1u);  // max_seq_len reached after one token
  EXPECT_TRUE(d2.exec.errors().empty());
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
    o.prefill_tokens_per_second = 1000;                  // 8 tokens: 8 ms
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
};

void run_random_workload(uint32_t seed, workload_result& total) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1)); };
  const int32_t bs = std::array{1, 2, 4, 16}[rng() % 4];
  const int32_t max_prompt = 40;
  const int32_t min_blocks = (max_prompt + 20 + bs - 1) / bs;  // the longest sequence fits alone
  scheduler_options o;
  o.blocks.block_size = bs;
  o.blocks.num_device_blocks = min_blocks + pick(0, min_blocks);
  o.blocks.num_host_blocks = pick(0, 2 * min_blocks);
  o.blocks.enable_prefix_caching = rng() % 4 != 0;
  o.max_num_seqs = pick(1, 8);
  o.max_num_batched_tokens = pick(1, 64);
  o.preemption = static_cast<preemption_mode>(seed % 3);
  o.watermark = rng() % 2 ? 0.0 : 0.05;
  o.kv_block_bytes = 1 << 16;
  o.swap_bytes_per_second = rng() % 2 ? 1e12 : 1e3;
  driver d(o);

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
    const scheduler_output plan = d.step();
    ++total.steps;
    total.copies += static_cast<int64_t>(plan.copies.size());
    for (const auto& e : plan.events) {
      total.preemptions += e.kind == event_kind::preempted_recompute || e.kind == event_kind::preempted_swap;
      total.swaps += e.kind == event_kind::preempted_swap;
      total.cache_hits += e.kind == event_kind::prefix_cache_hit;
    }
    // Block accounting: allocated slots beyond the computed ones are only the tails of last blocks.
    const auto slots = d.sched.blocks().slots();
    ASSERT_LE(slots.num_allocated - slots.num_filled, int64_t{bs - 1} * (d.sched.num_running() + 1))
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
