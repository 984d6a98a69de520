#include "server/boost_assert.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::server {

bool is_known_false_boost_assertion(const char* expr, const char* function, const char* file) {
  const size_t file_len = std::strlen(file);
  constexpr const char* k_parser = "beast/http/impl/basic_parser.ipp";
  const size_t parser_len = std::strlen(k_parser);
  return std::strcmp(expr, "n >= 5") == 0 && std::strstr(function, "parse_chunk_header") != nullptr &&
         file_len >= parser_len && std::strcmp(file + file_len - parser_len, k_parser) == 0;
}

}  // namespace tessera::server

#ifndef BOOST_ENABLE_ASSERT_HANDLER
#error "server/boost_assert.cpp is the handler of BOOST_ENABLE_ASSERT_HANDLER (server/CMakeLists.txt)"
#endif

namespace boost {

// What BOOST_ASSERT calls (boost/assert.hpp) when its expression is false.
void assertion_failed(const char* expr, const char* function, const char* file, long line) {
  if (tessera::server::is_known_false_boost_assertion(expr, function, file)) return;
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s' failed.\n", file, line, function, expr);
  std::fflush(stderr);
  std::abort();
}

void assertion_failed_msg(const char* expr, const char* msg, const char* function, const char* file, long line) {
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s' failed: %s\n", file, line, function, expr, msg);
  std::fflush(stderr);
  std::abort();
}

}  // namespace boost
