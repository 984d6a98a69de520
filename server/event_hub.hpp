// Fan-out of the engine's event bus to /v1/events WebSocket clients: each batch is serialized once
// (Boost.JSON) and handed to every subscribed sink, which posts it to its session's strand.
//
// Besides pool counts, queues and events, messages carry the KV cache block by block (for the
// dashboard's mosaic) in a bounded form: a block view is sent at most every `block_interval`
// (longer for larger pools), as runs of equal blocks, and as a diff against the previous block view
// unless a new client joined or `full_interval` passed (then the whole pool). A 10,000-block pool
// whose blocks change slowly costs a few hundred bytes per message. Format: docs/websocket.md.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"

namespace tessera::server {

// One block as the dashboard sees it (the compared and encoded unit).
struct block_tile {
  request_id owner;  // 0: no owner (free, possibly cached)
  int32_t ref_count = 0;
  int32_t num_filled = 0;
  bool cached = false;
  bool operator==(const block_tile&) const = default;
};

// A pool's blocks, in block-id order.
using block_tiles = std::vector<block_tile>;

// Runs of equal tiles as a flat array [start, count, owner, ref_count, num_filled, cached(0/1), ...].
// With `previous` (same size), only blocks that differ from it are encoded (a diff); else every block.
std::vector<int64_t> encode_block_runs(const block_tiles& tiles, const block_tiles* previous);

// Splits an occupancy snapshot's block list into the device pool and the host (swap) pool: blocks
// [0, device.num_total) are device blocks, the rest (when present) host blocks.
void split_pools(const actors::kv_occupancy& occupancy, block_tiles& device, block_tiles& host);

struct event_hub_options {
  std::chrono::milliseconds block_interval{250};  // least time between two block views
  std::chrono::milliseconds full_interval{5000};  // a complete view at least this often
  int32_t blocks_per_second_budget = 40000;       // larger pools get a proportionally longer interval
};

class event_hub {
 public:
  using message = std::shared_ptr<const std::string>;
  using sink = std::function<void(message)>;
  using block_source = std::function<actors::occupancy_ptr()>;

  explicit event_hub(event_hub_options options = {}) : options_(options) {}

  uint64_t add(sink s);  // the next block view sent is complete
  void remove(uint64_t id);
  // Where block views come from (the facade's kv_occupancy_snapshot); unset: no block views.
  void set_block_source(block_source source);
  void publish(const actors::event_batch& batch);
  // A first message for a client that just subscribed: the pools' usage and a complete block view,
  // so an idle engine (which publishes nothing) still shows its cache. nullopt without a snapshot.
  std::optional<std::string> initial_message();
  // The message for a batch; `blocks` (a serialized "blocks" member) is added when present.
  static std::string to_json(const actors::event_batch& batch, const std::string* blocks = nullptr);

 private:
  // The serialized "blocks" object if one is due now, else nullopt. Called from publish() only.
  // `settled`: the engine has nothing left to run, so no later message would carry the final view.
  std::optional<std::string> next_block_view(bool settled);

  event_hub_options options_;
  std::mutex mutex_;
  uint64_t next_ = 1;
  std::map<uint64_t, sink> sinks_;
  bool need_full_ = true;
  block_source source_;
  std::mutex view_mutex_;  // the block-view state below
  block_tiles sent_device_, sent_host_;
  uint64_t sent_step_ = 0;
  bool have_sent_ = false;
  std::chrono::steady_clock::time_point last_view_{}, last_full_{};
};

}  // namespace tessera::server
