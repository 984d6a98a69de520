// The HTTP request path (headers, bodies, chunked framing, trailers) against thousands of generated
// malformed byte streams, at two levels:
//  * replay_http_input(): the server's read path without sockets (tests/server/http_read_path.hpp,
//    also the body of the libFuzzer target tests/fuzz/http_request_fuzz.cpp), fed in pieces of 1 to
//    65536 bytes; its oracles are the header's; and the generator must reach every outcome (accepted,
//    400, 413, 431, 501), else it tests less than it claims;
//  * a sample of the same inputs sent to the real server on loopback: every answer is a well-formed
//    status line with an expected status (or the connection closes), and afterwards the server
//    answers /health, has caught no exception and has no open stream.
#include <random>
#include <set>

#include "tests/server/http_read_path.hpp"
#include "tests/server/loopback_support.hpp"

namespace tessera::server {
namespace {

using namespace loopback;

const uint32_t k_header_limit = server_options{}.max_header_bytes;
constexpr size_t k_body_limit = 64 * 1024;

using replay_outcome = read_path::outcome;

// One input through the server's read path (tests/server/http_read_path.hpp, which the libFuzzer
// target tests/fuzz/http_request_fuzz.cpp drives too); an oracle that fails fails the test.
replay_outcome replay_http_input(std::string_view input, size_t read_size) {
  read_path::limits lim;
  lim.header_bytes = k_header_limit;
  lim.body_bytes = k_body_limit;
  return read_path::replay(input, read_size, lim, [](bool ok, const char* what) { EXPECT_TRUE(ok) << what; });
}

// ---- generated inputs ---------------------------------------------------------------------------

std::string chunk_of(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

std::vector<std::string> seed_requests() {
  const std::string body = R"({"prompt":"abc"})";
  const std::string cl = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return {
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
      "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + cl + "\r\n" + body,
      "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk_of(body.substr(0, 5)) +
          "b;ext=1;q=\"x\"\r\n" + body.substr(5) + "\r\n0\r\nX-Trailer: 1\r\nX-Other: two\r\n\r\n",
      "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n" + cl + "\r\n" + body,
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
      "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
      "POST /detokenize HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 13\r\n\r\n{\"tokens\":[1]}",
  };
}

// Header lines and framing pieces that have broken HTTP servers (smuggling, overflows, limits).
const std::vector<std::string>& hostile_lines() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> v = {
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: gzip",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, chunked",
        "Transfer-Encoding:  chunked ",
        "Transfer-Encoding: xchunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        "Content-Length: 5",
        "Content-Length: 0",
        "Content-Length: -1",
        "Content-Length: 99999999999999999999999",
        "Content-Length: 16, 16",
        "Content-Length: 0x10",
        "Content-Length: 1e3",
        "Host: evil.example",
        "Host:",
        "Host: [::1",
        "Host: a b",
        "Expect: 100-continue",
        "Expect: 100-Continue, x",
        "Authorization: Bearer",
        "Authorization: bearer   k",
        "Connection: close",
        "Connection: keep-alive, upgrade",
        "Upgrade: websocket",
        "X-Null: a\0b",
        "X-Bad\x7f: v",
        ": no-name",
        "X-Folded: a\r\n  b",
        "X-Utf8: \xc3\xa9\xff\xfe",
    };
    for (size_t n : {size_t{8100}, size_t{60000}, size_t{65533}, size_t{65534}, size_t{65535}, size_t{70000}}) {
      v.push_back("X-Big: " + std::string(n, 'a'));
    }
    return v;
  }();
  return lines;
}

const std::vector<std::string>& hostile_chunk_sizes() {
  static const std::vector<std::string> sizes = {"ffffffffffffffff",
                                                 "1ffffffffffffffff",
                                                 "10000000000000000",
                                                 "-1",
                                                 "0x10",
                                                 " 5",
                                                 "5 ",
                                                 "00000000000000000000000000000005",
                                                 "",
                                                 "5;" + std::string(20000, 'e'),
                                                 "zz"};
  return sizes;
}

std::string mutate(std::string s, std::mt19937& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int num = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < num; ++k) {
    switch (rng() % 10) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 1: {  // insert framing bytes
        static const char* bits[] = {"\r\n", "\n", "\r", ":", " ", "\t", ";", ",", "0\r\n\r\n", "\r\n\r\n", "\0"};
        const char* b = bits[pick(std::size(bits))];
        s.insert(pick(s.size() + 1), std::string(b, b[0] == '\0' ? 1 : std::strlen(b)));
        break;
      }
      case 2:  // delete a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(32, s.size() - at)));
        }
        break;
      case 3: {  // a hostile header line after the request line
        const size_t eol = s.find("\r\n");
        if (eol != std::string::npos) s.insert(eol + 2, hostile_lines()[pick(hostile_lines().size())] + "\r\n");
        break;
      }
      case 4: {  // duplicate a header line
        const size_t a = s.find("\r\n");
        const size_t b = a == std::string::npos ? a : s.find("\r\n", a + 2);
        if (b != std::string::npos) s.insert(b + 2, s.substr(a + 2, b - a));
        break;
      }
      case 5: {  // a hostile chunk size (or extension) where a chunk starts
        const size_t body = s.find("\r\n\r\n");
        if (body != std::string::npos) {
          s.insert(body + 4, hostile_chunk_sizes()[pick(hostile_chunk_sizes().size())] + "\r\nabcde\r\n");
        }
        break;
      }
      case 6:  // a trailer section, of any size, after a last chunk
        s += "0\r\nX-T: " + std::string(pick(3) == 0 ? 66000 + pick(4000) : pick(9000), 't') + "\r\n\r\n";
        break;
      case 7:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 8:  // many tiny headers
        if (const size_t eol = s.find("\r\n"); eol != std::string::npos) {
          std::string many;
          for (size_t i = 0, n = 1 + pick(3000); i < n; ++i) many += "a" + std::to_string(i) + ":b\r\n";
          s.insert(eol + 2, many);
        }
        break;
      default: {  // bare LF line ends
        for (size_t at = s.find("\r\n"); at != std::string::npos; at = s.find("\r\n", at + 1)) {
          if (rng() % 2) s.erase(at, 1);
        }
        break;
      }
    }
  }
  return s;
}

std::vector<std::string> generated_inputs(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> seeds = seed_requests();
  std::vector<std::string> out(seeds.begin(), seeds.end());
  // The issue #14 crash, exactly: a 64 KiB trailer field value.
  out.push_back("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" +
                chunk_of("{\"prompt\":\"x\"}") + "0\r\nX-Big: " + std::string(65534, 'a') + "\r\n\r\n");
  while (out.size() < count) {
    if (rng() % 20 == 0) {  // plain noise
      std::string noise(rng() % 2000, '\0');
      for (char& c : noise) c = static_cast<char>(rng());
      out.push_back(noise);
    } else {
      out.push_back(mutate(seeds[rng() % seeds.size()], rng));
    }
  }
  return out;
}

TEST(http_replay, generated_inputs_through_the_read_path) {
  const std::vector<std::string> inputs = generated_inputs(4000, 1234);
  std::mt19937 rng(99);
  std::map<int, int> statuses;
  int num_accepted = 0;
  for (const std::string& input : inputs) {
    const size_t read_size = std::array<size_t, 5>{1, 7, 512, 4096, 65536}[rng() % 5];
    replay_outcome o;
    try {
      o = replay_http_input(input, read_size);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception " << e.what() << " for input of " << input.size()
                    << " bytes: " << input.substr(0, 120);
      continue;
    }
    ++statuses[o.status];
    num_accepted += o.num_requests;
    if (HasFailure()) {
      ADD_FAILURE() << "for input " << input.substr(0, 200);
      break;
    }
  }
  // The generator reaches every outcome (else it tests less than it claims).
  for (int status : {0, 400, 413, 431, 501}) EXPECT_GT(statuses[status], 0) << "no input ended with " << status;
  EXPECT_GT(num_accepted, 100);
}

TEST(http_replay, generated_inputs_against_the_real_server) {
  server_options so;
  so.max_body_bytes = k_body_limit;
  loopback_server s(so);
  const std::set<int> expected = {200, 400, 401, 403, 404, 405, 413, 417, 426, 431, 501};
  const std::vector<std::string> inputs = generated_inputs(300, 4321);
  int num_answered = 0;
  for (const std::string& input : inputs) {
    raw_connection c(s, 10s);
    c.send(input);
    beast::error_code ec;
    c.sock.shutdown(tcp::socket::shutdown_send, ec);  // the end of the input: the server closes when done
    const std::string r = c.read_all();
    if (r.empty()) continue;
    ++num_answered;
    // Every response in what came back starts with a status line the server sends.
    for (size_t at = r.find("HTTP/1.1 "); at != std::string::npos; at = r.find("HTTP/1.1 ", at + 1)) {
      // "HTTP/1.1 DDD ": a status line ("an HTTP/1.1 request needs..." quoted in an error body is not).
      if (at + 13 > r.size() || !std::isdigit(static_cast<unsigned char>(r[at + 9])) || r[at + 12] != ' ') continue;
      const int status = std::atoi(r.c_str() + at + 9);
      if (status == 100 || status == 101) continue;
      EXPECT_TRUE(expected.count(status)) << status << " for " << input.substr(0, 200);
    }
    EXPECT_EQ(r.rfind("HTTP/1.", 0), 0u) << r.substr(0, 100);
  }
  EXPECT_GT(num_answered, 200);
  EXPECT_EQ(get(s, "/health").status, 200);
  const auto m = metrics(s);
  EXPECT_EQ(m.at("tessera_server_exceptions_total"), 0);
  EXPECT_EQ(m.at("tessera_num_streams_open"), 0);
}

}  // namespace
}  // namespace tessera::server
