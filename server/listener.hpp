// The listening socket and the I/O threads: one io_context run by opt.num_threads threads; each
// accepted connection gets a strand of its own and an http_session (which may hand the socket over to
// a ws_session). No I/O thread ever blocks on the engine, and none dies of an exception: the sessions
// catch what their handlers throw, and what still escapes (from inside Beast) is logged here and
// the thread runs on.
#pragma once
#include <boost/asio.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include "server/server_state.hpp"

namespace tessera::server {

class listener {
 public:
  // Binds opt.host:opt.port and listens (sets state.bound_port); throws std::system_error when the
  // address cannot be bound.
  explicit listener(server_state& state);
  ~listener();
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;

  uint16_t port() const { return port_; }
  void start(int num_threads);  // starts accepting and the I/O threads; returns at once
  void stop_accepting();        // closes the listening socket (any thread); connections keep being served
  void stop();                  // stops the io_context and joins the I/O threads (idempotent)
  boost::asio::io_context& context() { return ioc_; }

 private:
  void do_accept();
  void run_thread();  // one I/O thread: runs the io_context until stop(), surviving any exception

  server_state& state_;
  // Destroyed before the state (the listener is declared after it): with the io_context go the
  // handlers that own the sessions, and the sessions still use the state while they die.
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_{ioc_};
  boost::asio::steady_timer accept_retry_{ioc_};
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
};

}  // namespace tessera::server
