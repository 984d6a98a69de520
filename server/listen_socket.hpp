// The server's listening socket, bound before anything slow happens: `tessera serve` opens it before
// the model loads, so a port in use (or an address this host does not have) is reported at once with
// its own exit status instead of after seconds of loading, and the listener adopts it (listener.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <system_error>

namespace tessera::server {

class listen_socket {
 public:
  listen_socket() = default;
  // Binds host:port (SO_REUSEADDR, as the listener always did) and listens. Throws std::system_error:
  // the code says why (EADDRINUSE: another process has the port; EADDRNOTAVAIL: not an address of
  // this host; EACCES: a privileged port), the message names host and port. An unparsable host
  // throws std::invalid_argument.
  static listen_socket open(const std::string& host, uint16_t port);
  ~listen_socket();
  listen_socket(listen_socket&& other) noexcept;
  listen_socket& operator=(listen_socket&& other) noexcept;
  listen_socket(const listen_socket&) = delete;
  listen_socket& operator=(const listen_socket&) = delete;

  bool valid() const { return fd_ >= 0; }
  bool is_v6() const { return v6_; }
  uint16_t port() const { return port_; }  // the bound port (port 0 asked for any free one)
  // Hands the descriptor over (the listener owns it from then on); -1 when none.
  int release();

 private:
  int fd_ = -1;
  bool v6_ = false;
  uint16_t port_ = 0;
};

// "127.0.0.1:8000", "[::1]:8000": host and port as a person writes them.
std::string host_port(const std::string& host, uint16_t port);

}  // namespace tessera::server
