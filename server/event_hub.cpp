#include "server/event_hub.hpp"

#include <boost/json.hpp>

#include <algorithm>

namespace tessera::server {

namespace json = boost::json;

std::vector<int64_t> encode_block_runs(const block_tiles& tiles, const block_tiles* previous) {
  std::vector<int64_t> out;
  const size_t n = tiles.size();
  size_t i = 0;
  while (i < n) {
    if (previous && (*previous)[i] == tiles[i]) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && tiles[j] == tiles[i] && !(previous && (*previous)[j] == tiles[j])) ++j;
    const block_tile& t = tiles[i];
    out.insert(out.end(), {static_cast<int64_t>(i), static_cast<int64_t>(j - i), static_cast<int64_t>(t.owner.value()),
                           t.ref_count, t.num_filled, t.cached ? 1 : 0});
    i = j;
  }
  return out;
}

void split_pools(const actors::kv_occupancy& o, block_tiles& device, block_tiles& host) {
  device.clear();
  host.clear();
  if (!o.blocks) return;
  const size_t num_device = std::min(o.blocks->size(), static_cast<size_t>(std::max(0, o.device.num_total)));
  for (size_t i = 0; i < o.blocks->size(); ++i) {
    const block_info& b = (*o.blocks)[i];
    block_tile t{b.ref_count > 0 ? b.owner_request : request_id{}, b.ref_count, b.num_filled, b.cached};
    (i < num_device ? device : host).push_back(t);
  }
}

uint64_t event_hub::add(sink s) {
  std::lock_guard lock(mutex_);
  sinks_.emplace(next_, std::move(s));
  need_full_ = true;
  return next_++;
}

void event_hub::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  sinks_.erase(id);
}

void event_hub::set_block_source(block_source source) {
  std::lock_guard lock(view_mutex_);
  source_ = std::move(source);
}

std::optional<std::string> event_hub::next_block_view(bool settled) {
  std::lock_guard lock(view_mutex_);
  if (!source_) return std::nullopt;
  bool full;
  {
    std::lock_guard sinks_lock(mutex_);
    full = need_full_;
  }
  const auto now = std::chrono::steady_clock::now();
  const size_t num_blocks = sent_device_.size() + sent_host_.size();
  // Larger pools get views less often, so bytes per second stay bounded whatever the pool size.
  const auto interval = std::max<std::chrono::milliseconds>(
      options_.block_interval, std::chrono::milliseconds(static_cast<int64_t>(
                                   1000.0 * double(num_blocks) / std::max(1, options_.blocks_per_second_budget))));
  if (have_sent_ && !full && !settled && now - last_view_ < interval) return std::nullopt;
  const actors::occupancy_ptr occupancy = source_();
  if (!occupancy || !occupancy->blocks) return std::nullopt;
  if (have_sent_ && !full && occupancy->blocks_step == sent_step_ && now - last_full_ < options_.full_interval) {
    return std::nullopt;
  }
  block_tiles device, host;
  split_pools(*occupancy, device, host);
  if (!have_sent_ || now - last_full_ >= options_.full_interval || device.size() != sent_device_.size() ||
      host.size() != sent_host_.size()) {
    full = true;
  }
  auto pool = [&](const block_tiles& tiles, const block_tiles& sent, const pool_usage& usage) {
    json::array runs;
    for (int64_t v : encode_block_runs(tiles, full ? nullptr : &sent)) runs.push_back(v);
    // total: the pool's size; "blocks": how many of them this view describes (0: only counts known).
    return json::object{{"total", usage.num_total}, {"blocks", tiles.size()}, {"runs", std::move(runs)}};
  };
  json::object view{{"step", occupancy->blocks_step}, {"full", full}};
  if (!full) view["since"] = sent_step_;
  view["device"] = pool(device, sent_device_, occupancy->device);
  view["host"] = pool(host, sent_host_, occupancy->host);
  sent_device_ = std::move(device);
  sent_host_ = std::move(host);
  sent_step_ = occupancy->blocks_step;
  have_sent_ = true;
  last_view_ = now;
  if (full) {
    last_full_ = now;
    std::lock_guard sinks_lock(mutex_);
    need_full_ = false;
  }
  return json::serialize(view);
}

std::optional<std::string> event_hub::initial_message() {
  block_source source;
  {
    std::lock_guard lock(view_mutex_);
    source = source_;
  }
  if (!source) return std::nullopt;
  const actors::occupancy_ptr occupancy = source();
  if (!occupancy || !occupancy->blocks) return std::nullopt;
  block_tiles device, host;
  split_pools(*occupancy, device, host);
  auto pool = [](const block_tiles& tiles, const pool_usage& usage) {
    json::array runs;
    for (int64_t v : encode_block_runs(tiles, nullptr)) runs.push_back(v);
    return json::object{{"total", usage.num_total}, {"blocks", tiles.size()}, {"runs", std::move(runs)}};
  };
  auto usage = [](const pool_usage& u) {
    return json::object{{"total", u.num_total}, {"used", u.num_used}, {"free", u.num_free}, {"cached", u.num_cached}};
  };
  // No "step": the counts of a step record are not known here, only the pools'.
  json::object out{{"type", "events"},
                   {"num_records", 0},
                   {"num_dropped_events", 0},
                   {"device", usage(occupancy->device)},
                   {"host", usage(occupancy->host)},
                   {"events", json::array()},
                   {"blocks", json::object{{"step", occupancy->blocks_step},
                                           {"full", true},
                                           {"device", pool(device, occupancy->device)},
                                           {"host", pool(host, occupancy->host)}}}};
  return json::serialize(out);
}

void event_hub::publish(const actors::event_batch& batch) {
  std::vector<sink> targets;
  {
    std::lock_guard lock(mutex_);
    if (sinks_.empty()) return;
    for (const auto& [id, s] : sinks_) targets.push_back(s);
  }
  const step_record* r = batch.latest.get();
  const bool settled = r && r->num_running == 0 && r->num_waiting == 0 && r->num_swapped == 0;
  const std::optional<std::string> blocks = next_block_view(settled);
  auto text = std::make_shared<const std::string>(to_json(batch, blocks ? &*blocks : nullptr));
  for (const auto& s : targets) s(text);
}

namespace {

json::object pool_json(const pool_usage& u) {
  return json::object{{"total", u.num_total}, {"used", u.num_used}, {"free", u.num_free}, {"cached", u.num_cached}};
}

}  // namespace

std::string event_hub::to_json(const actors::event_batch& b, const std::string* blocks) {
  json::object out{{"type", "events"}, {"num_records", b.num_records}, {"num_dropped_events", b.num_dropped_events}};
  if (b.latest) {
    const step_record& r = *b.latest;
    out["step"] = r.step;
    out["device"] = pool_json(r.device);
    out["host"] = pool_json(r.host);
    out["num_waiting"] = r.num_waiting;
    out["num_running"] = r.num_running;
    out["num_swapped"] = r.num_swapped;
    json::object by_reason;
    for (size_t i = 1; i < std::size(r.num_waiting_by_reason); ++i) {
      by_reason[to_string(static_cast<waiting_reason>(i))] = r.num_waiting_by_reason[i];
    }
    out["num_waiting_by_reason"] = std::move(by_reason);
    out["num_batch_seqs"] = r.num_batch_seqs;
    out["num_prefill_tokens"] = r.num_prefill_tokens;
    out["num_decode_tokens"] = r.num_decode_tokens;
    out["num_swap_in_blocks"] = r.num_swap_in_blocks;
    out["num_swap_out_blocks"] = r.num_swap_out_blocks;
    out["num_copy_blocks"] = r.num_copy_blocks;
    out["step_seconds"] = r.step_seconds;
    out["predicted_seconds"] = r.predicted_seconds;
    out["prefill_budget"] = r.prefill_budget;
    out["kv_waste"] = r.kv_waste;
    json::array running;
    for (const auto& s : r.running) {
      running.push_back(json::object{{"seq", s.seq.value()},
                                     {"request", s.request.value()},
                                     {"num_blocks", s.num_blocks},
                                     {"num_tokens", s.num_tokens},
                                     {"num_window_freed", s.num_window_freed},
                                     {"constrained", s.constrained},
                                     {"num_draft_tokens", s.num_draft_tokens},
                                     {"num_accepted_draft_tokens", s.num_accepted_draft_tokens}});
    }
    out["running"] = std::move(running);
  }
  json::array events;
  const auto now = engine_clock::now();
  for (const auto& e : b.events) {
    json::object ev{{"step", e.step},
                    {"kind", std::string(to_string(e.event.kind))},
                    {"request", e.event.request.value()},
                    {"seq", e.event.seq.value()},
                    {"num_blocks", e.event.num_blocks}};
    if (e.event.reason != preemption_reason::none) ev["reason"] = std::string(to_string(e.event.reason));
    if (e.event.swap_bytes != 0) ev["swap_bytes"] = e.event.swap_bytes;
    if (e.event.recompute_tokens != 0) ev["recompute_tokens"] = e.event.recompute_tokens;
    if (e.event.estimated_seconds != 0) ev["estimated_seconds"] = e.event.estimated_seconds;
    // How long before this message the event happened: batches are coalesced (~100 ms), so a viewer
    // places events by `its receive time - age`, not by when the batch arrived.
    if (e.event.at != engine_clock::time_point{})
      ev["age"] = std::max(0.0, std::chrono::duration<double>(now - e.event.at).count());
    events.push_back(std::move(ev));
  }
  out["events"] = std::move(events);
  std::string text = json::serialize(out);
  if (blocks) {
    // Spliced in rather than re-parsed: `blocks` is already serialized JSON.
    text.pop_back();
    text += ",\"blocks\":";
    text += *blocks;
    text += '}';
  }
  return text;
}

}  // namespace tessera::server
