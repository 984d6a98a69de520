#include "actors/engine_facade.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "actors/runtime_actors.hpp"
#include "engine/base/error.hpp"

namespace tessera::actors {

std::string_view to_string(submit_error e) {
  switch (e) {
    case submit_error::none: return "none";
    case submit_error::overloaded: return "overloaded";
    case submit_error::unhealthy: return "unhealthy";
    case submit_error::shutting_down: return "shutting_down";
    case submit_error::invalid: return "invalid";
  }
  return "unknown";
}

// ---- streams ------------------------------------------------------------------------------------

// Holds only weak references (actor_addr): a handle kept by the caller must not keep actors alive.
struct stream_handle::guard {
  std::shared_ptr<stream_buffer> buffer;
  caf::actor_addr sink;
  caf::actor_addr engine;
  ticket_id ticket;

  void send_abort() const {
    if (auto e = caf::actor_cast<caf::actor>(engine)) caf::anon_send(e, abort_atom_v, ticket);
  }

  ~guard() {
    // The consumer is gone: abort the request (the sink going down tells the engine actor as well).
    if (!buffer->final_arrived()) {
      send_abort();
      caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    }
  }
};

std::optional<stream_item> stream_handle::next(std::chrono::milliseconds timeout) {
  if (!buffer_) return std::nullopt;
  return buffer_->next(timeout);
}

std::vector<stream_item> stream_handle::take_all() {
  if (!buffer_) return {};
  return buffer_->take_all();
}

void stream_handle::on_ready(std::function<void()> hook) {
  if (buffer_) buffer_->on_ready(std::move(hook));
}

stream_final stream_handle::wait(std::vector<stream_delta>* deltas) {
  while (auto item = next()) {
    if (auto* f = std::get_if<stream_final>(&*item)) return std::move(*f);
    if (deltas) deltas->push_back(std::move(std::get<stream_delta>(*item)));
  }
  stream_final f;
  f.ticket = id_;
  f.reason = finish_reason::error;
  f.error = "stream already consumed";
  return f;
}

void stream_handle::abort() {
  if (guard_) guard_->send_abort();
}

namespace {

// The fault injection switch (actors/fault_injection.hpp, docs/security.md "Fault injection"): a
// malformed value stops the start (invalid_request) instead of running without the faults a test
// asked for, and an enabled plan is announced on stderr, so nobody mistakes such a server for a
// normal one.
void apply_fault_injection_env(facade_components& c) {
  const char* env = std::getenv("TESSERA_FAULT_INJECTION");
  if (!env || !*env) return;
  const fault_plan plan = parse_fault_plan(env);
  std::fprintf(stderr, "tessera: WARNING: fault injection enabled by TESSERA_FAULT_INJECTION=%s: %s\n", env,
               plan.describe().c_str());
  if (plan.faults_executor()) c.exec = std::make_unique<fault_injecting_executor>(std::move(c.exec), plan);
  if (plan.tokenizer_exit_rate > 0 && !c.tokenizer_exit_when) c.tokenizer_exit_when = make_tokenizer_fault(plan);
}

int default_caf_threads() {
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::min(n, 4u));
}

}  // namespace

// ---- the facade ---------------------------------------------------------------------------------

struct facade_internals {
  explicit facade_internals(int num_threads) {
    cfg.set("scheduler.max-threads", num_threads);
    // CAF's idle workers poll their queues (100 busy attempts, then 500 more 50 us apart) before they
    // sleep on a condition variable that enqueue notifies. Between two engine steps the workers go
    // idle every time, and that polling takes CPU from the compute threads (measured ~10% CPU per
    // token on 2 cores); a few attempts keep the hand-off latency low and cost almost nothing.
    cfg.set("work-stealing.aggressive-poll-attempts", size_t{4});
    cfg.set("work-stealing.moderate-poll-attempts", size_t{4});
    add_message_types(cfg);
  }
  caf::actor_system_config cfg;
  std::optional<caf::actor_system> sys;  // after cfg: constructed and destroyed in order
  std::vector<caf::actor> tokenizers;
  caf::actor executor_actor;
  caf::actor kv_manager;
  caf::actor event_bus;
  caf::actor engine;
  std::mutex sinks_mutex;
  std::vector<caf::actor> event_sinks;
  std::atomic<uint64_t> next_ticket{1};     // ticket_id values, handed out in order
  std::atomic<uint64_t> next_tokenizer{0};  // tokenize_async: round robin over the pool
  std::atomic<bool> accepting{true};
  std::atomic<uint64_t> num_submitted{0};
  std::atomic<uint64_t> num_rejected{0};
  std::mutex shutdown_mutex;
  bool stopped = false;

  void stop_actors() {
    for (auto& a : tokenizers) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (caf::actor* a : {&executor_actor, &kv_manager, &event_bus, &engine})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    std::lock_guard lock(sinks_mutex);
    for (auto& s : event_sinks) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  }

  // A detached actor's thread ends only once its last strong reference is gone, and the actor
  // system's destructor joins those threads: drop every handle before destroying it.
  void release_handles() {
    tokenizers.clear();
    executor_actor = nullptr;
    kv_manager = nullptr;
    event_bus = nullptr;
    engine = nullptr;
    std::lock_guard lock(sinks_mutex);
    event_sinks.clear();
  }
};

engine_facade::engine_facade(facade_components components, facade_options options)
    : shared_(std::make_shared<runtime_shared>()), tok_(components.tok), options_(options) {
  if (!components.exec) throw invalid_request("engine_facade: no executor");
  apply_fault_injection_env(components);
  config_ = components.exec->config();
  kv_cache_dtype_ = components.exec->kv_cache_dtype();
  kv_block_bytes_ = components.exec->kv_block_bytes();
  in_ =
      std::make_unique<facade_internals>(options.num_caf_threads > 0 ? options.num_caf_threads : default_caf_threads());
  in_->sys.emplace(in_->cfg);
  caf::actor_system& sys = *in_->sys;
  try {
    auto encoder = std::make_shared<const prompt_encoder>(components.tok, std::move(components.chat));
    int num_tok = options.num_tokenizer_actors;
    if (num_tok <= 0) num_tok = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
    if (components.tok)
      for (int i = 0; i < num_tok; ++i)
        in_->tokenizers.push_back(spawn_tokenizer_actor(sys, encoder, components.tokenizer_exit_when));
    std::shared_ptr<executor> exec(std::move(components.exec));
    in_->executor_actor = spawn_executor_actor(sys, exec);
    in_->kv_manager = spawn_kv_manager_actor(sys);
    in_->event_bus = spawn_event_bus(sys);
    engine_actor_config sc;
    sc.executor_actor = in_->executor_actor;
    sc.executor_metadata = exec;
    sc.tok = components.tok;
    sc.engine = options.engine;
    sc.tokenizers = in_->tokenizers;
    if (components.tok) {
      sc.tokenizer_encoder = encoder;
      sc.tokenizer_exit_when = components.tokenizer_exit_when;
    }
    sc.kv_manager = in_->kv_manager;
    sc.event_bus = in_->event_bus;
    sc.shared = shared_;
    sc.kv_snapshot_interval_seconds = options.kv_snapshot_interval_seconds;
    in_->engine = spawn_engine_actor(sys, std::move(sc));
  } catch (...) {
    in_->stop_actors();
    in_->release_handles();
    in_.reset();
    throw;
  }
  if (options.warm_up) {
    // One 1-token request: faults in the weights and sizes the executor's buffers before traffic.
    sampling_params p;
    p.temperature = 0;
    p.max_tokens = 1;
    p.ignore_eos = true;
    const token_id first = tok_ && tok_->bos() ? *tok_->bos() : 0;
    submit_result r = submit(prompt_input::from_ids({first}), p);
    if (r) r.stream.wait();
  }
}

engine_facade::~engine_facade() {
  if (!in_) return;
  shutdown();
  in_->sys.reset();  // waits for every actor to finish, clients' sinks included
}

submit_result engine_facade::submit(prompt_input prompt, const sampling_params& params, int32_t priority) {
  std::string invalid;
  try {
    params.validate(config_.vocab_size, options_.engine.limits);
  } catch (const std::exception& e) { invalid = e.what(); }
  if (invalid.empty() && params.structured && !options_.engine.constraints) {
    invalid = "'" + params.structured->field + "': structured output is not available in this build";
  }
  return send_submit(std::move(prompt), params, priority, pooling_type::none, std::move(invalid));
}

submit_result engine_facade::submit_embedding(prompt_input prompt, pooling_type pooling, int32_t priority) {
  sampling_params params;  // unused by an embedding
  params.max_tokens = 1;
  return send_submit(std::move(prompt), params, priority, pooling, {});
}

// The refusals in their order: shutting down, unhealthy, the request's own fault (`invalid`, found by
// the caller), overload.
submit_result engine_facade::send_submit(prompt_input prompt, const sampling_params& params, int32_t priority,
                                         pooling_type pooling, std::string invalid) {
  submit_result result;
  auto reject = [&](submit_error e, std::string message) {
    in_->num_rejected.fetch_add(1);
    result.error = e;
    result.message = std::move(message);
    return result;
  };
  if (!in_->accepting.load()) return reject(submit_error::shutting_down, "the engine is shutting down");
  if (!shared_->healthy.load()) return reject(submit_error::unhealthy, "the engine is unhealthy: " + health().message);
  if (!invalid.empty()) return reject(submit_error::invalid, std::move(invalid));
  if (shared_->num_queued.fetch_add(1) >= options_.max_waiting) {
    shared_->num_queued.fetch_sub(1);
    return reject(submit_error::overloaded,
                  "overloaded: " + std::to_string(options_.max_waiting) + " requests are already waiting; retry later");
  }
  shared_->num_open.fetch_add(1);
  in_->num_submitted.fetch_add(1);

  auto request = std::make_shared<submit_request>();
  request->ticket = ticket_id(in_->next_ticket.fetch_add(1));
  request->prompt = std::move(prompt);
  request->params = params;
  request->priority = priority;
  request->pooling = pooling;
  request->submitted_at = runtime_clock::now();

  auto buffer = std::make_shared<stream_buffer>(static_cast<size_t>(options_.max_buffered_deltas));
  caf::actor sink = spawn_stream_sink(*in_->sys, buffer, in_->engine.address(), request->ticket);
  auto g = std::make_shared<stream_handle::guard>();
  g->buffer = buffer;
  g->sink = sink.address();
  g->engine = in_->engine.address();
  g->ticket = request->ticket;
  result.stream.id_ = request->ticket;
  result.stream.buffer_ = std::move(buffer);
  result.stream.guard_ = std::move(g);
  caf::anon_send(in_->engine, submit_atom_v, submit_ptr(std::move(request)), sink);
  return result;
}

void engine_facade::abort(ticket_id id) {
  if (in_->engine) caf::anon_send(in_->engine, abort_atom_v, id);
}

void engine_facade::tokenize_async(prompt_input prompt, std::function<void(tokenize_result)> done) {
  auto refuse = [&](std::string message) {
    tokenize_result r;
    r.error = std::move(message);
    r.refused = true;
    done(std::move(r));
  };
  if (!in_->accepting.load()) return refuse("the engine is shutting down");
  if (in_->tokenizers.empty()) return refuse("this model has no tokenizer");
  const caf::actor tok = in_->tokenizers[in_->next_tokenizer.fetch_add(1) % in_->tokenizers.size()];
  auto input = std::make_shared<const prompt_input>(std::move(prompt));
  // A short-lived actor makes the request, so the answer comes back as a message (no thread waits).
  // tok and input travel as spawn arguments, not captures: CAF 0.17 spawns an argument-less function
  // actor by binding a reference through a null shared_ptr<tuple<>> (init_fun_factory), which UBSan
  // reports in the sanitizer stage of scripts/test.
  in_->sys->spawn(
      [done = std::move(done)](caf::event_based_actor* self, caf::actor tokenizer,
                               std::shared_ptr<const prompt_input> shared_prompt) {
        self->request(tokenizer, caf::infinite, encode_atom_v, shared_prompt)
            .then(
                [self, done](std::vector<token_id>& ids) {
                  tokenize_result r;
                  r.ids = std::move(ids);
                  done(std::move(r));
                  self->quit();
                },
                [self, done](caf::error& err) {
                  tokenize_result r;
                  // The tokenizer's own message (see tokenizer_actor.cpp) rather than CAF's rendering.
                  const caf::message& context = err.context();
                  r.error = context.match_elements<std::string>() ? context.get_as<std::string>(0)
                                                                  : self->system().render(err);
                  done(std::move(r));
                  self->quit();
                });
      },
      tok, input);
}

int32_t engine_facade::max_model_len() const {
  return options_.engine.max_model_len > 0 ? options_.engine.max_model_len : config_.context_length;
}

void engine_facade::subscribe_events(std::function<void(const event_batch&)> callback, double max_rate_hz) {
  if (!in_->accepting.load()) return;  // shutting down
  caf::actor sink = spawn_event_callback_sink(*in_->sys, std::move(callback));
  {
    std::lock_guard lock(in_->sinks_mutex);
    in_->event_sinks.push_back(sink);
  }
  caf::anon_send(in_->event_bus, subscribe_atom_v, sink, max_rate_hz);
}

facade_stats engine_facade::stats() const {
  facade_stats s;
  {
    std::lock_guard lock(shared_->mutex);
    s.engine = shared_->stats;
    s.device = shared_->device;
    s.host = shared_->host;
    s.num_waiting = shared_->num_waiting;
    s.num_running = shared_->num_running;
    s.num_swapped = shared_->num_swapped;
    s.num_completed = shared_->num_completed;
    s.num_aborted = shared_->num_aborted;
    s.num_failed = shared_->num_failed;
    s.num_tokenizer_restarts = shared_->num_tokenizer_restarts;
  }
  s.num_queued = shared_->num_queued.load();
  s.num_open = shared_->num_open.load();
  s.num_submitted = in_->num_submitted.load();
  s.num_rejected = in_->num_rejected.load();
  return s;
}

health_report engine_facade::health() const {
  health_report h;
  h.healthy = shared_->healthy.load();
  std::lock_guard lock(shared_->mutex);
  h.message = shared_->health_message;
  if (h.healthy && !in_->accepting.load()) h.message = "shutting down";
  return h;
}

occupancy_ptr engine_facade::kv_occupancy_snapshot() const {
  occupancy_ptr result;
  if (!in_->kv_manager) return result;
  caf::scoped_actor self{*in_->sys};
  self->request(in_->kv_manager, std::chrono::seconds(1), query_atom_v)
      .receive([&](occupancy_ptr& o) { result = std::move(o); }, [](caf::error&) {});
  return result;
}

void engine_facade::shutdown() { shutdown(options_.shutdown_timeout); }

void engine_facade::shutdown(std::chrono::milliseconds timeout) {
  std::lock_guard shutdown_lock(in_->shutdown_mutex);
  if (in_->stopped) return;
  in_->accepting.store(false);
  auto all_closed = [&] { return shared_->num_open.load() == 0; };
  {
    std::unique_lock lock(shared_->mutex);
    shared_->changed.wait_for(lock, timeout, all_closed);
  }
  if (!all_closed()) {
    caf::anon_send(in_->engine, abort_all_atom_v);
    // Aborts take effect at the next step; a step is bounded, so this does not wait long.
    std::unique_lock lock(shared_->mutex);
    shared_->changed.wait_for(lock, std::chrono::seconds(10), all_closed);
  }
  {
    // stop: the engine actor closes whatever is still open (final: abort, "engine shut down") and quits.
    caf::scoped_actor self{*in_->sys};
    self->monitor(in_->engine);
    self->send(in_->engine, stop_atom_v);
    self->receive([](const caf::down_msg&) {});
  }
  in_->stop_actors();
  in_->release_handles();
  in_->stopped = true;
  // The actor system itself lives until the destructor: clients may still hold event subscriptions and
  // streams (a server writing the finals produced above), and destroying the system waits for them.
}

}  // namespace tessera::actors
