#include "server/listener.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/http_session.hpp"

namespace tessera::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

listener::listener(server_state& state) : state_(state) {
  if (state.opt.listen_fd >= 0) {
    acceptor_.assign(state.opt.listen_fd_v6 ? tcp::v6() : tcp::v4(), state.opt.listen_fd);
  } else {
    const tcp::endpoint endpoint(net::ip::make_address(state.opt.host), state.opt.port);
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(net::socket_base::max_listen_connections);
  }
  port_ = acceptor_.local_endpoint().port();
  state.bound_port = port_;
}

listener::~listener() { stop(); }

void listener::start(int num_threads) {
  do_accept();
  const int n = std::max(1, num_threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run_thread(); });
}

// An exception out of run() has unwound one handler (and with it, the last reference to a session
// usually, which closes its socket); Asio's io_context stays usable and run() may simply be called
// again (issue #14: a chunked trailer of 64 KiB made Beast throw std::length_error out of run(),
// and std::terminate took the whole process down, before authentication).
void listener::run_thread() {
  for (;;) {
    try {
      ioc_.run();
      return;  // stopped, or out of work
    } catch (const std::exception& e) {
      state_.metrics.record_exception();
      spdlog::error("I/O thread: uncaught exception from a connection's handler: {}; the thread goes on", e.what());
    } catch (...) {
      state_.metrics.record_exception();
      spdlog::error(
          "I/O thread: uncaught exception (not a std::exception) from a connection's handler; the thread goes on");
    }
  }
}

void listener::do_accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      try {
        if (state_.opt.send_buffer_bytes > 0) {
          boost::system::error_code opt_ec;  // best effort: the kernel's default serves as well
          socket.set_option(net::socket_base::send_buffer_size(state_.opt.send_buffer_bytes), opt_ec);
        }
        std::make_shared<http_session>(state_, std::move(socket))->run();
      } catch (const std::exception& e) {  // out of memory, say: that connection is dropped, not the acceptor
        state_.metrics.record_exception();
        spdlog::error("cannot start a session: {}", e.what());
      }
      return do_accept();
    }
    // Out of file descriptors and the like: back off instead of spinning on the error.
    spdlog::warn("accept failed: {}; retrying in 100 ms", ec.message());
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](boost::system::error_code wait_ec) {
      if (!wait_ec && acceptor_.is_open()) do_accept();
    });
  });
}

void listener::stop_accepting() {
  net::post(ioc_, [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
  });
}

void listener::stop() {
  stop_accepting();
  ioc_.stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

}  // namespace tessera::server
