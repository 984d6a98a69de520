// Each actor's protocol on its own, driven by a scoped_actor: tokenizer (encode), executor (exec
// jobs, failure -> error reply and actor down), the actor_executor adapter, the KV manager (publish /
// query), the event bus (coalescing, one batch in flight, bounded events) and the engine actor (stream
// of deltas then one final, abort, subscriber down -> abort, executor failure or death -> error
// finals within a second, the executor off CAF's worker threads, and an abort in every state a
// request can be in: being tokenized, queued, prefilling, swapped out).
#include <gtest/gtest.h>
#include <caf/all.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "actor_test_support.hpp"
#include "actors/fault_injection.hpp"
#include "actors/runtime_actors.hpp"

namespace tessera::actors {
namespace {

using namespace std::chrono_literals;
using testing::char_tokenizer;
using testing::sim_executor;
using testing::test_vocab;

struct actor_test : ::testing::Test {
  actor_test() : sys(init_cfg()) {}
  caf::actor_system_config& init_cfg() {
    cfg.set("scheduler.max-threads", 2);
    add_message_types(cfg);
    return cfg;
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
};

TEST_F(actor_test, tokenizer_encodes_text_passes_ids_and_answers_errors) {
  auto tok = char_tokenizer();
  auto encoder = std::make_shared<const prompt_encoder>(tok, std::nullopt);
  caf::actor a = spawn_tokenizer_actor(sys, encoder);
  caf::scoped_actor self{sys};

  std::vector<token_id> got;
  self->request(a, 5s, encode_atom_v, std::make_shared<const prompt_input>(prompt_input::from_text("helloworld")))
      .receive([&](std::vector<token_id>& ids) { got = ids; }, [&](caf::error& e) { FAIL() << sys.render(e); });
  encode_options o;
  o.add_special = tok->add_bos();
  EXPECT_EQ(got, tok->encode("helloworld", o));
  EXPECT_EQ(tok->decode(got, true), "helloworld");

  self->request(a, 5s, encode_atom_v, std::make_shared<const prompt_input>(prompt_input::from_ids({5, 6, 7})))
      .receive([&](std::vector<token_id>& ids) { got = ids; }, [&](caf::error& e) { FAIL() << sys.render(e); });
  EXPECT_EQ(got, (std::vector<token_id>{5, 6, 7}));

  bool failed = false;
  self->request(a, 5s, encode_atom_v, std::make_shared<const prompt_input>(prompt_input::from_chat({})))
      .receive([&](std::vector<token_id>&) {}, [&](caf::error&) { failed = true; });
  EXPECT_TRUE(failed) << "an empty conversation is an error reply, not a crash";
  self->send_exit(a, caf::exit_reason::user_shutdown);
}

step_batch one_sequence_batch(seq_id seq, std::vector<token_id> tokens) {
  step_batch b;
  sequence_slice s;
  s.seq = seq;
  s.tokens = std::move(tokens);
  s.num_computed = 0;
  s.block_table = {0, 1};
  b.seqs.push_back(s);
  return b;
}

TEST_F(actor_test, executor_runs_jobs_like_the_executor_itself) {
  auto exec = std::make_shared<sim_executor>(16, 8, 0, test_vocab);
  sim_executor reference(16, 8, 0, test_vocab);
  caf::actor a = spawn_executor_actor(sys, exec);
  caf::scoped_actor self{sys};
  const step_batch batch = one_sequence_batch(seq_id{1}, {3, 4, 5, 6});
  step_output out, expected;
  bool done = false;
  self->request(a, 5s, exec_atom_v, exec_job{&batch, &out})
      .receive([&](done_atom) { done = true; }, [&](caf::error& e) { FAIL() << sys.render(e); });
  ASSERT_TRUE(done);
  reference.execute(batch, expected);
  EXPECT_EQ(out.logits, expected.logits);
  EXPECT_EQ(out.first_row, expected.first_row);
  EXPECT_TRUE(exec->errors().empty());
  self->send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_F(actor_test, executor_failure_is_an_error_reply_and_the_actor_goes_down) {
  auto exec = std::make_shared<sim_executor>(16, 8, 0, test_vocab);
  exec->fail_at_step(1);
  caf::actor a = spawn_executor_actor(sys, exec);
  caf::scoped_actor self{sys};
  self->monitor(a);
  const step_batch batch = one_sequence_batch(seq_id{1}, {3, 4});
  step_output out;
  std::string error;
  self->request(a, 5s, exec_atom_v, exec_job{&batch, &out})
      .receive([&](done_atom) {}, [&](caf::error& e) { error = sys.render(e); });
  EXPECT_NE(error.find("injected failure"), std::string::npos) << error;
  bool down = false;
  self->receive([&](const caf::down_msg&) { down = true; }, caf::after(5s) >> [] {});
  EXPECT_TRUE(down);
}

TEST_F(actor_test, actor_executor_forwards_and_fails_for_good_after_a_failure) {
  auto exec = std::make_shared<sim_executor>(16, 8, 0, test_vocab);
  exec->fail_at_step(2);
  caf::actor a = spawn_executor_actor(sys, exec);
  actor_executor adapter(sys, a, *exec);
  EXPECT_EQ(adapter.config().vocab_size, test_vocab);
  EXPECT_EQ(adapter.kv_spec().num_device_blocks, 8);
  sim_executor reference(16, 8, 0, test_vocab);
  const step_batch batch = one_sequence_batch(seq_id{1}, {7, 8, 9});
  step_output out, expected;
  adapter.execute(batch, out);
  reference.execute(batch, expected);
  EXPECT_EQ(out.logits, expected.logits);
  EXPECT_THROW(adapter.execute(batch, out), std::runtime_error);
  EXPECT_TRUE(adapter.failed());
  EXPECT_THROW(adapter.execute(batch, out), std::runtime_error) << "a dead executor stays dead";
}

// Overlapped steps through the adapter: submit() and wait() reach the executor on its actor, in
// order, two steps in flight. The executor queues each step's results at submit and hands them out at
// wait, as the CUDA executor's slots do; the results are the plain executor's.
struct queues_steps : sim_executor {
  using sim_executor::sim_executor;
  bool overlaps_steps() const override { return true; }
  void submit(const step_batch& batch) override {
    queued.emplace_back();
    execute(batch, queued.back());
  }
  void wait(step_output& out) override {
    if (queued.empty()) throw std::logic_error("nothing submitted");
    out = std::move(queued.front());
    queued.pop_front();
  }
  std::deque<step_output> queued;
};

TEST_F(actor_test, actor_executor_passes_submit_and_wait_through_in_order) {
  auto exec = std::make_shared<queues_steps>(16, 8, 0, test_vocab);
  caf::actor a = spawn_executor_actor(sys, exec);
  actor_executor adapter(sys, a, *exec);
  ASSERT_TRUE(adapter.overlaps_steps());
  sim_executor reference(16, 8, 0, test_vocab);
  const step_batch first = one_sequence_batch(seq_id{1}, {3, 4, 5});
  const step_batch second = one_sequence_batch(seq_id{2}, {9, 8});
  adapter.submit(first);
  adapter.submit(second);
  step_output got1, got2, want1, want2;
  adapter.wait(got1);
  adapter.wait(got2);
  reference.execute(first, want1);
  reference.execute(second, want2);
  EXPECT_EQ(got1.logits, want1.logits);
  EXPECT_EQ(got2.logits, want2.logits);
  EXPECT_NE(got1.logits, got2.logits);
  EXPECT_THROW(adapter.wait(got1), std::runtime_error) << "the executor's error, as the adapter's";
  caf::scoped_actor self{sys};
  self->send_exit(a, caf::exit_reason::user_shutdown);
}

// An executor that claims every optional capability (and names its KV dtype), to see each one through
// the adapters in front of the real executor. Only its claims are looked at, never execute().
struct claims_everything : sim_executor {
  using sim_executor::sim_executor;
  const char* kv_cache_dtype() const override { return "bf16"; }
  bool samples_on_device() const override { return true; }
  bool overlaps_steps() const override { return true; }
  bool takes_late_masks() const override { return true; }
  bool reads_only_window() const override { return true; }
  bool verifies_token_trees() const override { return true; }
  bool pools_hidden_states() const override { return true; }
  bool scores_prompts() const override { return true; }
  // Two KV layer groups (a sliding layer and a global one): the engine must get a table per group.
  kv_layer_groups kv_groups() const override { return {1, {8, 0}, {0, 1}, {0, 0}}; }
};

void expect_same_capabilities(const executor& got, const executor& want) {
  EXPECT_STREQ(got.name(), want.name());
  EXPECT_STREQ(got.kv_cache_dtype(), want.kv_cache_dtype());
  EXPECT_EQ(got.samples_on_device(), want.samples_on_device());
  EXPECT_EQ(got.overlaps_steps(), want.overlaps_steps());
  EXPECT_EQ(got.takes_late_masks(), want.takes_late_masks());
  EXPECT_EQ(got.reads_only_window(), want.reads_only_window());
  EXPECT_EQ(got.verifies_token_trees(), want.verifies_token_trees());
  EXPECT_EQ(got.pools_hidden_states(), want.pools_hidden_states());
  EXPECT_EQ(got.scores_prompts(), want.scores_prompts());
  const kv_layer_groups g = got.kv_groups(), w = want.kv_groups();
  EXPECT_EQ(g.layers_per_block, w.layers_per_block);
  EXPECT_EQ(g.windows, w.windows);
  EXPECT_EQ(g.layer_group, w.layer_group);
  EXPECT_EQ(g.layer_slot, w.layer_slot);
}

// The served engine talks to the executor through actor_executor (and, in fault-injection runs, the
// fault-injecting wrapper): a capability either forgets is off in every served engine (the window's
// blocks never freed, device sampling never used, token trees cut to chains), with no error anywhere.
TEST_F(actor_test, the_adapters_report_every_capability_of_the_executor_behind_them) {
  for (bool claims : {true, false}) {
    std::shared_ptr<sim_executor> exec = claims ? std::make_shared<claims_everything>(16, 8, 0, test_vocab)
                                                : std::make_shared<sim_executor>(16, 8, 0, test_vocab);
    caf::actor a = spawn_executor_actor(sys, exec);
    actor_executor adapter(sys, a, *exec);
    expect_same_capabilities(adapter, *exec);
    std::unique_ptr<executor> inner = claims ? std::make_unique<claims_everything>(16, 8, 0, test_vocab)
                                             : std::make_unique<sim_executor>(16, 8, 0, test_vocab);
    const executor& inner_ref = *inner;
    fault_injecting_executor faulty(std::move(inner), fault_plan{});
    expect_same_capabilities(faulty, inner_ref);
    caf::scoped_actor self{sys};
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
}

TEST_F(actor_test, kv_manager_publishes_the_latest_occupancy_and_keeps_the_last_block_view) {
  caf::actor kv = spawn_kv_manager_actor(sys);
  caf::scoped_actor self{sys};
  occupancy_ptr got = std::make_shared<kv_occupancy>();
  self->request(kv, 5s, query_atom_v).receive([&](occupancy_ptr& o) { got = o; }, [](caf::error&) {});
  EXPECT_EQ(got, nullptr) << "nothing published yet";

  auto first = std::make_shared<kv_occupancy>();
  first->step = 1;
  first->device = {10, 3, 7, 1};
  first->blocks = std::make_shared<const std::vector<block_info>>(std::vector<block_info>(10));
  first->blocks_step = 1;
  auto second = std::make_shared<kv_occupancy>();
  second->step = 2;
  second->device = {10, 4, 6, 0};
  self->send(kv, occupy_atom_v, occupancy_ptr(first));
  self->send(kv, occupy_atom_v, occupancy_ptr(second));
  self->request(kv, 5s, query_atom_v).receive([&](occupancy_ptr& o) { got = o; }, [](caf::error&) {});
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->step, 2u);
  EXPECT_EQ(got->device.num_used, 4);
  ASSERT_NE(got->blocks, nullptr) << "a step without a block snapshot keeps the previous one";
  EXPECT_EQ(got->blocks->size(), 10u);
  EXPECT_EQ(got->blocks_step, 1u);

  usage_report usage;
  self->request(kv, 5s, query_atom_v, usage_atom_v).receive([&](usage_report& u) { usage = u; }, [](caf::error&) {});
  EXPECT_EQ(usage.step, 2u);
  EXPECT_EQ(usage.device.num_free, 6);
  self->send_exit(kv, caf::exit_reason::user_shutdown);
}

record_ptr make_record(uint64_t step, int32_t num_events) {
  auto r = std::make_shared<step_record>();
  r->step = step;
  r->device.num_used = static_cast<int32_t>(step);
  for (int32_t i = 0; i < num_events; ++i) {
    engine_event e;
    e.request = request_id{step * 100 + static_cast<uint64_t>(i)};
    r->events.push_back(e);
  }
  return r;
}

TEST_F(actor_test, event_bus_keeps_one_batch_in_flight_and_coalesces_the_rest) {
  event_bus_options options;
  options.max_events_per_batch = 50;
  caf::actor bus = spawn_event_bus(sys, options);
  caf::scoped_actor sink{sys};
  sink->send(bus, subscribe_atom_v, caf::actor(sink), 0.0);  // no rate limit: acks alone pace it
  // Make sure the subscription is in before publishing (same sender -> FIFO).
  sink->send(bus, publish_atom_v, make_record(1, 2));
  event_batch_ptr first;
  sink->receive([&](events_atom, event_batch_ptr& b) { first = b; }, caf::after(5s) >> [] {});
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->num_records, 1u);
  ASSERT_EQ(first->events.size(), 2u);
  EXPECT_EQ(first->events[0].event.request, request_id{100});

  // Not acknowledged: the next 30 records (3 events each) pile up into one batch.
  for (uint64_t s = 2; s <= 31; ++s) sink->send(bus, publish_atom_v, make_record(s, 3));
  bool early = false;
  sink->receive([&](events_atom, event_batch_ptr&) { early = true; }, caf::after(200ms) >> [] {});
  EXPECT_FALSE(early) << "a second batch was sent before the first was acknowledged";
  sink->send(bus, ack_atom_v);
  event_batch_ptr second;
  sink->receive([&](events_atom, event_batch_ptr& b) { second = b; }, caf::after(5s) >> [] {});
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->num_records, 30u);
  EXPECT_EQ(second->latest->step, 31u) << "latest wins";
  ASSERT_EQ(second->events.size(), 50u) << "events are bounded per batch";
  EXPECT_EQ(second->num_dropped_events, 90u - 50u);
  for (size_t i = 0; i < second->events.size(); ++i) {
    const uint64_t step = 2 + i / 3;
    EXPECT_EQ(second->events[i].step, step);
    EXPECT_EQ(second->events[i].event.request, request_id{step * 100 + i % 3}) << "events stay in order";
  }
  sink->send_exit(bus, caf::exit_reason::user_shutdown);
}

// ---- engine actor -----------------------------------------------------------------------------

struct engine_actor_fixture : actor_test {
  void start(int32_t num_blocks = 64, int64_t fail_at = -1) {
    exec = std::make_shared<sim_executor>(16, num_blocks, 0, test_vocab);
    if (fail_at > 0) exec->fail_at_step(fail_at);
    engine_options eo;
    eo.block_size = 16;
    start_with(exec, eo);
  }
  // `tokenizers` empty: one real tokenizer actor.
  void start_with(std::shared_ptr<executor> e, engine_options eo, std::vector<caf::actor> tokenizers = {}) {
    tok = char_tokenizer();
    if (tokenizers.empty()) {
      tokenizer_actor = spawn_tokenizer_actor(sys, std::make_shared<const prompt_encoder>(tok, std::nullopt));
      tokenizers = {tokenizer_actor};
    }
    exec_actor = spawn_executor_actor(sys, e);
    kv = spawn_kv_manager_actor(sys);
    shared = std::make_shared<runtime_shared>();
    engine_actor_config c;
    c.executor_actor = exec_actor;
    c.executor_metadata = e;
    c.tok = tok;
    c.engine = eo;
    c.tokenizers = std::move(tokenizers);
    c.kv_manager = kv;
    c.shared = shared;
    c.kv_snapshot_interval_seconds = 0;
    engine = spawn_engine_actor(sys, c);
  }
  ~engine_actor_fixture() override {
    for (caf::actor* a : {&engine, &exec_actor, &kv, &tokenizer_actor})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
  }

  submit_ptr make_submit(ticket_id ticket, prompt_input prompt, int32_t max_tokens) {
    auto r = std::make_shared<submit_request>();
    r->ticket = ticket;
    r->prompt = std::move(prompt);
    r->params.temperature = 0;
    r->params.max_tokens = max_tokens;
    r->params.ignore_eos = true;
    shared->num_queued.fetch_add(1);
    shared->num_open.fetch_add(1);
    return r;
  }

  // Receives a whole stream on `self`: the tokens of the deltas and the final.
  std::pair<std::vector<token_id>, stream_final> collect(caf::scoped_actor& self, ticket_id ticket) {
    std::vector<token_id> tokens;
    stream_final final;
    bool done = false;
    while (!done) {
      self->receive(
          [&](delta_atom, delta_ptr& d) {
            EXPECT_EQ(d->ticket, ticket);
            tokens.insert(tokens.end(), d->output.token_ids.begin(), d->output.token_ids.end());
          },
          [&](final_atom, final_ptr& f) {
            EXPECT_EQ(f->ticket, ticket);
            final = *f;
            done = true;
          },
          caf::after(10s) >>
              [&] {
                ADD_FAILURE() << "stream " << ticket << " hangs";
                done = true;
              });
    }
    return {tokens, final};
  }

  std::shared_ptr<sim_executor> exec;
  std::shared_ptr<const tokenizer> tok;
  std::shared_ptr<runtime_shared> shared;
  caf::actor tokenizer_actor, exec_actor, kv, engine;
};

TEST_F(engine_actor_fixture, a_text_request_streams_the_oracle_tokens_then_one_final) {
  start();
  caf::scoped_actor self{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{7}, prompt_input::from_text("hello"), 12), caf::actor(self));
  auto [tokens, final] = collect(self, ticket_id{7});
  // Oracle: greedy continuation under the simulated model, from the encoded prompt.
  encode_options o;
  o.add_special = tok->add_bos();
  std::vector<token_id> history = tok->encode("hello", o);
  std::vector<token_id> expected;
  for (int i = 0; i < 12; ++i) {
    expected.push_back(testing::ranked_token(history, test_vocab));
    history.push_back(expected.back());
  }
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(final.reason, finish_reason::length);
  EXPECT_EQ(final.num_generated_tokens, 12);
  ASSERT_EQ(final.choices.size(), 1u);
  EXPECT_FALSE(final.choices[0].timeline.empty());
  EXPECT_GE(final.seconds_to_first_token, 0);
  EXPECT_EQ(shared->num_open.load(), 0);
  EXPECT_EQ(shared->num_queued.load(), 0);
  EXPECT_TRUE(exec->errors().empty());
}

TEST_F(engine_actor_fixture, abort_and_subscriber_down_end_requests_and_free_their_blocks) {
  start();
  caf::scoped_actor self{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{1}, prompt_input::from_ids({1, 2, 3, 4, 5}), 100000),
             caf::actor(self));
  // Let it decode a few tokens, then abort.
  int deltas = 0;
  self->receive_for(deltas, 3)([&](delta_atom, delta_ptr&) {});
  self->send(engine, abort_atom_v, ticket_id{1});
  auto [tokens, final] = collect(self, ticket_id{1});
  EXPECT_EQ(final.reason, finish_reason::abort);

  // A subscriber that goes away: its request is aborted (no one else is told).
  {
    caf::scoped_actor gone{sys};
    gone->send(engine, submit_atom_v, make_submit(ticket_id{2}, prompt_input::from_ids({9, 9, 9}), 100000),
               caf::actor(gone));
    gone->receive([&](delta_atom, delta_ptr&) {});
  }  // `gone` terminates here
  runtime_status status;
  for (int i = 0; i < 500; ++i) {
    self->request(engine, 5s, status_atom_v).receive([&](runtime_status& s) { status = s; }, [](caf::error&) {});
    if (status.num_tickets == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(status.num_tickets, 0);
  EXPECT_TRUE(status.healthy);
  EXPECT_EQ(shared->num_aborted, 2u);
  usage_report usage;
  self->request(kv, 5s, query_atom_v, usage_atom_v).receive([&](usage_report& u) { usage = u; }, [](caf::error&) {});
  EXPECT_EQ(usage.device.num_used, 0) << "every block returned";
}

// Receives (skipping deltas) until `num_streams` finals arrived, each an error with a message; false
// when `patience` passes without the next one.
bool receive_error_finals(caf::scoped_actor& self, int num_streams, caf::timespan patience) {
  for (int finals = 0; finals < num_streams;) {
    bool timed_out = false;
    self->receive([&](delta_atom, delta_ptr&) {},
                  [&](final_atom, final_ptr& f) {
                    EXPECT_EQ(f->reason, finish_reason::error);
                    EXPECT_FALSE(f->error.empty());
                    ++finals;
                  },
                  caf::after(patience) >> [&] { timed_out = true; });
    if (timed_out) return false;
  }
  return true;
}

TEST_F(engine_actor_fixture, an_executor_failure_ends_every_stream_with_an_error) {
  start(64, 3);
  caf::scoped_actor self{sys};
  for (uint64_t t = 1; t <= 4; ++t)
    self->send(engine, submit_atom_v,
               make_submit(ticket_id{t}, prompt_input::from_ids({1, 2, static_cast<token_id>(t)}), 1000),
               caf::actor(self));
  ASSERT_TRUE(receive_error_finals(self, 4, 5s)) << "a stream hangs after the executor failed";
  EXPECT_FALSE(shared->healthy.load());
  // Later submits get an error final at once.
  self->send(engine, submit_atom_v, make_submit(ticket_id{9}, prompt_input::from_ids({1}), 4), caf::actor(self));
  auto [tokens, final] = collect(self, ticket_id{9});
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(final.reason, finish_reason::error);
}

TEST_F(engine_actor_fixture, an_executor_actor_killed_mid_stream_errors_every_stream_within_a_second) {
  start();
  caf::scoped_actor self{sys};
  for (uint64_t t = 1; t <= 4; ++t)
    self->send(engine, submit_atom_v,
               make_submit(ticket_id{t}, prompt_input::from_ids({3, static_cast<token_id>(t)}), 1 << 20),
               caf::actor(self));
  int deltas = 0;
  self->receive_for(deltas, 8)([&](delta_atom, delta_ptr&) {});  // streaming
  // Not an exception inside execute(): the actor itself goes away (a crash, a kill).
  caf::anon_send_exit(exec_actor, caf::exit_reason::kill);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(receive_error_finals(self, 4, 1s)) << "a stream got no final within a second of the executor's death";
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 2s);  // generous: milliseconds in practice
  EXPECT_FALSE(shared->healthy.load());
  runtime_status status;
  self->request(engine, 5s, status_atom_v).receive([&](runtime_status& s) { status = s; }, [](caf::error&) {});
  EXPECT_FALSE(status.healthy);
  EXPECT_FALSE(status.message.empty());
  EXPECT_EQ(status.num_tickets, 0);
}

TEST_F(engine_actor_fixture, the_executor_runs_on_its_own_thread_never_on_a_caf_worker) {
  auto held = std::make_shared<testing::held_executor>(64, 0);
  start_with(held, engine_options{});
  caf::scoped_actor self{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{1}, prompt_input::from_ids({1, 2, 3}), 4), caf::actor(self));
  auto [tokens, final] = collect(self, ticket_id{1});
  EXPECT_EQ(final.reason, finish_reason::length);
  // The compute blocks for a whole step: it must run on the executor actor's private thread, or it
  // would stall every event-based actor sharing that cooperative worker.
  EXPECT_EQ(held->thread_names(), (std::set<std::string>{"caf.actor"}));
}

// ---- cancellation in every state --------------------------------------------------------------
// An abort takes effect at the next step at the latest, whatever state the request is in. Each test
// holds the executor inside a chosen step (the engine actor is blocked there), sends the abort, then
// releases the step: the abort meets exactly the state that step left the request in, and the
// request's timeline shows which state that was.

std::vector<lifecycle_stage> stages_of(const stream_final& f) {
  std::vector<lifecycle_stage> out;
  if (!f.choices.empty())
    for (const lifecycle_entry& e : f.choices.front().timeline) out.push_back(e.stage);
  return out;
}

std::vector<token_id> greedy_oracle(std::vector<token_id> history, int32_t num_tokens) {
  std::vector<token_id> out;
  for (int32_t i = 0; i < num_tokens; ++i) {
    out.push_back(testing::ranked_token(history, test_vocab));
    history.push_back(out.back());
  }
  return out;
}

TEST_F(engine_actor_fixture, an_abort_while_the_prompt_is_tokenized_ends_the_stream_at_once) {
  // The test plays the tokenizer, so the prompt stays "being tokenized" as long as it likes.
  caf::scoped_actor tokenizer{sys};
  start_with(std::make_shared<sim_executor>(16, 64, 0, test_vocab), engine_options{}, {caf::actor(tokenizer)});
  caf::scoped_actor self{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{5}, prompt_input::from_text("abc"), 8), caf::actor(self));
  caf::response_promise answer;
  bool asked = false;
  tokenizer->receive(
      [&](encode_atom, prompt_ptr& p) {
        EXPECT_EQ(p->text, "abc");
        answer = tokenizer->make_response_promise();
        asked = true;
      },
      caf::after(10s) >> [] {});
  ASSERT_TRUE(asked) << "the engine actor asks a tokenizer actor to encode a text prompt";
  self->send(engine, abort_atom_v, ticket_id{5});
  auto [tokens, final] = collect(self, ticket_id{5});
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(final.reason, finish_reason::abort);
  EXPECT_EQ(final.request, request_id{0}) << "it never reached the engine";
  // The late token ids are dropped: nothing more reaches the subscriber, the engine stays empty.
  answer.deliver(std::vector<token_id>{1, 2, 3});
  bool extra = false;
  self->receive([&](delta_atom, delta_ptr&) { extra = true; }, [&](final_atom, final_ptr&) { extra = true; },
                caf::after(200ms) >> [] {});
  EXPECT_FALSE(extra);
  runtime_status status;
  self->request(engine, 5s, status_atom_v).receive([&](runtime_status& s) { status = s; }, [](caf::error&) {});
  EXPECT_EQ(status.num_tickets, 0);
  EXPECT_EQ(status.num_waiting + status.num_running, 0);
  EXPECT_EQ(shared->num_open.load(), 0);
  EXPECT_EQ(shared->num_queued.load(), 0);
}

TEST_F(engine_actor_fixture, an_abort_of_a_queued_request_ends_it_before_it_is_ever_scheduled) {
  auto held = std::make_shared<testing::held_executor>(64, 0);
  engine_options eo;
  eo.max_num_seqs = 1;  // the second request waits behind the first
  start_with(held, eo);
  held->hold_when([](const step_batch&) { return true; });
  caf::scoped_actor self{sys}, first{sys}, second{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{1}, prompt_input::from_ids({1, 2, 3}), 6), caf::actor(first));
  ASSERT_TRUE(held->wait_held(10s));
  self->send(engine, submit_atom_v, make_submit(ticket_id{2}, prompt_input::from_ids({4, 5, 6}), 6),
             caf::actor(second));
  self->send(engine, abort_atom_v, ticket_id{2});
  held->release();
  auto [tokens2, final2] = collect(second, ticket_id{2});
  EXPECT_TRUE(tokens2.empty());
  EXPECT_EQ(final2.reason, finish_reason::abort);
  EXPECT_EQ(stages_of(final2), (std::vector<lifecycle_stage>{lifecycle_stage::queued, lifecycle_stage::aborted}));
  auto [tokens1, final1] = collect(first, ticket_id{1});
  EXPECT_EQ(final1.reason, finish_reason::length);
  EXPECT_EQ(tokens1, greedy_oracle({1, 2, 3}, 6));
  EXPECT_EQ(shared->num_queued.load(), 0);
  EXPECT_TRUE(held->sim().errors().empty());
}

TEST_F(engine_actor_fixture, an_abort_during_a_chunked_prefill_ends_it_before_its_first_token) {
  auto held = std::make_shared<testing::held_executor>(64, 0);
  engine_options eo;
  eo.max_num_batched_tokens = 16;  // a 100-token prompt takes 7 prefill steps
  start_with(held, eo);
  held->hold_when([n = 0](const step_batch&) mutable { return ++n == 2; });
  std::vector<token_id> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back(1 + i % (test_vocab - 1));
  caf::scoped_actor self{sys};
  self->send(engine, submit_atom_v, make_submit(ticket_id{1}, prompt_input::from_ids(prompt), 6), caf::actor(self));
  ASSERT_TRUE(held->wait_held(10s));
  self->send(engine, abort_atom_v, ticket_id{1});
  held->release();
  auto [tokens, final] = collect(self, ticket_id{1});
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(final.reason, finish_reason::abort);
  EXPECT_EQ(stages_of(final), (std::vector<lifecycle_stage>{lifecycle_stage::queued, lifecycle_stage::scheduled,
                                                            lifecycle_stage::aborted}));
  EXPECT_EQ(held->sim().num_steps(), 2) << "no prefill step ran after the abort";
  usage_report usage;
  for (int i = 0; i < 100; ++i) {
    self->request(kv, 5s, query_atom_v, usage_atom_v).receive([&](usage_report& u) { usage = u; }, [](caf::error&) {});
    if (usage.device.num_used == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(usage.device.num_used, 0) << "the partly prefilled blocks are free";
}

TEST_F(engine_actor_fixture, an_abort_of_a_swapped_out_request_frees_its_host_blocks) {
  // 6 device blocks of 16 tokens: two requests growing to 60 tokens each cannot both stay; the
  // preempted one is swapped to the 16 host blocks.
  auto held = std::make_shared<testing::held_executor>(6, 16);
  engine_options eo;
  eo.preemption = preemption_mode::swap;
  eo.watermark = 0;
  eo.enable_prefix_caching = false;
  start_with(held, eo);
  held->hold_when([](const step_batch& b) { return !b.swap_out.empty(); });
  caf::scoped_actor self{sys}, a{sys}, b{sys};
  const std::vector<token_id> prompt_a = {1, 2, 3, 4, 5, 6, 7, 8}, prompt_b = {9, 10, 11, 12, 13, 14, 15, 16};
  self->send(engine, submit_atom_v, make_submit(ticket_id{1}, prompt_input::from_ids(prompt_a), 52), caf::actor(a));
  self->send(engine, submit_atom_v, make_submit(ticket_id{2}, prompt_input::from_ids(prompt_b), 52), caf::actor(b));
  ASSERT_TRUE(held->wait_held(20s)) << "no swap-out happened";
  // The held step swaps one request out and runs the other; the running one is recognised by the
  // prompt its sequence was first scheduled with.
  const std::vector<seq_id> running = held->held_seqs();
  ASSERT_EQ(running.size(), 1u);
  const bool a_runs = held->first_tokens().at(running[0]) == prompt_a;
  caf::scoped_actor& kept = a_runs ? a : b;
  caf::scoped_actor& swapped = a_runs ? b : a;
  const ticket_id kept_ticket{a_runs ? 1u : 2u}, swapped_ticket{a_runs ? 2u : 1u};
  self->send(engine, abort_atom_v, swapped_ticket);
  held->release();
  auto [swapped_tokens, swapped_final] = collect(swapped, swapped_ticket);
  EXPECT_EQ(swapped_final.reason, finish_reason::abort);
  const auto s = stages_of(swapped_final);
  ASSERT_GE(s.size(), 2u);
  EXPECT_EQ(s[s.size() - 2], lifecycle_stage::swapped_out) << "aborted while swapped out";
  EXPECT_EQ(s.back(), lifecycle_stage::aborted);
  auto [kept_tokens, kept_final] = collect(kept, kept_ticket);
  EXPECT_EQ(kept_final.reason, finish_reason::length);
  EXPECT_EQ(kept_tokens, greedy_oracle(a_runs ? prompt_a : prompt_b, 52)) << "the other request is unaffected";
  usage_report usage;
  for (int i = 0; i < 100; ++i) {
    self->request(kv, 5s, query_atom_v, usage_atom_v).receive([&](usage_report& u) { usage = u; }, [](caf::error&) {});
    if (usage.device.num_used == 0 && usage.host.num_used == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(usage.device.num_used, 0);
  EXPECT_EQ(usage.host.num_used, 0) << "the swapped request's host blocks are free";
  EXPECT_TRUE(held->sim().errors().empty());
}

}  // namespace
}  // namespace tessera::actors
