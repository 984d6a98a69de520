// The server's WebSocket frame path (issue #14): Beast's server-side websocket stream, accepting the
// upgrade and reading messages under the limit the server sets (read_message_max), each message
// then decoded as the session decodes it (server/ws_message.hpp: the envelope, a start's fields) and a
// start's request parsed by parse_generation_request — over an in-memory stream, no sockets or actors.
// tests/server/ws_replay_test.cpp drives the same path through the real server on loopback.
//
// Input: a byte that picks how the bytes arrive (reads of 1 to 65536 bytes), then the client's bytes
// after its upgrade request: frames, masked or not, as a peer would send them. Oracles besides the
// sanitizers: Beast reports bad framing as an error code (never an exception), a message is within
// the limit, and the decoders throw only api_error. Beast alone does not keep text messages UTF-8
// (RFC 6455 §8.1): it skips the check when a fragmented message ends with an empty frame (found by
// this target: tests/fuzz/regressions/ws_frames/), so the harness applies the session's own check
// (ws_text_is_valid: the session closes with 1007) before decoding, as the session does.
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "server/request_parser.hpp"
#include "server/ws_message.hpp"

namespace {

namespace beast = boost::beast;
namespace websocket = beast::websocket;

constexpr char k_upgrade[] =
    "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
constexpr int32_t k_vocab_size = 49152;  // the default model's, so token ids in requests are checked

void decode(const std::string& text) {
  using tessera::server::api_error;
  tessera::server::ws_envelope message;
  try {
    tessera::server::parse_ws_envelope(text, message);
  } catch (const api_error&) { return; }
  if (message.type != "start") return;
  try {
    const tessera::server::ws_start start = tessera::server::parse_ws_start(message);
    (void)tessera::server::parse_generation_request(start.request_json, start.kind, k_vocab_size);
  } catch (const api_error&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr size_t k_read_sizes[] = {1, 2, 3, 7, 64, 512, 4096, 65536};
  boost::asio::io_context ioc;
  beast::test::stream client_side(ioc), server_side(ioc);
  server_side.connect(client_side);  // what the server writes (101, pongs, close) lands in client_side
  server_side.read_size(k_read_sizes[data[0] % 8]);
  server_side.append(k_upgrade);
  server_side.append(tessera::fuzz::as_text(data + 1, size - 1));
  server_side.close_remote();  // the client is done: reads end with eof once the bytes are consumed

  websocket::stream<beast::test::stream&> ws(server_side);
  const size_t max_message = tessera::server::k_ws_default_max_message_bytes;
  ws.read_message_max(max_message);
  beast::error_code ec;
  ws.accept(ec);
  tessera::fuzz::check(!ec, "the fixed upgrade request was refused: " + ec.message());
  beast::flat_buffer buffer;
  for (;;) {
    ws.read(buffer, ec);
    if (ec) break;  // a protocol error, the close handshake, or the end of the input
    const std::string text = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    tessera::fuzz::check(text.size() <= max_message, "a message over read_message_max was delivered");
    if (ws.got_text() && !tessera::server::ws_text_is_valid(text)) break;  // closed with 1007
    decode(text);         // the session decodes binary messages the same way
    client_side.clear();  // what the server answered (pongs) is not looked at
  }
  return 0;
}
