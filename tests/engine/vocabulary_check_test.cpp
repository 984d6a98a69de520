// vocabulary_mismatch (engine/speculative/vocabulary_check.hpp): a draft model may propose only when
// its token ids mean the target's tokens. One difference at a time — the size, a token's text, whether
// a token is special, a special id, the end-of-generation set — must each be found and named; the
// same vocabulary must pass.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/speculative/vocabulary_check.hpp"

namespace tessera {
namespace {

// Byte-level BPE: plain tokens "a".."e", then the specials <s> (BOS) and </s> (EOS).
vocab_data base() {
  vocab_data v;
  v.tokens = {"a", "b", "c", "d", "e", "<s>", "</s>"};
  v.types.assign(5, token_type::normal);
  v.types.push_back(token_type::control);
  v.types.push_back(token_type::control);
  v.bos = 5;
  v.eos = 6;
  return v;
}

std::string mismatch_with(void (*change)(vocab_data&)) {
  vocab_data d = base();
  change(d);
  return vocabulary_mismatch(tokenizer(base()), tokenizer(std::move(d)));
}

TEST(vocabulary_check, the_same_vocabulary_passes) {
  EXPECT_EQ(vocabulary_mismatch(tokenizer(base()), tokenizer(base())), "");
}

TEST(vocabulary_check, each_difference_is_named) {
  const std::string size = mismatch_with([](vocab_data& d) {
    d.tokens.push_back("f");
    d.types.push_back(token_type::normal);
  });
  EXPECT_NE(size.find("7 tokens, the draft's 8"), std::string::npos) << size;
  const std::string text = mismatch_with([](vocab_data& d) { d.tokens[2] = "x"; });
  EXPECT_NE(text.find("token 2 is 'c' in the target, 'x' in the draft"), std::string::npos) << text;
  const std::string special = mismatch_with([](vocab_data& d) { d.types[4] = token_type::control; });
  EXPECT_NE(special.find("token 4"), std::string::npos) << special;
  EXPECT_NE(special.find("special in the draft only"), std::string::npos) << special;
  const std::string eos = mismatch_with([](vocab_data& d) { d.eos = 5; });
  EXPECT_NE(eos.find("EOS token is 6 in the target, 5 in the draft"), std::string::npos) << eos;
  const std::string bos = mismatch_with([](vocab_data& d) { d.bos.reset(); });
  EXPECT_NE(bos.find("BOS token is 5 in the target, none in the draft"), std::string::npos) << bos;
}

}  // namespace
}  // namespace tessera
