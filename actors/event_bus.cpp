// The event bus: fans each step's record out to subscribers, at most one batch in flight and
// max_rate_hz batches per second each, coalescing meanwhile; and the callback sink that
// engine_facade::subscribe_events puts behind a subscription.
#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <unordered_map>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

namespace {

class event_bus_actor : public caf::event_based_actor {
 public:
  event_bus_actor(caf::actor_config& cfg, event_bus_options options) : caf::event_based_actor(cfg), options_(options) {}

  const char* name() const override { return "event_bus"; }

  caf::behavior make_behavior() override {
    set_down_handler([this](const caf::down_msg& down) { subscribers_.erase(down.source); });
    return {
        [this](subscribe_atom, const caf::actor& sink, double max_rate_hz) {
          if (!sink) return;
          subscriber s;
          s.sink = sink;
          if (max_rate_hz > 0)
            s.min_interval =
                std::chrono::duration_cast<runtime_clock::duration>(std::chrono::duration<double>(1.0 / max_rate_hz));
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

caf::actor spawn_event_bus(caf::actor_system& sys, event_bus_options options) {
  return sys.spawn<event_bus_actor>(options);
}

caf::actor spawn_event_callback_sink(caf::actor_system& sys, std::function<void(const event_batch&)> callback) {
  return sys.spawn<caf::detached>(event_callback_sink, std::move(callback));
}

}  // namespace tessera::actors
