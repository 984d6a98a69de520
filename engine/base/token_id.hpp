// A token's index in the model's vocabulary: the one type the tokenizer, sampler, sequences, stop
// checker and executors exchange tokens in. int32_t, as the executors' embedding lookups and the
// GGUF/HF vocabularies (at most 2^31 entries) need.
#pragma once
#include <cstdint>

namespace tessera {

using token_id = int32_t;

}  // namespace tessera
