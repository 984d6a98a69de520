#include "server/event_hub.hpp"

#include <boost/json.hpp>

namespace tessera::server {

namespace json = boost::json;

uint64_t event_hub::add(sink s) {
  std::lock_guard lock(mutex_);
  sinks_.emplace(next_, std::move(s));
  return next_++;
}

void event_hub::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  sinks_.erase(id);
}

void event_hub::publish(const actors::event_batch& batch) {
  std::vector<sink> targets;
  {
    std::lock_guard lock(mutex_);
    if (sinks_.empty()) return;
    for (const auto& [id, s] : sinks_) targets.push_back(s);
  }
  auto text = std::make_shared<const std::string>(to_json(batch));
  for (const auto& s : targets) s(text);
}

namespace {

json::object pool_json(const pool_usage& u) {
  return json::object{{"total", u.num_total}, {"used", u.num_used}, {"free", u.num_free}, {"cached", u.num_cached}};
}

}  // namespace

std::string event_hub::to_json(const actors::event_batch& b) {
  json::object out{{"type", "events"}, {"num_records", b.num_records}, {"num_dropped_events", b.num_dropped_events}};
  if (b.latest) {
    const step_record& r = *b.latest;
    out["step"] = r.step;
    out["device"] = pool_json(r.device);
    out["host"] = pool_json(r.host);
    out["num_waiting"] = r.num_waiting;
    out["num_running"] = r.num_running;
    out["num_swapped"] = r.num_swapped;
    out["num_batch_seqs"] = r.num_batch_seqs;
    out["num_prefill_tokens"] = r.num_prefill_tokens;
    out["num_decode_tokens"] = r.num_decode_tokens;
    out["num_swap_in_blocks"] = r.num_swap_in_blocks;
    out["num_swap_out_blocks"] = r.num_swap_out_blocks;
    out["step_seconds"] = r.step_seconds;
    out["kv_waste"] = r.kv_waste;
    json::array running;
    for (const auto& s : r.running) {
      running.push_back(json::object{{"seq", s.seq}, {"request", s.request}, {"num_blocks", s.num_blocks}, {"num_tokens", s.num_tokens}});
    }
    out["running"] = std::move(running);
  }
  json::array events;
  for (const auto& e : b.events) {
    json::object ev{{"step", e.step},
                    {"kind", std::string(to_string(e.event.kind))},
                    {"request", e.event.request},
                    {"seq", e.event.seq},
                    {"num_blocks", e.event.num_blocks}};
    if (e.event.reason != preemption_reason::none) ev["reason"] = std::string(to_string(e.event.reason));
    events.push_back(std::move(ev));
  }
  out["events"] = std::move(events);
  return json::serialize(out);
}

}  // namespace tessera::server
