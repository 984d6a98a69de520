// Whether a draft model may propose for a target: its token ids must mean the same tokens, since the
// target verifies the draft's ids as its own. Checked at startup on what both tokenizers loaded.
#pragma once
#include <string>

#include "engine/text/tokenizer.hpp"

namespace tessera {

// Empty when `draft` has `target`'s vocabulary: the same number of tokens, the same text for every id
// and which of them are special (control), and the same special ids (BOS, EOS, EOT, UNK, PAD and the end-of-generation
// set). Else the first difference, worded for a startup error ("token 17 is '<|im_end|>' in the target, ...").
std::string vocabulary_mismatch(const tokenizer& target, const tokenizer& draft);

}  // namespace tessera
