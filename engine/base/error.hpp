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
class invalid_request : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tessera
