// vLLM's truncate_prompt_tokens as the engine actor applies it (actors/prompt_truncation.hpp), at the
// limits: N - 1 / N / N + 1 tokens, -1 with a requested and with the default max_tokens.
#include "actors/prompt_truncation.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace tessera::actors {
namespace {

std::vector<token_id> iota(int n) {
  std::vector<token_id> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

TEST(prompt_truncation, keeps_the_last_n_tokens) {
  sampling_params p;
  for (int len : {9, 10, 11}) {
    std::vector<token_id> ids = iota(len);
    truncate_prompt(ids, 10, 100, p);
    ASSERT_EQ(ids.size(), static_cast<size_t>(std::min(len, 10))) << len;
    EXPECT_EQ(ids.back(), len - 1);  // the prompt's end is kept
    EXPECT_EQ(ids.front(), std::max(0, len - 10));
  }
  std::vector<token_id> ids = iota(5);
  truncate_prompt(ids, 0, 100, p);  // 0: untouched
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_NO_THROW(truncate_prompt(ids, 100, 100, p));  // at max_model_len: allowed
  try {
    truncate_prompt(ids, 101, 100, p);
    ADD_FAILURE() << "no error beyond max_model_len";
  } catch (const invalid_request& e) { EXPECT_EQ(e.param(), "truncate_prompt_tokens"); }
}

TEST(prompt_truncation, minus_one_keeps_what_fits_with_max_tokens) {
  sampling_params p;
  p.truncate_to_context = false;  // a requested max_tokens
  p.max_tokens = 24;
  std::vector<token_id> ids = iota(2000);
  truncate_prompt(ids, -1, 1024, p);
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(ids.back(), 1999);
  p.truncate_to_context = true;  // the default max_tokens ends at the context: all but one position
  ids = iota(2000);
  truncate_prompt(ids, -1, 1024, p);
  EXPECT_EQ(ids.size(), 1023u);
  p.truncate_to_context = false;
  p.max_tokens = 1024;  // nothing fits: untouched, the engine refuses it
  ids = iota(2000);
  truncate_prompt(ids, -1, 1024, p);
  EXPECT_EQ(ids.size(), 2000u);
  ids = iota(2000);
  truncate_prompt(ids, -1, 0, p);  // unknown context: untouched
  EXPECT_EQ(ids.size(), 2000u);
}

}  // namespace
}  // namespace tessera::actors
