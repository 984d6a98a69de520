#include "app/sha256.hpp"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace tessera::app {

namespace {

struct md_ctx_deleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using md_ctx = std::unique_ptr<EVP_MD_CTX, md_ctx_deleter>;

md_ctx new_sha256() {
  md_ctx ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("cannot set up SHA-256 (libcrypto)");
  return ctx;
}

std::string hex_digest(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx, digest, &len) != 1) throw std::runtime_error("SHA-256 failed (libcrypto)");
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += digits[digest[i] >> 4];
    out += digits[digest[i] & 15];
  }
  return out;
}

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  md_ctx ctx = new_sha256();
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return hex_digest(ctx.get());
}

std::string sha256_file(const std::filesystem::path& path, const std::function<void(int64_t, int64_t)>& progress) {
  std::unique_ptr<std::FILE, file_closer> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot read " + path.string() + ": " + std::strerror(errno));
  std::error_code ec;
  const auto total = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  md_ctx ctx = new_sha256();
  std::vector<unsigned char> buffer(size_t{4} << 20);
  int64_t done = 0;
  for (;;) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), f.get());
    if (n > 0) EVP_DigestUpdate(ctx.get(), buffer.data(), n);
    done += static_cast<int64_t>(n);
    if (progress) progress(done, ec ? done : total);
    if (n < buffer.size()) break;
  }
  if (std::ferror(f.get())) throw std::runtime_error("cannot read " + path.string() + ": " + std::strerror(errno));
  return hex_digest(ctx.get());
}

}  // namespace tessera::app
