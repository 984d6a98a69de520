// Fan-out of the engine's event bus to /v1/events WebSocket clients: each batch is serialized once
// (Boost.JSON) and handed to every subscribed sink, which posts it to its session's strand.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "actors/messages.hpp"

namespace tessera::server {

class event_hub {
 public:
  using message = std::shared_ptr<const std::string>;
  using sink = std::function<void(message)>;

  uint64_t add(sink s);
  void remove(uint64_t id);
  void publish(const actors::event_batch& batch);
  static std::string to_json(const actors::event_batch& batch);

 private:
  std::mutex mutex_;
  uint64_t next_ = 1;
  std::map<uint64_t, sink> sinks_;
};

}  // namespace tessera::server
