#include "server/listen_socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace tessera::server {

std::string host_port(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

listen_socket listen_socket::open(const std::string& host, uint16_t port) {
  sockaddr_storage address{};
  socklen_t length = 0;
  bool v6 = false;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&address); inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    length = sizeof(sockaddr_in);
  } else if (auto* six = reinterpret_cast<sockaddr_in6*>(&address);
             inet_pton(AF_INET6, host.c_str(), &six->sin6_addr) == 1) {
    six->sin6_family = AF_INET6;
    six->sin6_port = htons(port);
    length = sizeof(sockaddr_in6);
    v6 = true;
  } else {
    throw std::invalid_argument("--host " + host + " is not an IPv4 or IPv6 address");
  }
  listen_socket s;
  s.v6_ = v6;
  s.fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto fail = [&](const char* what) {
    const int error = errno;
    throw std::system_error(error, std::generic_category(), std::string(what) + " " + host_port(host, port));
  };
  if (s.fd_ < 0) fail("socket for");
  const int one = 1;
  if (::setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) fail("SO_REUSEADDR on");
  if (::bind(s.fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0) fail("bind");
  if (::listen(s.fd_, SOMAXCONN) != 0) fail("listen on");
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof bound;
  if (::getsockname(s.fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length) != 0) fail("getsockname of");
  s.port_ = ntohs(v6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                     : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return s;
}

listen_socket::~listen_socket() {
  if (fd_ >= 0) ::close(fd_);
}

listen_socket::listen_socket(listen_socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), v6_(other.v6_), port_(other.port_) {}

listen_socket& listen_socket::operator=(listen_socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    v6_ = other.v6_;
    port_ = other.port_;
  }
  return *this;
}

int listen_socket::release() { return std::exchange(fd_, -1); }

}  // namespace tessera::server
