// A stream that first hands out bytes already read from its next layer, then reads from it: how a
// WebSocket keeps the frames that arrived in the same read as its upgrade request. The HTTP session
// reads the upgrade request with its own parser and buffer, and a client that does not wait for the
// 101 (or whose first frame shares a TCP segment with the handshake) leaves frame bytes in that
// buffer; Beast's websocket::stream cannot be given them (its accept(buffers) re-parses a request in
// a 1536-byte buffer), so they go in front of the socket instead. Writes go straight through.
#pragma once
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/websocket/teardown.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace tessera::server {

template <class NextLayer>
class prefixed_stream {
 public:
  using next_layer_type = NextLayer;
  using executor_type = typename NextLayer::executor_type;

  prefixed_stream(NextLayer&& next, std::string prefix) : next_(std::move(next)), prefix_(std::move(prefix)) {}

  executor_type get_executor() noexcept { return next_.get_executor(); }
  NextLayer& next_layer() noexcept { return next_; }
  const NextLayer& next_layer() const noexcept { return next_; }
  size_t prefix_left() const noexcept { return prefix_.size() - offset_; }

  template <class MutableBufferSequence, class ReadHandler>
  auto async_read_some(const MutableBufferSequence& buffers, ReadHandler&& handler) {
    return boost::asio::async_initiate<ReadHandler, void(boost::beast::error_code, size_t)>(
        [this](auto&& h, const MutableBufferSequence& b) {
          if (prefix_left() == 0) return next_.async_read_some(b, std::move(h));
          const size_t n = boost::asio::buffer_copy(b, boost::asio::buffer(prefix_) + offset_);
          offset_ += n;
          if (prefix_left() == 0) {
            prefix_ = std::string();
            offset_ = 0;
          }
          // Never complete inline (an Asio operation's contract): post, on the handler's executor.
          boost::asio::post(get_executor(),
                            boost::beast::bind_front_handler(std::move(h), boost::beast::error_code{}, n));
        },
        handler, buffers);
  }

  template <class ConstBufferSequence, class WriteHandler>
  auto async_write_some(const ConstBufferSequence& buffers, WriteHandler&& handler) {
    return next_.async_write_some(buffers, std::forward<WriteHandler>(handler));
  }

 private:
  NextLayer next_;
  std::string prefix_;
  size_t offset_ = 0;
};

// The WebSocket close handshake ends by tearing down the next layer (found by ADL).
template <class NextLayer>
void teardown(boost::beast::role_type role, prefixed_stream<NextLayer>& stream, boost::beast::error_code& ec) {
  using boost::beast::websocket::teardown;
  teardown(role, stream.next_layer(), ec);
}

template <class NextLayer, class TeardownHandler>
void async_teardown(boost::beast::role_type role, prefixed_stream<NextLayer>& stream, TeardownHandler&& handler) {
  using boost::beast::websocket::async_teardown;
  async_teardown(role, stream.next_layer(), std::forward<TeardownHandler>(handler));
}

}  // namespace tessera::server
