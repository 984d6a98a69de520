// The identifiers of the serving core: requests, their sequences (one per choice), and physical KV
// blocks. Token ids are engine/base/token_id.hpp (the tokenizer shares them).
#pragma once
#include <cstdint>

namespace tessera {

using request_id = uint64_t;
using seq_id = uint64_t;
// A physical block of the executor's KV pool (device or host); int32_t because executors index their
// pools with it.
using block_id = int32_t;

}  // namespace tessera
