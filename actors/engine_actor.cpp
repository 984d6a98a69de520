// The engine actor: owns the llm_engine (which owns the scheduler, the KV block manager, sampling and
// detokenization) and drives its step loop on its own (detached) thread.
//
// Step loop: after every message that can create work (a submit whose prompt is ready, an abort) the
// actor sends itself one step_atom; each step_atom runs llm_engine::step() once and, while requests
// remain, queues the next step_atom behind whatever arrived meanwhile. So submits and aborts are
// handled between two steps (an abort takes effect at the next step at the latest), and the block
// manager is only ever mutated synchronously inside step(), on this one thread.
#include <caf/all.hpp>

#include <algorithm>
#include <exception>
#include <optional>
#include <unordered_map>

#include "actors/prompt_truncation.hpp"
#include "actors/runtime_actors.hpp"
#include "engine/base/error.hpp"

namespace tessera::actors {

namespace {

double seconds_between(runtime_clock::time_point a, runtime_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class engine_actor : public caf::event_based_actor {
 public:
  engine_actor(caf::actor_config& cfg, engine_actor_config config)
      : caf::event_based_actor(cfg), config_(std::move(config)), shared_(config_.shared) {
    proxy_ = std::make_unique<actor_executor>(system(), config_.executor_actor, *config_.executor_metadata);
    engine_ = std::make_unique<llm_engine>(*proxy_, config_.tok, config_.engine);
  }

  const char* name() const override { return "engine"; }

  caf::behavior make_behavior() override {
    monitor(config_.executor_actor);
    for (const caf::actor& tok : config_.tokenizers) monitor(tok);
    set_down_handler([this](const caf::down_msg& down) {
      if (down.source == config_.executor_actor.address()) {
        fatal("executor actor down: " + system().render(down.reason));
        return;
      }
      if (on_tokenizer_down(down)) return;
      // A subscriber went away: its requests are aborted.
      auto range = by_subscriber_.equal_range(down.source);
      std::vector<ticket_id> tickets;
      for (auto it = range.first; it != range.second; ++it) tickets.push_back(it->second);
      for (ticket_id t : tickets) abort_ticket(t);
    });
    set_exception_handler([this](std::exception_ptr& eptr) -> caf::error {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(eptr);
      } catch (const std::exception& e) { what = e.what(); } catch (...) {
      }
      fatal("scheduler failed: " + what);
      return caf::none;  // keep running (unhealthy): pending callers still get their finals
    });
    return {
        [this](submit_atom, const submit_ptr& req, const caf::actor& subscriber) { on_submit(req, subscriber); },
        [this](abort_atom, ticket_id ticket) { abort_ticket(ticket); },
        [this](compiled_atom, ticket_id ticket, const compiled_ptr& result) { on_compiled(ticket, result); },
        [this](abort_all_atom) {
          std::vector<ticket_id> all;
          for (const auto& [t, s] : tickets_) all.push_back(t);
          for (ticket_id t : all) abort_ticket(t);
        },
        [this](step_atom) { on_step(); },
        [this](status_atom) -> runtime_status {
          runtime_status s;
          s.healthy = shared_->healthy.load();
          {
            std::lock_guard lock(shared_->mutex);
            s.message = shared_->health_message;
          }
          s.num_tickets = static_cast<int32_t>(tickets_.size());
          if (engine_) {
            const step_record& r = engine_->last_record();
            s.num_waiting = r.num_waiting;
            s.num_running = r.num_running;
            s.num_steps = r.step;
          }
          return s;
        },
        [this](stop_atom) {
          std::vector<ticket_id> all;
          for (const auto& [t, s] : tickets_) all.push_back(t);
          for (ticket_id t : all) close_ticket(t, finish_reason::abort, "engine shut down");
          engine_.reset();
          quit();
        },
    };
  }

  void on_exit() override {
    // Whatever ends this actor, no stream is left without its final message.
    std::vector<ticket_id> all;
    for (const auto& [t, s] : tickets_) all.push_back(t);
    for (ticket_id t : all) close_ticket(t, finish_reason::error, "scheduler stopped", true);
    engine_.reset();
    proxy_.reset();
    // Strong references to other actors keep their (detached) threads alive: let go of them now.
    config_.executor_actor = nullptr;
    // Replacement tokenizer actors (on_tokenizer_down) are this actor's own: end them with it. The
    // facade ends the ones it spawned itself; a second exit message to those is harmless.
    for (const caf::actor& tok : config_.tokenizers) caf::anon_send_exit(tok, caf::exit_reason::user_shutdown);
    config_.tokenizers.clear();
    config_.kv_manager = nullptr;
    config_.event_bus = nullptr;
  }

 private:
  struct ticket_state {
    submit_ptr request;
    caf::actor subscriber;
    request_id engine_request;  // 0 while the prompt is being tokenized
    bool queued = true;         // counted in shared_->num_queued
    // Structured output: the prompt's ids and the compiled grammar are made concurrently (tokenizer
    // actor, grammar compile worker); the request enters the engine when both are there.
    std::optional<std::vector<token_id>> ids;
    std::shared_ptr<const compiled_constraint> grammar;
    bool grammar_pending = false;
    runtime_clock::time_point first_token{};
    bool has_first_token = false;
    std::vector<choice_result> finished;
    int32_t num_prompt_tokens = 0;
    int32_t num_cached_prompt_tokens = 0;
    // While the prompt is being tokenized: the tokenizer actor asked, and which attempt this is
    // (an answer or error of an earlier attempt, from an actor that died, is ignored).
    caf::actor_addr encoding_on;
    int32_t encode_attempt = 0;
    uint64_t encode_order = 0;      // when it was sent: the actor answers in this order
    int32_t num_encode_deaths = 0;  // tokenizer actors that died encoding this very prompt
  };

  // A tokenizer actor that dies while encoding a prompt is replaced and the prompt tried again; one
  // that kills this many fails with an error (a prompt that crashes every tokenizer must not loop).
  static constexpr int32_t k_max_encode_deaths = 2;

  void on_submit(const submit_ptr& req, const caf::actor& subscriber) {
    const ticket_id ticket = req->ticket;
    ticket_state& t = tickets_[ticket];
    t.request = req;
    t.subscriber = subscriber;
    if (subscriber) {
      monitor(subscriber);
      by_subscriber_.emplace(subscriber.address(), ticket);
    }
    if (!engine_) {
      close_ticket(ticket, finish_reason::error, health_message(), true);
      return;
    }
    if (req->params.structured) {
      if (!config_.engine.constraints) {
        close_ticket(ticket, finish_reason::error,
                     "'" + req->params.structured->field + "': structured output is not available in this build", false,
                     req->params.structured->field);
        return;
      }
      t.grammar_pending = true;
      // The compile runs on the backend's workers (or answers at once from its cache); its result comes
      // back as a message, so this thread keeps stepping meanwhile.
      config_.engine.constraints->compile_async(*req->params.structured, [addr = address(), ticket](compile_result r) {
        // A weak address: a compile still running must not keep a stopped engine actor alive.
        if (auto self = caf::actor_cast<caf::actor>(addr)) {
          caf::anon_send(self, compiled_atom_v, ticket,
                         compiled_ptr(std::make_shared<const compile_result>(std::move(r))));
        }
      });
    }
    if (req->prompt.type == prompt_input::kind::token_ids) {
      add_to_engine(ticket, req->prompt.ids);
      return;
    }
    if (config_.tokenizers.empty()) {
      close_ticket(ticket, finish_reason::error, "this engine has no tokenizer: send token ids");
      return;
    }
    start_encoding(ticket);
  }

  // Sends the ticket's prompt to the next tokenizer actor (round robin).
  void start_encoding(ticket_id ticket) {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    ticket_state& t = it->second;
    if (config_.tokenizers.empty()) {
      close_ticket(ticket, finish_reason::error, "tokenization failed: no tokenizer actor is left", true);
      return;
    }
    const caf::actor& tok = config_.tokenizers[next_tokenizer_++ % config_.tokenizers.size()];
    const int32_t attempt = ++t.encode_attempt;
    t.encoding_on = tok.address();
    t.encode_order = ++num_encodes_sent_;
    // Aliasing constructor: the prompt lives inside the (immutable) submit_request.
    prompt_ptr prompt(t.request, &t.request->prompt);
    request(tok, caf::infinite, encode_atom_v, prompt)
        .then(
            [this, ticket, attempt](std::vector<token_id>& ids) {
              if (!current_attempt(ticket, attempt)) return;
              tickets_.at(ticket).encoding_on = caf::actor_addr();
              add_to_engine(ticket, std::move(ids));
            },
            [this, ticket, attempt](caf::error& err) {
              if (!current_attempt(ticket, attempt)) return;
              // Bounced: the actor died before (or while) encoding this prompt. Its down message may
              // still be on its way; whichever comes first handles the death.
              if (err == caf::sec::request_receiver_down)
                return tokenizer_died(tickets_.at(ticket).encoding_on, system().render(err));
              tickets_.at(ticket).encoding_on = caf::actor_addr();
              close_ticket(ticket, finish_reason::error, "tokenization failed: " + system().render(err));
            });
  }

  bool current_attempt(ticket_id ticket, int32_t attempt) const {
    auto it = tickets_.find(ticket);
    return it != tickets_.end() && it->second.encode_attempt == attempt && !it->second.engine_request;
  }

  // The tokenizer actor `dead` is gone (a crash; fault injection makes one), learnt from its down
  // message or from a request it bounced, whichever came first. It is replaced by a fresh actor
  // (unless the runtime is shutting down), so the pool keeps its size, and every prompt it still
  // held is sent again. An actor answers in the order it was asked, so the oldest of those is the
  // one it was encoding when it died: that prompt is blamed, and one that kills
  // k_max_encode_deaths actors fails instead of killing them forever; the others were only queued.
  void tokenizer_died(const caf::actor_addr& dead, const std::string& why) {
    auto pos = std::find_if(config_.tokenizers.begin(), config_.tokenizers.end(),
                            [&](const caf::actor& a) { return a.address() == dead; });
    if (pos != config_.tokenizers.end()) {
      if (config_.tokenizer_encoder && !shutting_down_) {
        *pos = spawn_tokenizer_actor(system(), config_.tokenizer_encoder, config_.tokenizer_exit_when);
        monitor(*pos);
        std::lock_guard lock(shared_->mutex);
        ++shared_->num_tokenizer_restarts;
      } else {
        config_.tokenizers.erase(pos);
      }
    }
    std::vector<std::pair<uint64_t, ticket_id>> held;
    for (const auto& [id, t] : tickets_)
      if (t.encoding_on == dead) held.emplace_back(t.encode_order, id);
    std::sort(held.begin(), held.end());
    for (size_t i = 0; i < held.size(); ++i) {
      ticket_state& t = tickets_.at(held[i].second);
      t.encoding_on = caf::actor_addr();
      if (i == 0 && ++t.num_encode_deaths >= k_max_encode_deaths) {
        close_ticket(held[i].second, finish_reason::error,
                     "tokenization failed: the tokenizer actor died while encoding this prompt (" +
                         std::to_string(k_max_encode_deaths) + " times): " + why,
                     true);
        continue;
      }
      start_encoding(held[i].second);
    }
  }

  // False: `down` is not about a tokenizer actor (or about one already replaced).
  bool on_tokenizer_down(const caf::down_msg& down) {
    const bool in_pool = std::any_of(config_.tokenizers.begin(), config_.tokenizers.end(),
                                     [&](const caf::actor& a) { return a.address() == down.source; });
    if (!in_pool) return false;
    if (down.reason == caf::exit_reason::user_shutdown) shutting_down_ = true;
    tokenizer_died(down.source, system().render(down.reason));
    return true;
  }

  void on_compiled(ticket_id ticket, const compiled_ptr& result) {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;  // aborted meanwhile: its final is already sent
    ticket_state& t = it->second;
    if (!result->compiled) {
      close_ticket(ticket, finish_reason::error, result->error, false, t.request->params.structured->field);
      return;
    }
    t.grammar = result->compiled;
    t.grammar_pending = false;
    if (t.ids) add_to_engine(ticket, std::move(*t.ids));
  }

  void add_to_engine(ticket_id ticket, std::vector<token_id> ids) {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;  // aborted while tokenizing: its final is already sent
    if (!engine_) {
      close_ticket(ticket, finish_reason::error, health_message(), true);
      return;
    }
    ticket_state& t = it->second;
    if (t.grammar_pending) {  // the grammar is still compiling: on_compiled adds the request
      t.ids = std::move(ids);
      return;
    }
    try {
      truncate_prompt(ids, t.request->prompt.truncate_prompt_tokens, engine_->get_scheduler().options().max_model_len,
                      t.request->params);
      t.engine_request = t.request->pooling != pooling_type::none
                             ? engine_->add_embedding_request(std::move(ids), t.request->pooling, t.request->priority)
                             : engine_->add_request(std::move(ids), t.request->params, t.request->priority, t.grammar);
    } catch (const invalid_request& e) {
      close_ticket(ticket, finish_reason::error, e.what(), false, e.param());
      return;
    } catch (const std::exception& e) {
      close_ticket(ticket, finish_reason::error, e.what());
      return;
    }
    by_request_[t.engine_request] = ticket;
    schedule_step();
  }

  void abort_ticket(ticket_id ticket) {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    if (!it->second.engine_request || !engine_) {
      close_ticket(ticket, finish_reason::abort, "");
      return;
    }
    // The engine reports the abort (one finished output per open choice) with the next step.
    engine_->abort(it->second.engine_request);
    schedule_step();
  }

  void schedule_step() {
    if (step_pending_) return;
    step_pending_ = true;
    send(this, step_atom_v);
  }

  void on_step() {
    step_pending_ = false;
    // Runs even when no request is left: aborted requests' final outputs come out of this step.
    if (!engine_) return;
    std::vector<request_output> outputs = engine_->step();
    const auto now = runtime_clock::now();
    // An executor failure makes the runtime unhealthy before any client sees its error final.
    if (proxy_->failed()) mark_unhealthy(proxy_->failure());
    // Publish first: a client that sees its final message also sees this step's counters.
    publish();
    for (request_output& out : outputs) route(std::move(out), now);
    if (proxy_->failed()) {
      fatal(proxy_->failure());
      return;
    }
    if (engine_->has_unfinished()) schedule_step();
  }

  void route(request_output out, runtime_clock::time_point now) {
    auto r = by_request_.find(out.id);
    if (r == by_request_.end()) return;
    const ticket_id ticket = r->second;
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    ticket_state& t = it->second;
    if (!out.token_ids.empty() && !t.has_first_token) {
      t.has_first_token = true;
      t.first_token = now;
    }
    t.num_prompt_tokens = out.num_prompt_tokens;
    t.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
    if (out.finished) {
      choice_result c;
      c.index = out.index;
      c.reason = out.reason;
      c.error = out.error;
      c.num_generated_tokens = out.num_generated_tokens;
      c.num_draft_tokens = out.num_draft_tokens;
      c.num_accepted_draft_tokens = out.num_accepted_draft_tokens;
      c.timeline = out.timeline;
      c.embedding = std::move(out.embedding);  // the final carries it; the delta need not
      t.finished.push_back(std::move(c));
    }
    auto delta = std::make_shared<stream_delta>();
    delta->ticket = ticket;
    delta->seconds_since_submit = seconds_between(t.request->submitted_at, now);
    delta->output = std::move(out);
    send(t.subscriber, delta_atom_v, delta_ptr(std::move(delta)));
    if (static_cast<int32_t>(t.finished.size()) >= t.request->params.n) close_ticket(ticket, finish_reason::none, "");
  }

  // Sends the one final message of `ticket` and forgets it. reason none: derived from the choices.
  // runtime_fault: the error is the runtime's (stream_final::runtime_fault), not the request's.
  // error_param: the request field that caused a refusal (stream_final::error_param).
  void close_ticket(ticket_id ticket, finish_reason reason, const std::string& error, bool runtime_fault = false,
                    const std::string& error_param = "") {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    ticket_state& t = it->second;
    auto final = std::make_shared<stream_final>();
    final->ticket = ticket;
    final->error_param = error_param;
    final->request = t.engine_request;
    std::sort(t.finished.begin(), t.finished.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
    final->choices = std::move(t.finished);
    final->num_prompt_tokens = t.num_prompt_tokens;
    final->num_cached_prompt_tokens = t.num_cached_prompt_tokens;
    for (const auto& c : final->choices) {
      final->num_generated_tokens += c.num_generated_tokens;
      final->num_draft_tokens += c.num_draft_tokens;
      final->num_accepted_draft_tokens += c.num_accepted_draft_tokens;
    }
    if (reason == finish_reason::none) {
      reason = final->choices.empty() ? finish_reason::abort : final->choices.front().reason;
      for (const auto& c : final->choices) {
        if (c.reason == finish_reason::abort && reason != finish_reason::error) reason = finish_reason::abort;
        if (c.reason == finish_reason::error) {
          reason = finish_reason::error;
          if (final->error.empty()) final->error = c.error;
        }
      }
    } else {
      final->error = error;
    }
    final->reason = reason;
    final->runtime_fault = reason == finish_reason::error && (runtime_fault || final->request);
    const auto now = runtime_clock::now();
    final->seconds_total = seconds_between(t.request->submitted_at, now);
    if (t.has_first_token) final->seconds_to_first_token = seconds_between(t.request->submitted_at, t.first_token);
    // If the engine still holds the request (closed by stop/fatal), make it forget it.
    if (t.engine_request) {
      if (engine_) engine_->abort(t.engine_request);
      by_request_.erase(t.engine_request);
    }
    // Counters first, the final message last: a client that has its final sees them updated.
    if (t.queued) shared_->num_queued.fetch_sub(1);
    {
      std::lock_guard lock(shared_->mutex);
      if (reason == finish_reason::error)
        ++shared_->num_failed;
      else if (reason == finish_reason::abort)
        ++shared_->num_aborted;
      else
        ++shared_->num_completed;
    }
    const caf::actor subscriber = t.subscriber;
    if (subscriber) {
      auto range = by_subscriber_.equal_range(t.subscriber.address());
      for (auto s = range.first; s != range.second; ++s) {
        if (s->second == ticket) {
          by_subscriber_.erase(s);
          break;
        }
      }
      if (by_subscriber_.count(t.subscriber.address()) == 0) demonitor(t.subscriber);
    }
    tickets_.erase(it);
    shared_->ticket_closed();
    if (subscriber) send(subscriber, final_atom_v, final_ptr(std::move(final)));
  }

  // After each step: admission counters, the facade's snapshot, the KV manager and the event bus.
  void publish() {
    const step_record& record = engine_->last_record();
    for (const engine_event& e : record.events) {
      if (e.kind != event_kind::admitted) continue;
      auto r = by_request_.find(e.request);
      if (r == by_request_.end()) continue;
      auto t = tickets_.find(r->second);
      if (t != tickets_.end() && t->second.queued) {
        t->second.queued = false;
        shared_->num_queued.fetch_sub(1);
      }
    }
    {
      std::lock_guard lock(shared_->mutex);
      shared_->stats = engine_->stats();
      shared_->device = record.device;
      shared_->host = record.host;
      shared_->num_waiting = record.num_waiting;
      shared_->num_running = record.num_running;
      shared_->num_swapped = record.num_swapped;
    }
    if (config_.kv_manager) {
      auto occupancy = std::make_shared<kv_occupancy>();
      occupancy->step = record.step;
      occupancy->device = record.device;
      occupancy->host = record.host;
      const auto now = runtime_clock::now();
      // An engine going idle publishes nothing more: its last block view must be exact (the dashboard).
      const bool idle = record.num_running == 0 && record.num_waiting == 0 && record.num_swapped == 0;
      if (idle || last_snapshot_ == runtime_clock::time_point{} ||
          seconds_between(last_snapshot_, now) >= config_.kv_snapshot_interval_seconds) {
        last_snapshot_ = now;
        occupancy->blocks = std::make_shared<const std::vector<block_info>>(engine_->block_snapshot());
        occupancy->blocks_step = record.step;
      }
      send(config_.kv_manager, occupy_atom_v, occupancy_ptr(std::move(occupancy)));
    }
    if (config_.event_bus)
      send(config_.event_bus, publish_atom_v, record_ptr(std::make_shared<const step_record>(record)));
  }

  std::string health_message() const {
    std::lock_guard lock(shared_->mutex);
    return shared_->health_message.empty() ? "engine unavailable" : shared_->health_message;
  }

  void mark_unhealthy(const std::string& message) {
    {
      std::lock_guard lock(shared_->mutex);
      if (shared_->health_message.empty()) shared_->health_message = message;
    }
    shared_->healthy.store(false);
    shared_->changed.notify_all();
  }

  // Before the engine is dropped: abort what it still holds (running, waiting and swapped-out
  // requests the failed step did not touch), so their device and host blocks go back to the pools,
  // and publish that, so /metrics and the KV manager do not report blocks of requests that no longer
  // exist. The step that reports the aborts executes nothing (no request is left to schedule). An
  // engine that throws here (a scheduler failure) is dropped as it is.
  void release_engine_blocks(const std::vector<ticket_id>& tickets) {
    if (!engine_) return;
    try {
      for (ticket_id t : tickets)
        if (const request_id r = tickets_.at(t).engine_request) engine_->abort(r);
      engine_->step();
      publish();
    } catch (const std::exception&) {}
  }

  // The executor is gone: every open request ends with an error now, later submits are refused.
  void fatal(const std::string& message) {
    mark_unhealthy(message);
    std::vector<ticket_id> all;
    for (const auto& [t, s] : tickets_) all.push_back(t);
    release_engine_blocks(all);
    engine_.reset();  // nothing it holds is needed any more; closing must not touch it
    for (ticket_id t : all) close_ticket(t, finish_reason::error, message, true);
  }

  engine_actor_config config_;
  std::shared_ptr<runtime_shared> shared_;
  std::unique_ptr<actor_executor> proxy_;
  std::unique_ptr<llm_engine> engine_;
  std::unordered_map<ticket_id, ticket_state> tickets_;
  std::unordered_map<request_id, ticket_id> by_request_;
  std::unordered_multimap<caf::actor_addr, ticket_id> by_subscriber_;
  size_t next_tokenizer_ = 0;
  uint64_t num_encodes_sent_ = 0;
  bool shutting_down_ = false;  // a tokenizer actor was stopped on purpose: no more replacements
  bool step_pending_ = false;
  runtime_clock::time_point last_snapshot_{};
};

}  // namespace

caf::actor spawn_engine_actor(caf::actor_system& sys, engine_actor_config config) {
  return sys.spawn<engine_actor, caf::detached>(std::move(config));
}

}  // namespace tessera::actors
