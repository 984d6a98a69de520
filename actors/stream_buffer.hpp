// The buffer of one request's stream, between its producer (the request's sink actor, on a CAF thread)
// and its consumer (whoever holds the stream_handle): deltas in order, then exactly one final.
//
// Bounded: with max_buffered_deltas items waiting, a new delta is merged into the newest buffered
// delta of the same choice, so a slow reader never slows the engine and still sees every token in
// order (only step boundaries are lost).
//
// Two ways to consume it: block in next(), or be told. A consumer that must not block (an I/O thread)
// registers a ready hook and drains with take_all() whenever the hook fires.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <variant>
#include <vector>

#include "actors/messages.hpp"

namespace tessera::actors {

// One item of a stream: a delta or the final message (always the last item).
using stream_item = std::variant<stream_delta, stream_final>;

class stream_buffer {
 public:
  explicit stream_buffer(size_t max_buffered_deltas);
  stream_buffer(const stream_buffer&) = delete;
  stream_buffer& operator=(const stream_buffer&) = delete;

  // ---- producer (the sink actor) ----
  void push_delta(const stream_delta& d);  // ignored once the final arrived
  void push_final(const stream_final& f);  // the first one wins

  // ---- consumer ----
  // The next item, blocking up to `timeout`; nullopt on timeout or once the final was taken.
  std::optional<stream_item> next(std::chrono::milliseconds timeout);
  // Every item waiting now, in order, without blocking (empty when none).
  std::vector<stream_item> take_all();
  // Calls `hook` when items become available: when the buffer goes from empty to non-empty, and at
  // once if items are already waiting. Coalesced: after a call, the next one comes only once a read
  // (next or take_all) has found or left the buffer empty, so at most one call of a registered hook
  // is outstanding and a consumer that drains with take_all() on each call misses nothing. The hook
  // runs on the producer's thread, outside the buffer's lock, and may race with the consumer: it must
  // be quick, must not block, and should hand the reading to the consumer's own thread. An empty
  // function removes the hook (a call already under way may still finish, so the hook must hold its
  // target weakly).
  void on_ready(std::function<void()> hook);

  bool final_arrived() const;

 private:
  using hook_ptr = std::shared_ptr<const std::function<void()>>;
  // After a push, under the lock: the hook to call once the lock is released, if a call is due.
  hook_ptr due_hook();
  // After a read, under the lock: an empty buffer re-arms the hook.
  void note_read();

  const size_t max_buffered_deltas_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<stream_item> items_;
  bool final_arrived_ = false;
  bool final_taken_ = false;
  hook_ptr hook_;
  bool hook_called_ = false;  // a call was made and no read has found or left the buffer empty since
};

}  // namespace tessera::actors
