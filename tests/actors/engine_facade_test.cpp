// The engine facade end to end on the simulated executor: concurrent streams equal the offline
// engine's outputs, abort storms free every block without hanging a stream, admission control fails
// fast with "overloaded", an executor failure reaches every stream within a second and marks the
// runtime unhealthy, dropped handles abort their requests, shutdown ends everything, and event
// subscribers receive the engine's events.
#include "actors/engine_facade.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "actor_test_support.hpp"

namespace tessera::actors {
namespace {

using namespace std::chrono_literals;
using testing::char_tokenizer;
using testing::gated_executor;
using testing::offline_request;
using testing::run_offline;
using testing::sim_executor;
using testing::test_vocab;

constexpr int32_t num_blocks = 256;

facade_options small_options() {
  facade_options o;
  o.engine.block_size = 16;
  o.engine.max_num_seqs = 32;
  o.num_caf_threads = 2;
  o.max_waiting = 1000;
  o.shutdown_timeout = 2s;
  return o;
}

facade_components sim_components(std::unique_ptr<executor> exec) {
  facade_components c;
  c.exec = std::move(exec);
  c.tok = char_tokenizer();
  return c;
}

std::string random_text(std::mt19937& rng, int len) {
  static const std::string chars = "abcdefghijklmnopqrstuvwxyz";
  std::string s;
  for (int i = 0; i < len; ++i) s.push_back(chars[rng() % chars.size()]);
  return s;
}

sampling_params seeded(uint64_t seed, int32_t max_tokens) {
  sampling_params p;
  p.temperature = 0.8f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

struct collected {
  std::vector<token_id> tokens;
  std::string text;
  stream_final final;
  int num_finals = 0;
};

collected collect(stream_handle& s) {
  collected c;
  while (auto item = s.next(10s)) {
    if (auto* d = std::get_if<stream_delta>(&*item)) {
      EXPECT_EQ(c.num_finals, 0) << "a delta after the final";
      EXPECT_EQ(d->ticket, s.id());
      c.tokens.insert(c.tokens.end(), d->output.token_ids.begin(), d->output.token_ids.end());
      c.text += d->output.text;
    } else {
      c.final = std::get<stream_final>(*item);
      ++c.num_finals;
    }
  }
  EXPECT_EQ(c.num_finals, 1) << "stream " << s.id() << " must end with exactly one final";
  return c;
}

TEST(engine_facade, concurrent_streams_equal_the_offline_engine) {
  const auto tok = char_tokenizer();
  engine_facade engine(sim_components(std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab)), small_options());
  std::mt19937 rng(1);
  std::vector<offline_request> requests;
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back(random_text(rng, 3 + i % 20));
    encode_options o;
    o.add_special = tok->add_bos();
    requests.push_back({tok->encode(texts.back(), o), seeded(static_cast<uint64_t>(i), 8 + i % 17)});
  }
  // 64 submitters at once (4 threads x 16), then 64 concurrent readers.
  std::vector<stream_handle> streams(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) {
        submit_result r = engine.submit(prompt_input::from_text(texts[static_cast<size_t>(i)]),
                                        requests[static_cast<size_t>(i)].params);
        ASSERT_TRUE(r) << r.message;
        streams[static_cast<size_t>(i)] = r.stream;
      }
    });
  for (auto& t : threads) t.join();
  threads.clear();
  std::vector<collected> results(64);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) results[static_cast<size_t>(i)] = collect(streams[static_cast<size_t>(i)]);
    });
  for (auto& t : threads) t.join();

  sim_executor offline_exec(16, num_blocks, 0, test_vocab);
  engine_options eo = small_options().engine;
  const auto expected = run_offline(offline_exec, tok, eo, requests);
  std::set<ticket_id> ids;
  for (size_t i = 0; i < 64; ++i) {
    ids.insert(streams[i].id());
    EXPECT_EQ(results[i].tokens, expected[i]) << "request " << i;
    EXPECT_EQ(results[i].text, tok->decode(expected[i], true)) << "request " << i;
    EXPECT_EQ(results[i].final.reason, finish_reason::length);
    EXPECT_EQ(results[i].final.num_generated_tokens, static_cast<int32_t>(expected[i].size()));
    EXPECT_EQ(results[i].final.num_prompt_tokens, static_cast<int32_t>(requests[i].prompt.size()));
  }
  EXPECT_EQ(ids.size(), 64u) << "stream ids are unique";
  const facade_stats s = engine.stats();
  EXPECT_EQ(s.num_open, 0);
  EXPECT_EQ(s.num_queued, 0);
  EXPECT_EQ(s.num_completed, 64u);
  EXPECT_EQ(s.device.num_used, 0);
  EXPECT_TRUE(engine.health().healthy);
}

TEST(engine_facade, abort_storm_frees_every_block_and_hangs_no_stream) {
  facade_options options = small_options();
  options.engine.max_num_seqs = 64;
  engine_facade engine(sim_components(std::make_unique<sim_executor>(16, 128, 32, test_vocab)), options);
  std::mt19937 rng(7);
  constexpr int n = 200;
  std::vector<offline_request> requests;
  std::vector<stream_handle> streams;
  for (int i = 0; i < n; ++i) {
    std::vector<token_id> prompt;
    for (int k = 0; k < 4 + i % 30; ++k) prompt.push_back(1 + static_cast<token_id>(rng() % (test_vocab - 1)));
    requests.push_back({prompt, seeded(1000 + static_cast<uint64_t>(i), 4 + static_cast<int32_t>(rng() % 40))});
    submit_result r = engine.submit(prompt_input::from_ids(prompt), requests.back().params);
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
  }
  // Half of them, chosen at random, aborted at random moments by another thread.
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::set<int> aborted(order.begin(), order.begin() + n / 2);
  std::thread aborter([&] {
    std::mt19937 r2(3);
    for (int i : aborted) {
      if (r2() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(r2() % 2000));
      if (i % 2)
        streams[static_cast<size_t>(i)].abort();
      else
        engine.abort(streams[static_cast<size_t>(i)].id());
    }
  });
  std::vector<collected> results;
  for (auto& s : streams) results.push_back(collect(s));
  aborter.join();

  // The survivors' outputs are those of the offline engine (aborts around them change nothing).
  std::vector<offline_request> survivors;
  std::vector<int> survivor_index;
  for (int i = 0; i < n; ++i)
    if (!aborted.count(i)) {
      survivors.push_back(requests[static_cast<size_t>(i)]);
      survivor_index.push_back(i);
    }
  sim_executor offline_exec(16, 128, 32, test_vocab);
  const auto expected = run_offline(offline_exec, nullptr, options.engine, survivors);
  for (size_t k = 0; k < survivors.size(); ++k) {
    const collected& c = results[static_cast<size_t>(survivor_index[k])];
    EXPECT_EQ(c.final.reason, finish_reason::length);
    EXPECT_EQ(c.tokens, expected[k]) << "request " << survivor_index[k];
  }
  int num_aborted = 0;
  for (int i : aborted) {
    const collected& c = results[static_cast<size_t>(i)];
    // An abort racing the last token may lose: then the request simply completed.
    EXPECT_TRUE(c.final.reason == finish_reason::abort || c.final.reason == finish_reason::length);
    if (c.final.reason == finish_reason::abort) ++num_aborted;
    EXPECT_EQ(static_cast<int32_t>(c.tokens.size()), c.final.num_generated_tokens);
  }
  EXPECT_GT(num_aborted, 0);
  const facade_stats s = engine.stats();
  EXPECT_EQ(s.num_open, 0);
  EXPECT_EQ(s.num_queued, 0);
  EXPECT_EQ(s.device.num_used, 0) << "every device block returned";
  EXPECT_EQ(s.host.num_used, 0) << "every host block returned";
  EXPECT_EQ(s.num_aborted + s.num_completed, static_cast<uint64_t>(n));
}

TEST(engine_facade, a_full_waiting_queue_fails_fast_with_overloaded) {
  auto exec = std::make_unique<gated_executor>(num_blocks, 0, /*open=*/false);
  gated_executor* gate = exec.get();
  facade_options options = small_options();
  options.max_waiting = 4;
  engine_facade engine(sim_components(std::move(exec)), options);
  std::vector<stream_handle> streams;
  for (int i = 0; i < 4; ++i) {
    submit_result r = engine.submit(prompt_input::from_ids({1, 2, 3}), seeded(1, 4));
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
  }
  // The executor is held: nothing was admitted, so the queue is full.
  submit_result rejected = engine.submit(prompt_input::from_ids({1, 2, 3}), seeded(1, 4));
  EXPECT_FALSE(rejected);
  EXPECT_EQ(rejected.error, submit_error::overloaded);
  EXPECT_NE(rejected.message.find("overloaded"), std::string::npos);
  EXPECT_EQ(engine.stats().num_rejected, 1u);

  sampling_params bad;
  bad.temperature = -1;
  submit_result invalid = engine.submit(prompt_input::from_ids({1}), bad);
  EXPECT_EQ(invalid.error, submit_error::invalid);

  gate->set_open(true);
  for (auto& s : streams) EXPECT_EQ(collect(s).final.reason, finish_reason::length);
  submit_result again = engine.submit(prompt_input::from_ids({1, 2, 3}), seeded(1, 4));
  ASSERT_TRUE(again) << "admission reopens once the queue drains";
  EXPECT_EQ(collect(again.stream).final.reason, finish_reason::length);
}

TEST(engine_facade, executor_failure_reaches_every_stream_within_a_second) {
  auto exec = std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab);
  exec->fail_at_step(5);
  facade_options options = small_options();
  options.engine.max_num_seqs = 4;  // some requests still wait when the executor dies
  engine_facade engine(sim_components(std::move(exec)), options);
  std::vector<stream_handle> streams;
  for (int i = 0; i < 12; ++i) {
    submit_result r = engine.submit(prompt_input::from_ids({1, 2, static_cast<token_id>(3 + i)}), seeded(1, 1000));
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
  }
  for (auto& s : streams) {
    // Generous guard: the failure is reported in milliseconds; a hang would block here forever.
    std::optional<stream_final> final;
    while (auto item = s.next(1s)) {
      if (auto* f = std::get_if<stream_final>(&*item)) final = *f;
    }
    ASSERT_TRUE(final.has_value()) << "stream " << s.id() << " got no final within a second";
    EXPECT_EQ(final->reason, finish_reason::error);
    EXPECT_FALSE(final->error.empty());
  }
  const health_report h = engine.health();
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.message.find("injected failure"), std::string::npos) << h.message;
  submit_result r = engine.submit(prompt_input::from_ids({1}), seeded(1, 4));
  EXPECT_EQ(r.error, submit_error::unhealthy);
}

TEST(engine_facade, dropping_a_handle_aborts_its_request) {
  engine_facade engine(sim_components(std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab)), small_options());
  {
    submit_result r = engine.submit(prompt_input::from_ids({4, 5, 6}), seeded(1, 1 << 20));
    ASSERT_TRUE(r);
    ASSERT_TRUE(r.stream.next(30s).has_value()) << "it started";
  }
  for (int i = 0; i < 500 && engine.stats().num_open > 0; ++i) std::this_thread::sleep_for(10ms);
  const facade_stats s = engine.stats();
  EXPECT_EQ(s.num_open, 0);
  EXPECT_EQ(s.num_aborted, 1u);
  EXPECT_EQ(s.device.num_used, 0);
}

// Tokenizer actors have threads of their own (detached): with every tokenizer busy on a prompt (held
// inside the encoder here by the test hook) and as many tokenizers as CAF's cooperative threads, as a
// machine of 16 cores or more gets by default (4 and 4), a stream still receives its deltas. When the
// tokenizers were cooperative actors they occupied every thread that delivers deltas, and the stream
// froze until they finished (CI: no delta during 8 big /tokenize requests, tests/e2e/adversarial_test.py).
TEST(engine_facade, busy_tokenizers_never_hold_up_a_streams_deltas) {
  struct hold {
    std::mutex mutex;
    std::condition_variable cv;
    int entered = 0;
    bool released = false;
    void release() {
      std::lock_guard lock(mutex);
      released = true;
      cv.notify_all();
    }
  };
  auto held = std::make_shared<hold>();
  std::atomic<int> answered{0};
  facade_components c = sim_components(std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab));
  c.tokenizer_exit_when = [held](const prompt_input& p) {
    if (p.text != "hold") return false;
    std::unique_lock lock(held->mutex);
    ++held->entered;
    held->cv.notify_all();
    held->cv.wait(lock, [&] { return held->released; });
    return false;  // encode it after all
  };
  facade_options o = small_options();
  o.num_tokenizer_actors = o.num_caf_threads;
  engine_facade engine(std::move(c), o);
  submit_result r = engine.submit(prompt_input::from_ids({4, 5, 6}), seeded(1, 1 << 20));
  ASSERT_TRUE(r) << r.message;
  ASSERT_TRUE(r.stream.next(30s).has_value()) << "it started";
  // Round robin: one held prompt per tokenizer actor.
  for (int i = 0; i < o.num_tokenizer_actors; ++i)
    engine.tokenize_async(prompt_input::from_text("hold"), [&answered](tokenize_result t) {
      EXPECT_TRUE(t.error.empty()) << t.error;
      ++answered;
    });
  bool all_busy;
  {
    std::unique_lock lock(held->mutex);
    all_busy = held->cv.wait_for(lock, 30s, [&] { return held->entered == o.num_tokenizer_actors; });
  }
  int fresh = 0;
  if (all_busy) {
    r.stream.take_all();  // what was delivered before; what comes now comes while every tokenizer is held
    while (fresh < 20 && r.stream.next(10s).has_value()) ++fresh;
  }
  held->release();
  ASSERT_TRUE(all_busy) << held->entered << " of " << o.num_tokenizer_actors << " tokenizers took a held prompt";
  EXPECT_EQ(fresh, 20) << "the stream stalled while every tokenizer was busy";
  for (int i = 0; i < 3000 && answered < o.num_tokenizer_actors; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(answered, o.num_tokenizer_actors) << "the held prompts are answered once released";
  r.stream.abort();
  const finish_reason end = r.stream.wait().reason;
  EXPECT_TRUE(end == finish_reason::abort || end == finish_reason::length) << to_string(end);
}

// A reader that never blocks on a stream (the server's I/O threads): each stream's ready hook posts its
// index to one mailbox, and a single consumer drains the woken stream with take_all(). Every stream
// still equals the offline engine, ends with exactly one final, and no wake-up is lost (a lost one
// leaves the consumer waiting with tokens buffered).
TEST(engine_facade, ready_hooks_drive_many_streams_without_a_blocking_read) {
  const auto tok = char_tokenizer();
  engine_facade engine(sim_components(std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab)), small_options());
  constexpr size_t num_streams = 32;
  std::vector<offline_request> requests;
  std::vector<stream_handle> streams;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<size_t> woken;
  for (size_t i = 0; i < num_streams; ++i) {
    requests.push_back({{1, static_cast<token_id>(2 + i % 50), 3}, seeded(i, static_cast<int32_t>(5 + i % 23))});
    submit_result r = engine.submit(prompt_input::from_ids(requests.back().prompt), requests.back().params);
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
    streams.back().on_ready([&, i] {
      {
        std::lock_guard lock(mutex);
        woken.push_back(i);
      }
      cv.notify_one();
    });
  }
  std::vector<std::vector<token_id>> tokens(num_streams);
  std::vector<int> num_finals(num_streams, 0);
  size_t num_done = 0;
  while (num_done < num_streams) {
    size_t i;
    {
      std::unique_lock lock(mutex);
      ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !woken.empty(); }))
          << num_done << " streams ended, a wake-up was lost";
      i = woken.front();
      woken.pop_front();
    }
    for (stream_item& item : streams[i].take_all()) {
      if (auto* d = std::get_if<stream_delta>(&item)) {
        EXPECT_EQ(num_finals[i], 0) << "a delta after the final, stream " << i;
        tokens[i].insert(tokens[i].end(), d->output.token_ids.begin(), d->output.token_ids.end());
      } else {
        EXPECT_EQ(std::get<stream_final>(item).reason, finish_reason::length);
        if (num_finals[i]++ == 0) ++num_done;
      }
    }
  }
  sim_executor offline_exec(16, num_blocks, 0, test_vocab);
  const auto expected = run_offline(offline_exec, tok, small_options().engine, requests);
  for (size_t i = 0; i < num_streams; ++i) {
    EXPECT_EQ(tokens[i], expected[i]) << "request " << i;
    EXPECT_EQ(num_finals[i], 1) << "request " << i;
  }
  for (auto& s : streams) s.on_ready({});
}

TEST(engine_facade, shutdown_aborts_what_does_not_finish_in_time) {
  auto exec = std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab);
  engine_facade engine(sim_components(std::move(exec)), small_options());
  std::vector<stream_handle> streams;
  for (int i = 0; i < 8; ++i)
    streams.push_back(engine.submit(prompt_input::from_ids({7, 8}), seeded(1, 1 << 20)).stream);
  submit_result quick = engine.submit(prompt_input::from_ids({7, 8}), seeded(2, 2));
  ASSERT_TRUE(quick);
  engine.shutdown(200ms);
  for (auto& s : streams) EXPECT_EQ(collect(s).final.reason, finish_reason::abort);
  EXPECT_EQ(collect(quick.stream).final.reason, finish_reason::length);
  EXPECT_EQ(engine.submit(prompt_input::from_ids({1}), seeded(1, 1)).error, submit_error::shutting_down);
}

TEST(engine_facade, event_subscribers_see_every_admission_and_finish) {
  engine_facade engine(sim_components(std::make_unique<sim_executor>(16, num_blocks, 0, test_vocab)), small_options());
  std::mutex mutex;
  std::multiset<std::pair<event_kind, request_id>> seen;
  uint64_t num_records = 0, num_dropped = 0, last_step = 0;
  bool in_order = true;
  engine.subscribe_events(
      [&](const event_batch& b) {
        std::lock_guard lock(mutex);
        num_records += b.num_records;
        num_dropped += b.num_dropped_events;
        for (const bus_event& e : b.events) {
          if (e.step < last_step) in_order = false;
          last_step = e.step;
          seen.insert({e.event.kind, e.event.request});
        }
      },
      1000.0);
  std::this_thread::sleep_for(50ms);  // the subscription travels ahead of the first step
  std::set<request_id> requests;
  std::vector<stream_handle> streams;
  for (int i = 0; i < 10; ++i) streams.push_back(engine.submit(prompt_input::from_ids({3, 4, 5}), seeded(1, 6)).stream);
  for (auto& s : streams) requests.insert(collect(s).final.request);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lock(mutex);
      if (seen.count({event_kind::finished, *requests.rbegin()}) || seen.size() >= 40) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  engine.shutdown();
  std::lock_guard lock(mutex);
  EXPECT_TRUE(in_order);
  EXPECT_EQ(num_dropped, 0u);
  EXPECT_GT(num_records, 0u);
  EXPECT_LE(num_records, engine.stats().engine.num_steps);
  for (request_id r : requests) {
    EXPECT_EQ(seen.count({event_kind::queued, r}), 1u) << r;
    EXPECT_EQ(seen.count({event_kind::admitted, r}), 1u) << r;
    EXPECT_EQ(seen.count({event_kind::first_token, r}), 1u) << r;
    EXPECT_EQ(seen.count({event_kind::finished, r}), 1u) << r;
  }
}

}  // namespace
}  // namespace tessera::actors
