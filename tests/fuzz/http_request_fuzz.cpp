// The server's HTTP read path (tests/server/http_read_path.hpp): Beast's request_parser under the
// server's header and body limits, the session's bounded read buffer, then its header checks
// (check_framing, parse_expect) and trailer rule (take_trailer_section), request after request on one
// keep-alive stream. Issue #14: a trailer field of 64 KiB made Beast throw std::length_error out of
// the I/O thread; the read buffer bound now refuses it first.
//
// Input: a byte that picks how the stream arrives (pieces of 1 to 65536 bytes), then the stream.
// Oracles besides the sanitizers: those of read_path::replay (only api_error escapes the checks, the
// buffer stays within its bound, what is accepted has one framing, no trailer field left, and header +
// trailer sections within the header limit); any other exception is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "tests/server/http_read_path.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr size_t k_read_sizes[] = {1, 2, 3, 7, 64, 512, 4096, 65536};
  const size_t read_size = k_read_sizes[data[0] % 8];
  tessera::server::read_path::limits limits;  // the server's defaults: an 8 KiB header section
  limits.body_bytes = 64 * 1024;              // smaller than the server's 2 MiB: inputs stay fast
  tessera::server::read_path::replay(tessera::fuzz::as_text(data + 1, size - 1), read_size, limits,
                                     [](bool ok, const char* what) { tessera::fuzz::check(ok, what); });
  return 0;
}
