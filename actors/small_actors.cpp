// The tokenizer, executor, KV-manager and event-bus actors, and the actor_executor adapter.
#include <caf/all.hpp>

#include <chrono>
#include <exception>
#include <unordered_map>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

void add_message_types(caf::actor_system_config& cfg) { cfg.add_message_types<caf::id_block::tessera_actors>(); }

// ---- tokenizer --------------------------------------------------------------------------------

namespace {

caf::behavior tokenizer_behavior(caf::event_based_actor* self, std::shared_ptr<const prompt_encoder> encoder) {
  (void)self;
  return {
      [encoder](encode_atom, const prompt_ptr& prompt) -> caf::result<std::vector<token_id>> {
        if (!prompt) return caf::make_error(caf::sec::invalid_argument, "no prompt");
        try {
          return encoder->encode(*prompt);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string(e.what()));
        }
      },
  };
}

// ---- executor ---------------------------------------------------------------------------------

caf::behavior executor_behavior(caf::event_based_actor* self, std::shared_ptr<executor> exec) {
  return {
      [self, exec](exec_atom, exec_job job) -> caf::result<done_atom> {
        try {
          exec->execute(*job.batch, *job.out);
          return done_atom_v;
        } catch (const std::exception& e) {
          auto err = caf::make_error(caf::sec::runtime_error, std::string("executor failed: ") + e.what());
          self->quit(err);
          return err;
        }
      },
  };
}

// ---- KV block manager (read side) ---------------------------------------------------------------

struct kv_manager_state {
  occupancy_ptr latest;
  static inline const char* name = "kv_manager";
};

caf::behavior kv_manager_behavior(caf::stateful_actor<kv_manager_state>* self) {
  return {
      [self](occupy_atom, const occupancy_ptr& occupancy) {
        // A snapshot without blocks keeps the previous block view (blocks are refreshed at a bounded rate).
        if (occupancy && !occupancy->blocks && self->state.latest && self->state.latest->blocks) {
          auto merged = std::make_shared<kv_occupancy>(*occupancy);
          merged->blocks = self->state.latest->blocks;
          merged->blocks_step = self->state.latest->blocks_step;
          self->state.latest = std::move(merged);
        } else {
          self->state.latest = occupancy;
        }
      },
      [self](query_atom) -> occupancy_ptr { return self->state.latest; },
      [self](query_atom, usage_atom) -> usage_report {
        usage_report r;
        if (const auto& l = self->state.latest) {
          r.device = l->device;
          r.host = l->host;
          r.step = l->step;
        }
        return r;
      },
  };
}

// ---- event bus --------------------------------------------------------------------------------

class event_bus_actor : public caf::event_based_actor {
 public:
  event_bus_actor(caf::actor_config& cfg, event_bus_options options)
      : caf::event_based_actor(cfg), options_(options) {}

  const char* name() const override { return "event_bus"; }

  caf::behavior make_behavior() override {
    set_down_handler([this](const caf::down_msg& down) { subscribers_.erase(down.source); });
    return {
        [this](subscribe_atom, const caf::actor& sink, double max_rate_hz) {
          if (!sink) return;
          subscriber s;
          s.sink = sink;
          if (max_rate_hz > 0)
            s.min_interval = std::chrono::duration_cast<runtime_clock::duration>(std::chrono::duration<double>(1.0 / max_rate_hz));
          monitor(sink);
          subscribers_[sink.address()] = std::move(s);
        },
        [this](publish_atom, const record_ptr& record) {
          if (!record) return;
          for (auto& [addr, s] : subscribers_) {
            if (!s.pending) s.pending = std::make_shared<event_batch>();
            s.pending->latest = record;  // latest wins: occupancy and queue sizes are state, not history
            ++s.pending->num_records;
            for (const engine_event& e : record->events) {
              if (s.pending->events.size() < options_.max_events_per_batch)
                s.pending->events.push_back({record->step, e});
              else
                ++s.pending->num_dropped_events;
            }
            try_flush(s);
          }
        },
        [this](ack_atom) {
          auto it = subscribers_.find(caf::actor_cast<caf::actor_addr>(current_sender()));
          if (it == subscribers_.end()) return;
          it->second.in_flight = false;
          try_flush(it->second);
        },
        [this](flush_atom, const caf::actor& sink) {
          auto it = subscribers_.find(sink.address());
          if (it == subscribers_.end()) return;
          it->second.flush_scheduled = false;
          try_flush(it->second);
        },
    };
  }

 private:
  struct subscriber {
    caf::actor sink;
    runtime_clock::duration min_interval{0};
    runtime_clock::time_point last_sent{};
    bool in_flight = false;        // a batch was sent and not yet acknowledged
    bool flush_scheduled = false;  // a delayed flush_atom is on its way
    std::shared_ptr<event_batch> pending;
  };

  // At most one unacknowledged batch per subscriber and at most one batch per min_interval: a slow
  // subscriber only makes its own batches bigger (coalesced), never the engine slower.
  void try_flush(subscriber& s) {
    if (s.in_flight || !s.pending) return;
    const auto now = runtime_clock::now();
    if (now - s.last_sent < s.min_interval) {
      if (!s.flush_scheduled) {
        s.flush_scheduled = true;
        delayed_send(this, s.min_interval - (now - s.last_sent), flush_atom_v, s.sink);
      }
      return;
    }
    event_batch_ptr batch = std::move(s.pending);
    s.pending.reset();
    s.in_flight = true;
    s.last_sent = now;
    send(s.sink, events_atom_v, batch);
  }

  event_bus_options options_;
  std::unordered_map<caf::actor_addr, subscriber> subscribers_;
};

caf::behavior event_callback_sink(caf::event_based_actor* self, std::function<void(const event_batch&)> callback) {
  return {
      [self, callback](events_atom, const event_batch_ptr& batch) {
        if (batch) callback(*batch);
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), ack_atom_v);
      },
  };
}

}  // namespace

caf::actor spawn_tokenizer_actor(caf::actor_system& sys, std::shared_ptr<const prompt_encoder> encoder) {
  return sys.spawn(tokenizer_behavior, std::move(encoder));
}

caf::actor spawn_executor_actor(caf::actor_system& sys, std::shared_ptr<executor> exec) {
  return sys.spawn<caf::detached>(executor_behavior, std::move(exec));
}

caf::actor spawn_kv_manager_actor(caf::actor_system& sys) { return sys.spawn(kv_manager_behavior); }

caf::actor spawn_event_bus(caf::actor_system& sys, event_bus_options options) {
  return sys.spawn<event_bus_actor>(options);
}

caf::actor spawn_event_callback_sink(caf::actor_system& sys, std::function<void(const event_batch&)> callback) {
  return sys.spawn<caf::detached>(event_callback_sink, std::move(callback));
}

// ---- actor_executor -----------------------------------------------------------------------------

struct actor_executor::blocking_self {
  explicit blocking_self(caf::actor_system& sys) : self(sys) {}
  caf::scoped_actor self;
};

actor_executor::actor_executor(caf::actor_system& sys, caf::actor exec_actor, const executor& metadata)
    : sys_(sys),
      actor_(std::move(exec_actor)),
      config_(metadata.config()),
      spec_(metadata.kv_spec()),
      block_bytes_(metadata.kv_block_bytes()),
      name_(metadata.name()) {}

actor_executor::~actor_executor() = default;

void actor_executor::execute(const step_batch& batch, step_output& out) {
  if (failed()) throw std::runtime_error(failure_);
  if (!self_) self_ = std::make_unique<blocking_self>(sys_);
  // infinite: the executor is local and either answers or goes down, and a down actor answers every
  // pending request with request_receiver_down at once.
  self_->self->request(actor_, caf::infinite, exec_atom_v, exec_job{&batch, &out})
      .receive([](done_atom) {},
               [this](caf::error& err) {
                 failure_ = sys_.render(err);
                 if (failure_.empty()) failure_ = "executor actor failed";
               });
  if (failed()) throw std::runtime_error(failure_);
}

}  // namespace tessera::actors
