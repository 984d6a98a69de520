#include "server/http_server.hpp"

#include <condition_variable>
#include <mutex>

#include "server/listener.hpp"
#include "server/server_state.hpp"

namespace tessera::server {

struct http_server::impl {
  impl(actors::engine_facade& engine, server_options options) : state(engine, std::move(options)), net(state) {}

  server_state state;
  listener net;  // after the state: destroyed first, with every session (see listener.hpp)
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopped = false;
};

http_server::http_server(actors::engine_facade& engine, server_options options)
    : impl_(std::make_unique<impl>(engine, std::move(options))) {
  server_state& s = impl_->state;
  // The facade's event thread publishes into the hub; the hub outlives this server if it must.
  s.hub->set_block_source([&engine] { return engine.kv_occupancy_snapshot(); });  // the dashboard's mosaic
  std::weak_ptr<event_hub> hub = s.hub;
  engine.subscribe_events([hub](const actors::event_batch& batch) {
    if (auto h = hub.lock()) h->publish(batch);
  });
}

http_server::~http_server() { stop(); }

uint16_t http_server::port() const { return impl_->net.port(); }

void http_server::start() { impl_->net.start(impl_->state.opt.num_threads); }

void http_server::stop_accepting() { impl_->net.stop_accepting(); }

void http_server::stop() {
  impl& s = *impl_;
  {
    std::lock_guard lock(s.stop_mutex);
    if (s.stopped) return;
    s.stopped = true;
  }
  s.state.poster->close();
  s.net.stop();
  s.stop_cv.notify_all();
}

bool http_server::wait_for_responses(std::chrono::milliseconds timeout) {
  return impl_->state.wait_until_not_busy(timeout);
}

void http_server::wait() {
  impl& s = *impl_;
  std::unique_lock lock(s.stop_mutex);
  s.stop_cv.wait(lock, [&] { return s.stopped; });
}

}  // namespace tessera::server
