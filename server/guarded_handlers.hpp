#pragma once
// The exception barrier of a session's completion handlers (issue #14): whatever a handler throws
// ends that one session, through its fail(), instead of unwinding out of io_context::run() and
// taking the I/O thread (and every other connection on it) down.

#include <exception>

namespace tessera::server {

// CRTP base of http_session and ws_session. Session: enable_shared_from_this<Session>, with a
// `void fail(const char* what) noexcept` that logs, counts and closes (it may befriend this class).
template <class Session>
class guarded_handlers {
 protected:
  // A completion handler that keeps the session alive and runs `fn` on it inside run_guarded().
  template <class... Args>
  auto guarded(void (Session::*fn)(Args...)) {
    return [self = static_cast<Session&>(*this).shared_from_this(), fn](Args... args) {
      self->run_guarded([&] { ((*self).*fn)(args...); });
    };
  }

  template <class Fn>
  void run_guarded(Fn&& fn) noexcept {
    try {
      fn();
    } catch (const std::exception& e) { static_cast<Session&>(*this).fail(e.what()); } catch (...) {
      static_cast<Session&>(*this).fail("an exception that is not a std::exception");
    }
  }
};

}  // namespace tessera::server
