// The WebSocket frame path against generated hostile frame sequences, each on a fresh connection to
// the real server on loopback: a replay harness standing in for a libFuzzer target (tests/fuzz/ is
// another branch's; replay_ws_input() is the body an LLVMFuzzerTestOneInput would have, with the
// loopback server made once in LLVMFuzzerInitialize).
//
// The frames: every opcode (reserved ones too), FIN and RSV bits, masked and unmasked, 7/16/64-bit
// lengths (non-minimal and huge ones, lengths beyond the bytes sent), control frames over 125 bytes
// or fragmented, continuations without a start, invalid UTF-8, close frames with reserved codes or
// bad reasons, messages over the size limit, and valid /v1/ws messages (auth, ping, start, cancel)
// in between, some sent in the same write as the handshake. Oracles: the server completes the
// handshake, every frame it sends is well-formed (unmasked, a known opcode, a length that fits),
// each connection ends (the server closes once the client has), and afterwards the server answers
// /health, has caught no exception, has no open stream or used KV block, and no WebSocket open.
#include <random>

#include "tests/server/loopback_support.hpp"

namespace tessera::server {
namespace {

using namespace loopback;

const std::string k_handshake =
    "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

// One frame (RFC 6455 §5.2) with whatever header bits the caller chooses.
std::string frame(uint8_t first_byte, bool masked, const std::string& payload, int length_form, uint64_t declared) {
  std::string f;
  f += static_cast<char>(first_byte);
  const char mask_bit = masked ? static_cast<char>(0x80) : 0;
  if (length_form == 0 && declared < 126) {
    f += static_cast<char>(mask_bit | static_cast<char>(declared));
  } else if (length_form <= 1) {
    f += static_cast<char>(mask_bit | 126);
    f += static_cast<char>((declared >> 8) & 0xFF);
    f += static_cast<char>(declared & 0xFF);
  } else {
    f += static_cast<char>(mask_bit | 127);
    for (int i = 7; i >= 0; --i) f += static_cast<char>((declared >> (8 * i)) & 0xFF);
  }
  const char mask[4] = {0x5a, 0x17, 0x3c, 0x71};
  if (masked) f.append(mask, 4);
  for (size_t i = 0; i < payload.size(); ++i) f += masked ? static_cast<char>(payload[i] ^ mask[i % 4]) : payload[i];
  return f;
}

std::string good_frame(const std::string& text) { return frame(0x81, true, text, 0, text.size()); }

std::string random_frame(std::mt19937& rng) {
  static const std::vector<std::string> messages = {
      R"({"type":"ping"})",
      R"({"type":"auth","api_key":"x"})",
      R"({"type":"start","id":"a","endpoint":"completions","request":{"prompt":"abc","max_tokens":5}})",
      R"({"type":"start","id":"b","request":{"prompt":"abc","max_tokens":3,"n":2,"logprobs":2}})",
      R"({"type":"cancel","id":"a"})",
      R"({"type":"start","id":"","request":{}})",
      R"({"type":"bogus"})",
      R"({not json)",
      "\xff\xfe\xfd",
      "\xed\xa0\x80",  // a surrogate: invalid UTF-8 in a text frame
      "",
  };
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::string payload = messages[pick(messages.size())];
  if (pick(10) == 0) payload = std::string(pick(3) == 0 ? 70000 : 126 + pick(200), 'x');  // > 125 / > 64 KiB
  static const uint8_t opcodes[] = {0x0, 0x1, 0x2, 0x3, 0x7, 0x8, 0x9, 0xA, 0xB, 0xF};
  uint8_t op = pick(3) == 0 ? opcodes[pick(std::size(opcodes))] : 0x1;
  if (op == 0x8 && pick(2)) {  // a close frame with some code and reason
    static const uint16_t codes[] = {1000, 1001, 1005, 1006, 1015, 999, 1004, 2999, 3000, 4999, 5000};
    const uint16_t code = codes[pick(std::size(codes))];
    payload = std::string{static_cast<char>(code >> 8), static_cast<char>(code & 0xFF)} +
              (pick(2) ? std::string("\xc3\x28") : std::string("bye"));
  }
  uint8_t first = op;
  if (pick(4) != 0) first |= 0x80;                                    // FIN, mostly
  if (pick(12) == 0) first |= static_cast<uint8_t>(0x10 << pick(3));  // an RSV bit
  const bool masked = pick(10) != 0;
  const int length_form = pick(6) == 0 ? static_cast<int>(1 + pick(2)) : 0;  // non-minimal 16/64-bit lengths
  uint64_t declared = payload.size();
  if (pick(15) == 0) declared = pick(2) ? (uint64_t{1} << 63) + pick(1000) : payload.size() + 1 + pick(100000);
  if (declared >= 126 && length_form == 0) return frame(first, masked, payload, declared < 65536 ? 1 : 2, declared);
  return frame(first, masked, payload, length_form, declared);
}

struct server_frame {
  unsigned opcode = 0;
  std::string payload;  // cut short when the connection ended inside it
};

// The frames after the 101 response in everything the server sent, each checked as well-formed.
std::vector<server_frame> server_frames(const std::string& r) {
  std::vector<server_frame> frames;
  size_t at = r.find("\r\n\r\n");
  if (at == std::string::npos) return frames;
  at += 4;
  while (at < r.size()) {
    if (at + 2 > r.size()) break;  // a frame cut by the close is allowed at the end only
    const auto b0 = static_cast<unsigned char>(r[at]), b1 = static_cast<unsigned char>(r[at + 1]);
    EXPECT_EQ(b1 & 0x80, 0) << "a server frame is masked";
    EXPECT_EQ(b0 & 0x70, 0) << "a server frame has RSV bits";
    const unsigned op = b0 & 0x0F;
    EXPECT_TRUE(op == 0x1 || op == 0x8 || op == 0x9 || op == 0xA) << "opcode " << op;
    uint64_t len = b1 & 0x7F;
    size_t head = 2;
    if (len == 126) {
      if (at + 4 > r.size()) break;
      len = (uint64_t{static_cast<unsigned char>(r[at + 2])} << 8) | static_cast<unsigned char>(r[at + 3]);
      head = 4;
    } else if (len == 127) {
      if (at + 10 > r.size()) break;
      len = 0;
      for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<unsigned char>(r[at + 2 + static_cast<size_t>(i)]);
      head = 10;
    }
    EXPECT_LT(len, uint64_t{64} << 20);
    if (at + head + len > r.size()) {  // cut by the close
      frames.push_back({op, r.substr(std::min(at + head, r.size()))});
      break;
    }
    frames.push_back({op, r.substr(at + head, static_cast<size_t>(len))});
    at += head + static_cast<size_t>(len);
  }
  return frames;
}

struct ws_outcome {
  bool upgraded = false;
  bool closed_by_server = false;
  std::vector<server_frame> frames;
};

// Ends a connection from our side: our close frame (1000), our FIN, then everything the server still
// sends until it closes.
std::string close_and_read_rest(raw_connection& c) {
  c.send(frame(0x88, true, std::string("\x03\xe8", 2), 0, 2));
  beast::error_code ec;
  c.sock.shutdown(tcp::socket::shutdown_send, ec);
  return c.read_all();
}

// One connection: the handshake, `frames`, our close frame, then our FIN; reads until the server
// closes. Checks every server frame.
ws_outcome replay_ws_input(const loopback_server& s, const std::string& frames, bool with_handshake_packet) {
  ws_outcome out;
  raw_connection c(s, 10s);
  std::string r;  // everything the server sent
  if (with_handshake_packet) {
    c.send(k_handshake + frames);
  } else {
    c.send(k_handshake);
    r = c.read_until([](const std::string& got) { return got.find("\r\n\r\n") != std::string::npos; });
    c.send(frames);
  }
  r += close_and_read_rest(c);
  out.upgraded = r.rfind("HTTP/1.1 101", 0) == 0;
  EXPECT_TRUE(out.upgraded) << r.substr(0, 200);
  out.frames = server_frames(r);
  for (const server_frame& f : out.frames) out.closed_by_server |= f.opcode == 0x8;
  return out;
}

// One connection that sends `frames` after the handshake and reads until the server has sent
// `pongs` pongs or a close frame; then our close frame and FIN, and whatever the server still sends.
std::vector<server_frame> exchange(const loopback_server& s, const std::string& frames, int pongs) {
  raw_connection c(s, 10s);
  c.send(k_handshake + frames);
  const auto count_pongs = [](const std::vector<server_frame>& got) {
    int n = 0;
    for (const server_frame& f : got) n += f.opcode == 0x1 && f.payload == R"({"type":"pong"})";
    return n;
  };
  std::string r = c.read_until([&](const std::string& got) {
    const std::vector<server_frame> f = server_frames(got);
    return count_pongs(f) >= pongs || (!f.empty() && f.back().opcode == 0x8);
  });
  r += close_and_read_rest(c);
  EXPECT_EQ(r.rfind("HTTP/1.1 101", 0), 0u) << r.substr(0, 200);
  return server_frames(r);
}

int close_code(const server_frame& f) {
  EXPECT_EQ(f.opcode, 0x8u);
  if (f.opcode != 0x8 || f.payload.size() < 2) return -1;
  return (static_cast<unsigned char>(f.payload[0]) << 8) | static_cast<unsigned char>(f.payload[1]);
}

// RFC 6455 §8.1: a text message that is not UTF-8 fails the connection with 1007. Boost 1.81 lets
// one through when a fragmented message ends with an empty final frame (found by the ws_frames fuzz
// target); the session's own check closes the connection, and the ping after it is never answered.
// A valid message fragmented the same way (a € in it) is answered, as is the ping after it.
TEST(ws_replay, a_text_message_cut_by_an_empty_final_frame_closes_with_1007) {
  loopback_server s;
  const std::string ping = R"({"type":"ping"})";
  const auto fragmented = [&](const std::string& text) {
    return frame(0x01, true, text, 0, text.size()) + frame(0x80, true, "", 0, 0) + good_frame(ping);
  };
  const std::vector<server_frame> cut = exchange(s, fragmented(ping + " \xe2\x82"), 1);
  ASSERT_EQ(cut.size(), 1u) << "the server sent " << cut.size() << " frames, the first "
                            << (cut.empty() ? std::string("none") : cut.front().payload);
  EXPECT_EQ(close_code(cut.front()), 1007);

  const std::vector<server_frame> whole = exchange(s, fragmented("{\"type\":\"ping\",\"pad\":\"\xe2\x82\xac\"}"), 2);
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole[0].payload, R"({"type":"pong"})");
  EXPECT_EQ(whole[1].payload, R"({"type":"pong"})");
  EXPECT_EQ(close_code(whole[2]), 1000);
}

TEST(ws_replay, generated_frames_against_the_real_server) {
  loopback_server s;
  std::mt19937 rng(2024);
  constexpr int num_cases = 300;
  int num_server_closes = 0;
  for (int i = 0; i < num_cases; ++i) {
    std::string frames;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) frames += rng() % 4 == 0 ? good_frame(R"({"type":"ping"})") : random_frame(rng);
    const ws_outcome o = replay_ws_input(s, frames, rng() % 2 == 0);
    num_server_closes += o.closed_by_server;
    if (HasFailure()) {
      ADD_FAILURE() << "case " << i;
      break;
    }
  }
  EXPECT_GT(num_server_closes, num_cases / 2);
  EXPECT_EQ(get(s, "/health").status, 200);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::map<std::string, double> m;
  do {
    m = metrics(s);
    if (m["tessera_connections_open{protocol=\"websocket\"}"] == 0 && m["tessera_num_streams_open"] == 0) break;
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(m["tessera_server_exceptions_total"], 0);
  EXPECT_EQ(m["tessera_connections_open{protocol=\"websocket\"}"], 0);
  EXPECT_EQ(m["tessera_num_streams_open"], 0);
  EXPECT_EQ(m["tessera_kv_blocks_used{pool=\"device\"}"], 0);
}

}  // namespace
}  // namespace tessera::server
