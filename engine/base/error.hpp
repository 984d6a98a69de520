// Errors that cross the engine's public boundary.
// Load-time problems (bad model files, bad configuration) are exceptions of these types; per-step
// outcomes that are expected (a request that does not fit) are return values, never exceptions.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

// A model file or directory that cannot be used: truncated, corrupt, hostile or unsupported.
// The message names the problem and, where known, the byte offset or the tensor/key involved.
class load_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed parameters the engine cannot honour (bad sampling values, prompt too long, ...).
// `param`: the request field at fault when one is (an API names it in its error), else empty.
class invalid_request : public std::runtime_error {
 public:
  explicit invalid_request(const std::string& message, std::string param = {})
      : std::runtime_error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

}  // namespace tessera
