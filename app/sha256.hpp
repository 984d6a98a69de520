// SHA-256 of a file, with OpenSSL's libcrypto (its SHA-NI / AVX2 code hashes a few hundred MB in about
// a second), for `tessera pull` and `tessera list` to check a model against its catalogue entry.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace tessera::app {

// The lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

// The lower-case hex SHA-256 of the file's contents; `progress(done, total)` after each 4 MiB when
// given. Throws std::runtime_error naming the file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path,
                        const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace tessera::app
