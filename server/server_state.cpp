#include "server/server_state.hpp"

#include <cstdio>
#include <random>

#include "server/static_files.hpp"

namespace tessera::server {

server_state::server_state(actors::engine_facade& e, server_options options) : engine(e), opt(std::move(options)) {
  std::random_device rd;
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%06x", rd() & 0xFFFFFF);
  id_prefix_ = prefix;
  if (!opt.webui_dir.empty()) ui = std::make_unique<static_files>(opt.webui_dir, opt.webui_vendor);
}

server_state::~server_state() = default;

std::string server_state::new_id(const char* prefix, char separator) {
  char text[64];
  std::snprintf(text, sizeof text, "%s%c%s%llx", prefix, separator, id_prefix_.c_str(),
                static_cast<unsigned long long>(next_id_.fetch_add(1)));
  return text;
}

actors::stream_handle server_state::submit(const generation_request& req) {
  actors::submit_result r = req.kind == api_kind::embedding
                                ? engine.submit_embedding(req.prompt, opt.pooling, req.priority)
                                : engine.submit(req.prompt, req.params, req.priority);
  if (!r) {
    const int status = r.error == actors::submit_error::overloaded ? 429
                       : r.error == actors::submit_error::invalid  ? 400
                                                                   : 503;
    if (status != 400) metrics.record_rejected(status);
    throw api_error(status, r.message.empty() ? std::string(actors::to_string(r.error)) : r.message, "",
                    std::string(actors::to_string(r.error)));
  }
  return std::move(r.stream);
}

bool server_state::wait_until_not_busy(std::chrono::milliseconds timeout) {
  std::unique_lock lock(busy_mutex_);
  return busy_cv_.wait_for(lock, timeout, [&] { return num_busy_ == 0; });
}

busy_token::busy_token(server_state& state) : state_(&state) {
  std::lock_guard lock(state.busy_mutex_);
  ++state.num_busy_;
}

busy_token::~busy_token() {
  std::lock_guard lock(state_->busy_mutex_);
  if (--state_->num_busy_ == 0) state_->busy_cv_.notify_all();
}

}  // namespace tessera::server
