// Engine faults through the facade, on the simulated executor: an executor that throws at a random
// step, stalls, or throws after a stall; a tokenizer actor that dies in the middle of a request; a
// host swap pool too small for the swaps that forced swap preemption asks for. For each: every open
// stream ends with exactly one final within a bounded wait (an error final where the fault hit it),
// no KV block stays used in either pool (the facade's snapshot and the KV manager's report), the
// runtime is unhealthy after an executor failure and healthy where it recovers (a dead tokenizer
// actor is replaced), and the requests a local fault did not hit equal the offline engine's.
#include "actors/fault_injection.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "actor_test_support.hpp"
#include "actors/engine_facade.hpp"
#include "engine/base/error.hpp"

namespace tessera::actors {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using testing::char_tokenizer;
using testing::sim_executor;
using testing::test_vocab;

// ---- helpers ------------------------------------------------------------------------------------

using choice_tokens = std::map<int32_t, std::vector<token_id>>;

struct outcome {
  choice_tokens tokens;
  std::optional<stream_final> final;
  int num_finals = 0;
  bool delta_after_final = false;
};

// Reads `s` until its final or `deadline`, whichever comes first: a hang shows as a missing final.
// Past the deadline it still takes what is already buffered, so one hanging stream read first does
// not make the streams read after it look hung too.
outcome drain(stream_handle& s, steady::time_point deadline) {
  outcome o;
  while (true) {
    const auto left = std::max(deadline - steady::now(), steady::duration::zero());
    auto item = s.next(std::chrono::ceil<std::chrono::milliseconds>(left));
    if (!item) break;
    if (auto* d = std::get_if<stream_delta>(&*item)) {
      if (o.num_finals > 0) o.delta_after_final = true;
      auto& t = o.tokens[d->output.index];
      t.insert(t.end(), d->output.token_ids.begin(), d->output.token_ids.end());
    } else {
      o.final = std::get<stream_final>(*item);
      ++o.num_finals;
    }
  }
  return o;
}

struct request_spec {
  std::vector<token_id> prompt;
  sampling_params params;
};

// Tokens of every choice of every request when run through llm_engine directly.
std::vector<choice_tokens> offline(executor& exec, std::shared_ptr<const tokenizer> tok, const engine_options& options,
                                   const std::vector<request_spec>& requests) {
  llm_engine engine(exec, std::move(tok), options);
  std::map<request_id, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[engine.add_request(requests[i].prompt, requests[i].params)] = i;
  std::vector<choice_tokens> out(requests.size());
  while (engine.has_unfinished()) {
    for (const request_output& o : engine.step()) {
      auto& t = out[index.at(o.id)][o.index];
      t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
    }
  }
  return out;
}

sampling_params seeded(uint64_t seed, int32_t max_tokens, int32_t n = 1) {
  sampling_params p;
  p.temperature = 0.8f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.n = n;
  return p;
}

facade_options options_for(int32_t max_num_seqs = 8) {
  facade_options o;
  o.engine.block_size = 16;
  o.engine.max_num_seqs = max_num_seqs;
  o.num_caf_threads = 2;
  o.max_waiting = 1000;
  o.shutdown_timeout = 2s;
  o.kv_snapshot_interval_seconds = 0;
  return o;
}

// Preemption by swap, and no watermark: the pools fill to the last block, so the tests' small pools
// preempt (and swap) early and often.
facade_options swap_options() {
  facade_options o = options_for();
  o.engine.preemption = preemption_mode::swap;
  o.engine.watermark = 0;
  return o;
}

facade_components components(std::unique_ptr<executor> exec) {
  facade_components c;
  c.exec = std::move(exec);
  c.tok = char_tokenizer();
  return c;
}

// Requests that outgrow a small pool: preemption (and, with host blocks, swapping) is certain.
std::vector<request_spec> growing_requests(uint64_t seed, int count) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<request_spec> out;
  for (int i = 0; i < count; ++i) {
    std::vector<token_id> prompt;
    const int len = 5 + static_cast<int>(rng() % 36);
    for (int k = 0; k < len; ++k) prompt.push_back(1 + static_cast<token_id>(rng() % (test_vocab - 1)));
    out.push_back({prompt, seeded(seed * 100 + static_cast<uint64_t>(i), 40 + static_cast<int32_t>(rng() % 41),
                                  i % 4 == 3 ? 2 : 1)});
  }
  return out;
}

std::vector<stream_handle> submit_all(engine_facade& engine, const std::vector<request_spec>& requests) {
  std::vector<stream_handle> streams;
  for (const request_spec& r : requests) {
    submit_result s = engine.submit(prompt_input::from_ids(r.prompt), r.params);
    EXPECT_TRUE(s) << s.message;
    streams.push_back(s.stream);
  }
  return streams;
}

// Both pools free: the facade's snapshot at once (it is updated before any final is sent), the KV
// manager's report within a bounded wait (it is a message behind the finals).
void expect_pools_free(engine_facade& engine, const std::string& what) {
  const facade_stats s = engine.stats();
  EXPECT_EQ(s.device.num_used, 0) << what << ": device blocks still used (facade)";
  EXPECT_EQ(s.host.num_used, 0) << what << ": host blocks still used (facade)";
  EXPECT_EQ(s.num_open, 0) << what;
  EXPECT_EQ(s.num_queued, 0) << what;
  occupancy_ptr o;
  for (auto deadline = steady::now() + 2s; steady::now() < deadline; std::this_thread::sleep_for(10ms)) {
    o = engine.kv_occupancy_snapshot();
    if (o && o->device.num_used == 0 && o->host.num_used == 0) break;
  }
  ASSERT_NE(o, nullptr) << what;
  EXPECT_EQ(o->device.num_used, 0) << what << ": device blocks still used (KV manager)";
  EXPECT_EQ(o->host.num_used, 0) << what << ": host blocks still used (KV manager)";
}

// ---- the plan and the wrapper ---------------------------------------------------------------------

TEST(fault_plan, parses_the_short_and_the_long_form_and_refuses_typos) {
  fault_plan p = parse_fault_plan("42:0.25");
  EXPECT_EQ(p.seed, 42u);
  EXPECT_DOUBLE_EQ(p.executor_fault_rate, 0.25);
  EXPECT_TRUE(p.throws && p.stalls && p.stall_throws && p.bad_allocs);
  EXPECT_EQ(p.tokenizer_exit_rate, 0);
  EXPECT_EQ(p.at_call, 0);

  p = parse_fault_plan("seed=7,rate=0.1,kinds=stall+stall_throw,stall_ms=250,after=12,tokenizer_exit=0.5");
  EXPECT_EQ(p.seed, 7u);
  EXPECT_DOUBLE_EQ(p.executor_fault_rate, 0.1);
  EXPECT_FALSE(p.throws);
  EXPECT_TRUE(p.stalls);
  EXPECT_TRUE(p.stall_throws);
  EXPECT_EQ(p.stall, 250ms);
  EXPECT_EQ(p.after_calls, 12);
  EXPECT_DOUBLE_EQ(p.tokenizer_exit_rate, 0.5);
  EXPECT_FALSE(p.bad_allocs);
  EXPECT_NE(p.describe().find("stall+stall_throw"), std::string::npos) << p.describe();

  p = parse_fault_plan("at=17,kinds=bad_alloc");
  EXPECT_EQ(p.at_call, 17);
  EXPECT_EQ(p.executor_fault_rate, 0);
  EXPECT_TRUE(p.faults_executor());
  EXPECT_TRUE(p.bad_allocs && !p.throws && !p.stalls && !p.stall_throws);

  for (const char* bad : {"", "7", "x:0.1", "1:1.5", "1:-0.1", "seed=1,rate=0.1,kind=throw", "rate=0.1,kinds=explode",
                          "rate=0.1,kinds=", "seed=1,rate=abc", "stall_ms=-1", "after=-3", "rate=0.1 ",
                          "tokenizer_exit=2", "at=0", "at=x"}) {
    EXPECT_THROW(parse_fault_plan(bad), invalid_request) << "'" << bad << "' must be refused";
  }
}

TEST(fault_injecting_executor, draws_the_same_faults_for_the_same_seed_and_injects_them) {
  fault_plan plan;
  plan.seed = 1;
  plan.executor_fault_rate = 0.1;
  plan.after_calls = 50;
  fault_injecting_executor a(std::make_unique<sim_executor>(16, 8, 0, test_vocab), plan);
  fault_injecting_executor b(std::make_unique<sim_executor>(16, 8, 0, test_vocab), plan);
  plan.seed = 2;
  fault_injecting_executor other(std::make_unique<sim_executor>(16, 8, 0, test_vocab), plan);
  std::map<executor_fault, int> counts;
  int num_differences = 0;
  for (int64_t call = 1; call <= 10000; ++call) {
    const executor_fault f = a.drawn_fault(call);
    EXPECT_EQ(f, b.drawn_fault(call)) << "same seed, same schedule";
    if (call <= 50) { EXPECT_EQ(f, executor_fault::none) << "no fault in the first `after` calls"; }
    num_differences += f != other.drawn_fault(call);
    ++counts[f];
  }
  EXPECT_GT(num_differences, 100) << "another seed draws other faults";
  const int num_faults = 10000 - counts[executor_fault::none];
  EXPECT_NEAR(num_faults, 995, 150) << "about rate x calls";
  for (executor_fault k :
       {executor_fault::throw_now, executor_fault::stall, executor_fault::stall_then_throw, executor_fault::bad_alloc})
    EXPECT_GT(counts[k], 150) << to_string(k) << ": every kind is drawn";

  // at=N: that call faults, and only that one (no rate).
  fault_plan once;
  once.at_call = 7;
  once.throws = once.stalls = once.stall_throws = false;
  fault_injecting_executor at(std::make_unique<sim_executor>(16, 8, 0, test_vocab), once);
  for (int64_t call = 1; call <= 100; ++call)
    EXPECT_EQ(at.drawn_fault(call), call == 7 ? executor_fault::bad_alloc : executor_fault::none) << call;

  // Injected: a throw leaves the inner executor untouched, a stall delays an otherwise normal step.
  std::vector<executor_fault> script = {executor_fault::none, executor_fault::stall, executor_fault::throw_now,
                                        executor_fault::stall_then_throw};
  fault_plan quick;
  quick.stall = 60ms;
  auto sim = std::make_unique<sim_executor>(16, 8, 0, test_vocab);
  sim_executor* inner = sim.get();
  fault_injecting_executor f(std::move(sim), quick,
                             [&](int64_t call, const step_batch&) { return script[static_cast<size_t>(call - 1)]; });
  step_batch batch;
  sequence_slice s;
  s.seq = seq_id{1};
  s.tokens = {3, 4};
  s.block_table = {0};
  batch.seqs.push_back(s);
  step_output out;
  // Counters, not clocks (no timing asserts in unit tests): a stall is counted where it sleeps.
  f.execute(batch, out);
  EXPECT_EQ(f.num_stalls(), 0);
  f.execute(batch, out);
  EXPECT_EQ(f.num_stalls(), 1) << "stalled";
  EXPECT_EQ(inner->num_steps(), 2) << "then ran normally";
  EXPECT_THROW(f.execute(batch, out), std::runtime_error);
  EXPECT_EQ(f.num_stalls(), 1) << "a plain throw does not stall";
  try {
    f.execute(batch, out);
    ADD_FAILURE() << "stall_throw must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fault injection: stall_throw"), std::string::npos) << e.what();
  }
  EXPECT_EQ(inner->num_steps(), 2) << "a throwing call never reaches the inner executor";
  EXPECT_EQ(f.num_calls(), 4);
  EXPECT_EQ(f.num_throws(), 2);
  EXPECT_EQ(f.num_stalls(), 2);
}

// ---- executor faults -----------------------------------------------------------------------------

// A throw at a random step (several seeds: the failure meets requests waiting, running, preempted and
// swapped out, choices of n = 2 requests forked or not): every stream ends with one final, the ones
// the failure met with an error naming it, the ones that finished before it with the offline tokens;
// the runtime is unhealthy and refuses new work; both pools are reported free.
TEST(executor_faults, a_throw_at_a_random_step_ends_every_stream_and_frees_both_pools) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    fault_plan plan;
    plan.seed = seed;
    plan.executor_fault_rate = 0.05;
    plan.throws = true;
    plan.stalls = plan.stall_throws = plan.bad_allocs = false;
    plan.after_calls = 10;
    auto exec = std::make_unique<fault_injecting_executor>(std::make_unique<sim_executor>(16, 24, 8, test_vocab), plan);
    fault_injecting_executor* faults = exec.get();
    const facade_options options = swap_options();
    engine_facade engine(components(std::move(exec)), options);
    const auto requests = growing_requests(seed, 16);
    auto streams = submit_all(engine, requests);
    const auto deadline = steady::now() + 20s;
    std::vector<outcome> got;
    for (auto& s : streams) got.push_back(drain(s, deadline));

    sim_executor oracle_exec(16, 24, 8, test_vocab);
    const auto expected = offline(oracle_exec, nullptr, options.engine, requests);
    int num_errors = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].final.has_value()) << "stream " << i << " got no final: it hangs";
      EXPECT_EQ(got[i].num_finals, 1);
      EXPECT_FALSE(got[i].delta_after_final);
      const stream_final& f = *got[i].final;
      if (f.reason == finish_reason::error) {
        ++num_errors;
        EXPECT_NE(f.error.find("fault injection: throw"), std::string::npos) << "stream " << i << ": " << f.error;
      } else {
        EXPECT_EQ(f.reason, finish_reason::length) << "stream " << i;
        EXPECT_EQ(got[i].tokens, expected[i]) << "stream " << i << " finished before the failure";
      }
    }
    EXPECT_EQ(faults->num_throws(), 1) << "the first throw kills the executor";
    EXPECT_GT(num_errors, 0);
    const health_report h = engine.health();
    EXPECT_FALSE(h.healthy);
    EXPECT_NE(h.message.find("fault injection"), std::string::npos) << h.message;
    EXPECT_EQ(engine.submit(prompt_input::from_ids({1, 2}), seeded(1, 4)).error, submit_error::unhealthy);
    expect_pools_free(engine, "after the executor failure");
    EXPECT_EQ(engine.stats().num_failed, static_cast<uint64_t>(num_errors));
  }
}

// Stalls (steps that take 25 ms instead of microseconds) and aborts landing during them: nothing is
// lost or reordered, the survivors equal the offline engine, the runtime stays healthy.
TEST(executor_faults, stalls_only_delay_steps) {
  fault_plan plan;
  plan.seed = 5;
  plan.executor_fault_rate = 0.15;
  plan.throws = plan.stall_throws = plan.bad_allocs = false;
  plan.stalls = true;
  plan.stall = 25ms;
  auto exec = std::make_unique<fault_injecting_executor>(std::make_unique<sim_executor>(16, 64, 16, test_vocab), plan);
  fault_injecting_executor* faults = exec.get();
  facade_options options = options_for(16);
  engine_facade engine(components(std::move(exec)), options);
  const auto requests = growing_requests(9, 24);
  auto streams = submit_all(engine, requests);
  std::set<size_t> aborted;
  for (size_t i = 0; i < streams.size(); i += 3) aborted.insert(i);
  std::thread aborter([&] {
    std::mt19937 rng(11);
    for (size_t i : aborted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
      streams[i].abort();
    }
  });
  const auto deadline = steady::now() + 60s;
  std::vector<outcome> got;
  for (auto& s : streams) got.push_back(drain(s, deadline));
  aborter.join();

  sim_executor oracle_exec(16, 64, 16, test_vocab);
  std::vector<request_spec> survivors;
  for (size_t i = 0; i < requests.size(); ++i)
    if (!aborted.count(i)) survivors.push_back(requests[i]);
  const auto expected = offline(oracle_exec, nullptr, options.engine, survivors);
  size_t k = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].final.has_value()) << "stream " << i << " hangs";
    EXPECT_EQ(got[i].num_finals, 1);
    if (aborted.count(i)) {
      EXPECT_TRUE(got[i].final->reason == finish_reason::abort || got[i].final->reason == finish_reason::length);
      continue;
    }
    EXPECT_EQ(got[i].final->reason, finish_reason::length) << "stream " << i;
    EXPECT_EQ(got[i].tokens, expected[k++]) << "stream " << i;
  }
  EXPECT_GT(faults->num_stalls(), 0);
  EXPECT_EQ(faults->num_throws(), 0);
  EXPECT_TRUE(engine.health().healthy);
  expect_pools_free(engine, "after stalls");
}

// A throw after a long stall, while the engine actor is blocked in that step: the submits, the abort
// and the dropped handle that arrive meanwhile wait in its mailbox. All of them still end (the
// submits with the unhealthy error), nothing hangs, shutdown afterwards completes.
TEST(executor_faults, a_throw_after_a_stall_also_ends_what_arrived_during_the_stall) {
  constexpr int64_t fail_call = 8;
  fault_plan plan;
  plan.stall = 500ms;
  auto exec = std::make_unique<fault_injecting_executor>(
      std::make_unique<sim_executor>(16, 64, 16, test_vocab), plan, [](int64_t call, const step_batch&) {
        return call == fail_call ? executor_fault::stall_then_throw : executor_fault::none;
      });
  fault_injecting_executor* faults = exec.get();
  auto engine = std::make_unique<engine_facade>(components(std::move(exec)), options_for());
  auto streams = submit_all(*engine, growing_requests(3, 6));
  for (auto deadline = steady::now() + 10s; faults->num_stalls() == 0 && steady::now() < deadline;)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(faults->num_stalls(), 1) << "the stall began";
  // During the stall (the runtime still looks healthy: the step has not failed yet).
  std::vector<stream_handle> late;
  for (int i = 0; i < 3; ++i) {
    submit_result r = engine->submit(prompt_input::from_text("late"), seeded(1, 10));
    ASSERT_TRUE(r) << r.message;
    late.push_back(r.stream);
  }
  streams[0].abort();
  streams[1] = stream_handle();  // the last handle of stream 1: dropped, its request is aborted
  const auto deadline = steady::now() + 5s;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (i == 1) continue;
    outcome o = drain(streams[i], deadline);
    ASSERT_TRUE(o.final.has_value()) << "stream " << i << " hangs";
    // The abort of stream 0 arrives after the failure has closed it: error either way.
    EXPECT_EQ(o.final->reason, finish_reason::error) << "stream " << i;
    EXPECT_NE(o.final->error.find("fault injection: stall_throw"), std::string::npos) << o.final->error;
  }
  for (auto& s : late) {
    outcome o = drain(s, deadline);
    ASSERT_TRUE(o.final.has_value()) << "a submit that arrived during the stall hangs";
    EXPECT_EQ(o.final->reason, finish_reason::error);
    EXPECT_FALSE(o.final->error.empty());
  }
  EXPECT_FALSE(engine->health().healthy);
  EXPECT_EQ(faults->num_calls(), fail_call) << "no step after the failure";
  for (auto until = steady::now() + 2s; engine->stats().num_open > 0 && steady::now() < until;)
    std::this_thread::sleep_for(5ms);
  expect_pools_free(*engine, "after a stall then a throw");
  engine.reset();  // shutdown after the failure completes (a hang fails by ctest's timeout)
}

// An allocation that fails in the middle of decoding (std::bad_alloc out of execute(), what an
// executor out of memory throws): the same as any executor failure, every open stream ends with an
// error that says what happened, the pools are reported free, later submits are refused.
TEST(executor_faults, a_failed_allocation_ends_every_stream_with_an_error_and_leaks_no_block) {
  fault_plan plan;
  plan.at_call = 30;
  plan.throws = plan.stalls = plan.stall_throws = false;
  auto exec = std::make_unique<fault_injecting_executor>(std::make_unique<sim_executor>(16, 24, 8, test_vocab), plan);
  fault_injecting_executor* faults = exec.get();
  const facade_options options = swap_options();
  engine_facade engine(components(std::move(exec)), options);
  auto streams = submit_all(engine, growing_requests(12, 12));
  const auto deadline = steady::now() + 20s;
  int num_errors = 0;
  for (auto& s : streams) {
    outcome o = drain(s, deadline);
    ASSERT_TRUE(o.final.has_value()) << "stream " << s.id() << " hangs";
    if (o.final->reason != finish_reason::error) continue;
    ++num_errors;
    EXPECT_NE(o.final->error.find("bad_alloc"), std::string::npos) << o.final->error;
  }
  EXPECT_EQ(faults->num_calls(), 30) << "no step after the failure";
  EXPECT_EQ(num_errors, 12) << "the requests are long enough that none finished before call 30";
  EXPECT_FALSE(engine.health().healthy);
  EXPECT_NE(engine.health().message.find("bad_alloc"), std::string::npos) << engine.health().message;
  EXPECT_EQ(engine.submit(prompt_input::from_ids({1, 2}), seeded(1, 4)).error, submit_error::unhealthy);
  expect_pools_free(engine, "after a failed allocation");
}

// ---- tokenizer faults ----------------------------------------------------------------------------

std::vector<token_id> encoded(const std::string& text) {
  const auto tok = char_tokenizer();
  encode_options o;
  o.add_special = tok->add_bos();
  return tok->encode(text, o);
}

std::string text_of(std::mt19937& rng) {
  std::string s;
  for (int i = 0, n = 3 + static_cast<int>(rng() % 20); i < n; ++i) s.push_back(static_cast<char>('a' + rng() % 26));
  return s;
}

// The tokenizer actor that takes the poisoned prompt exits without answering. Only that request
// fails (with an error saying so); the requests queued behind it on the same actor and on the other
// one complete with the offline tokens; the dead actor is replaced, so the pool stays at full
// strength and later requests all succeed; the runtime stays healthy.
TEST(tokenizer_faults, a_tokenizer_that_dies_mid_request_fails_only_that_request_and_is_replaced) {
  facade_components c = components(std::make_unique<sim_executor>(16, 256, 0, test_vocab));
  c.tokenizer_exit_when = [](const prompt_input& p) { return p.text == "poison"; };
  facade_options options = options_for(32);
  options.num_tokenizer_actors = 2;
  engine_facade engine(std::move(c), options);
  std::mt19937 rng(4);
  for (int wave = 0; wave < 2; ++wave) {
    SCOPED_TRACE("wave " + std::to_string(wave));
    std::vector<std::string> texts;
    std::vector<request_spec> requests;
    std::vector<stream_handle> streams;
    for (int i = 0; i < 41; ++i) {
      texts.push_back(wave == 0 && i == 5 ? "poison" : text_of(rng));
      requests.push_back({encoded(texts.back()), seeded(static_cast<uint64_t>(wave * 100 + i), 6 + i % 9)});
      submit_result r = engine.submit(prompt_input::from_text(texts.back()), requests.back().params);
      ASSERT_TRUE(r) << r.message;
      streams.push_back(r.stream);
    }
    const auto deadline = steady::now() + 10s;
    std::vector<outcome> got;
    for (auto& s : streams) got.push_back(drain(s, deadline));
    sim_executor oracle_exec(16, 256, 0, test_vocab);
    std::vector<request_spec> healthy_requests;
    for (size_t i = 0; i < requests.size(); ++i)
      if (texts[i] != "poison") healthy_requests.push_back(requests[i]);
    const auto expected = offline(oracle_exec, char_tokenizer(), options.engine, healthy_requests);
    size_t k = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].final) {
        ADD_FAILURE() << "stream " << i << " ('" << texts[i] << "') got no final: it hangs";
        continue;
      }
      EXPECT_EQ(got[i].num_finals, 1);
      if (texts[i] == "poison") {
        EXPECT_EQ(got[i].final->reason, finish_reason::error);
        EXPECT_NE(got[i].final->error.find("tokenizer"), std::string::npos) << got[i].final->error;
        EXPECT_TRUE(got[i].tokens.empty());
        continue;
      }
      EXPECT_EQ(got[i].final->reason, finish_reason::length) << "stream " << i << ": " << got[i].final->error;
      EXPECT_EQ(got[i].tokens, expected[k++]) << "stream " << i;
    }
    EXPECT_TRUE(engine.health().healthy) << engine.health().message;
    expect_pools_free(engine, "after a tokenizer death");
  }
  EXPECT_GE(engine.stats().num_tokenizer_restarts, 1u);
  EXPECT_EQ(engine.stats().num_failed, 1u) << "only the poisoned request failed";
}

// A quarter of the prompts (drawn by the plan) kill every tokenizer actor that encodes them, and 60
// requests arrive at once, so most are queued behind a poisoned prompt in an actor's mailbox when it
// dies. Every stream ends; exactly the poisoned prompts fail, each after killing two actors, with an
// error naming the tokenizer; every other request equals the offline engine, however often it was
// bounced; token-id prompts never meet a tokenizer.
TEST(tokenizer_faults, random_tokenizer_exits_only_hit_the_prompts_being_encoded) {
  fault_plan plan;
  plan.seed = 3;
  plan.tokenizer_exit_rate = 0.25;
  facade_components c = components(std::make_unique<sim_executor>(16, 256, 0, test_vocab));
  c.tokenizer_exit_when = make_tokenizer_fault(plan);
  facade_options options = options_for(32);
  options.num_tokenizer_actors = 3;
  engine_facade engine(std::move(c), options);
  std::mt19937 rng(8);
  std::vector<std::string> texts;
  std::vector<request_spec> requests;
  std::vector<stream_handle> streams;
  for (int i = 0; i < 60; ++i) {
    const bool ids = i % 5 == 0;
    texts.push_back(text_of(rng));
    requests.push_back({encoded(texts.back()), seeded(static_cast<uint64_t>(i), 5 + i % 7)});
    submit_result r =
        engine.submit(ids ? prompt_input::from_ids(requests.back().prompt) : prompt_input::from_text(texts.back()),
                      requests.back().params);
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
  }
  const auto deadline = steady::now() + 20s;
  std::vector<outcome> got;
  for (auto& s : streams) got.push_back(drain(s, deadline));
  const tokenizer_fault poisoned = make_tokenizer_fault(plan);
  int num_poisoned = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].final) {
      ADD_FAILURE() << "stream " << i << " hangs";
      continue;
    }
    const bool poison = i % 5 != 0 && poisoned(prompt_input::from_text(texts[i]));
    num_poisoned += poison;
    if (poison) {
      EXPECT_EQ(got[i].final->reason, finish_reason::error) << "stream " << i;
      EXPECT_TRUE(got[i].final->runtime_fault);
      EXPECT_NE(got[i].final->error.find("tokenizer actor died"), std::string::npos) << got[i].final->error;
      continue;
    }
    EXPECT_EQ(got[i].final->reason, finish_reason::length) << "stream " << i << ": " << got[i].final->error;
    // Each request alone on a fresh engine: its tokens depend only on its prompt and seed.
    sim_executor oracle_exec(16, 256, 0, test_vocab);
    EXPECT_EQ(got[i].tokens, offline(oracle_exec, char_tokenizer(), options.engine, {requests[i]})[0])
        << "stream " << i;
  }
  EXPECT_GE(num_poisoned, 5) << "the plan poisons about a quarter of the 48 text prompts";
  EXPECT_EQ(engine.stats().num_failed, static_cast<uint64_t>(num_poisoned));
  EXPECT_EQ(engine.stats().num_tokenizer_restarts, 2u * static_cast<uint64_t>(num_poisoned)) << "two deaths each";
  EXPECT_TRUE(engine.health().healthy);
  expect_pools_free(engine, "after random tokenizer exits");
}

// ---- a full host swap pool --------------------------------------------------------------------------

// Forced swap preemption with a 2-block host pool: most swaps do not fit and fall back to recompute.
// Every request (n = 2 ones included) still equals the offline engine, and both pools end free.
TEST(swap_faults, a_full_host_pool_falls_back_to_recompute_and_loses_nothing) {
  auto sim = std::make_unique<sim_executor>(16, 14, 2, test_vocab);
  sim_executor* inner = sim.get();
  const facade_options options = swap_options();
  engine_facade engine(components(std::move(sim)), options);
  const auto requests = growing_requests(21, 14);
  auto streams = submit_all(engine, requests);
  const auto deadline = steady::now() + 60s;
  std::vector<outcome> got;
  for (auto& s : streams) got.push_back(drain(s, deadline));
  sim_executor oracle_exec(16, 14, 2, test_vocab);
  const auto expected = offline(oracle_exec, nullptr, options.engine, requests);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].final.has_value()) << "stream " << i << " hangs";
    EXPECT_EQ(got[i].final->reason, finish_reason::length) << got[i].final->error;
    EXPECT_EQ(got[i].tokens, expected[i]) << "stream " << i;
  }
  const facade_stats s = engine.stats();
  EXPECT_GT(s.engine.num_preemptions_swap, 0u) << "some swaps fit";
  EXPECT_GT(s.engine.num_preemptions_recompute, 0u) << "the full host pool forced recompute";
  EXPECT_TRUE(engine.health().healthy);
  expect_pools_free(engine, "after constant preemption");
  EXPECT_TRUE(inner->errors().empty()) << inner->errors().front();
}

// The executor fails in the step after a swap-out, while a request's KV lives in the host pool: its
// host blocks are reported free too.
TEST(swap_faults, an_executor_failure_while_requests_are_swapped_out_frees_their_host_blocks) {
  fault_plan plan;
  bool swapped = false;  // touched only on the executor actor's thread
  auto exec = std::make_unique<fault_injecting_executor>(std::make_unique<sim_executor>(16, 14, 16, test_vocab), plan,
                                                         [&swapped](int64_t, const step_batch& b) {
                                                           if (swapped && b.swap_in.empty())
                                                             return executor_fault::throw_now;
                                                           swapped = swapped || !b.swap_out.empty();
                                                           return executor_fault::none;
                                                         });
  const facade_options options = swap_options();
  engine_facade engine(components(std::move(exec)), options);
  auto streams = submit_all(engine, growing_requests(33, 12));
  const auto deadline = steady::now() + 20s;
  int num_errors = 0;
  for (auto& s : streams) {
    outcome o = drain(s, deadline);
    ASSERT_TRUE(o.final.has_value()) << "stream " << s.id() << " hangs";
    num_errors += o.final->reason == finish_reason::error;
  }
  EXPECT_GT(num_errors, 0);
  EXPECT_FALSE(engine.health().healthy);
  expect_pools_free(engine, "after a failure with swapped-out requests");
}

}  // namespace
}  // namespace tessera::actors
