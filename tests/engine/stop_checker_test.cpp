// Tests of stop_checker: hand cases for the rules, plus a randomized comparison with a naive oracle
// that sees the whole text at once (so it is independent of how the text is split into deltas).
#include "engine/stop_checker.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

namespace tessera {
namespace {

constexpr token_id eos = 2;
constexpr token_id plain = 100;  // an ordinary token

sampling_params with_stops(std::vector<std::string> stops, bool include = false) {
  sampling_params p;
  p.max_tokens = 1000;
  p.stop = std::move(stops);
  p.include_stop_str_in_output = include;
  return p;
}

struct run_result {
  std::string text;                  // everything streamed
  std::vector<std::string> emitted;  // per append
  finish_reason reason = finish_reason::none;
  std::optional<int32_t> stop_string_index;
  std::optional<token_id> stop_token;
};

// Feeds `deltas` as ordinary tokens; flushes at the end if nothing stopped the sequence.
run_result feed(const sampling_params& params, const std::vector<std::string>& deltas) {
  const std::vector<token_id> eos_ids = {eos};
  stop_checker checker(params, eos_ids);
  run_result r;
  for (const std::string& d : deltas) {
    const stop_update u = checker.append(plain, d);
    r.emitted.push_back(u.text);
    r.text += u.text;
    if (u.reason != finish_reason::none) {
      r.reason = u.reason;
      r.stop_string_index = u.stop_string_index;
      r.stop_token = u.stop_token;
      EXPECT_TRUE(checker.finished());
      return r;
    }
  }
  r.text += checker.flush();
  return r;
}

TEST(StopCheckerTest, WithoutStopsTextPassesThroughUntilMaxTokens) {
  sampling_params p;
  p.max_tokens = 3;
  stop_checker checker(p);
  EXPECT_EQ(checker.append(plain, "a").text, "a");
  EXPECT_EQ(checker.append(plain, "b").text, "b");
  const stop_update last = checker.append(plain, "c");
  EXPECT_EQ(last.text, "c");
  EXPECT_EQ(last.reason, finish_reason::length);
  EXPECT_FALSE(last.stop_string_index.has_value());
  EXPECT_FALSE(last.stop_token.has_value());
  EXPECT_TRUE(checker.finished());
  EXPECT_EQ(checker.append(plain, "d").text, "");  // finished: nothing more
}

TEST(StopCheckerTest, StopSplitAcrossDeltasNeverLeaks) {
  const run_result r = feed(with_stops({"###"}), {"Hello #", "#", "# world"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"Hello ", "", ""}));
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(r.reason, finish_reason::stop);
  EXPECT_EQ(r.stop_string_index, 0);
}

TEST(StopCheckerTest, HeldPrefixIsReleasedOnceItCannotBeAStop) {
  const sampling_params p = with_stops({"###"});
  stop_checker checker(p);
  EXPECT_EQ(checker.append(plain, "a ##").text, "a ");
  EXPECT_EQ(checker.num_held_bytes(), 2u);
  EXPECT_EQ(checker.append(plain, "!").text, "##!");
  EXPECT_EQ(checker.num_held_bytes(), 0u);
  EXPECT_EQ(checker.append(plain, "#").text, "");
  EXPECT_EQ(checker.flush(), "#");  // never completed: it is ordinary text
  EXPECT_TRUE(checker.finished());
}

TEST(StopCheckerTest, IncludeStopStringKeepsItAndCutsTheRest) {
  const run_result r = feed(with_stops({"###"}, true), {"Hello #", "#", "# world"});
  EXPECT_EQ(r.text, "Hello ###");
  // Nothing is held back: a prefix of the stop string is output either way.
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"Hello #", "#", "#"}));
  EXPECT_EQ(r.reason, finish_reason::stop);
}

TEST(StopCheckerTest, FirstCompletedStopWinsLongestOnTies) {
  // "b" completes before "abc" does.
  EXPECT_EQ(feed(with_stops({"abc", "b"}), {"xab", "c"}).text, "xa");
  EXPECT_EQ(feed(with_stops({"abc", "b"}), {"xabc"}).text, "xa");
  EXPECT_EQ(feed(with_stops({"abc", "b"}), {"xabc"}).stop_string_index, 1);
  // "ab" and "b" complete together: the longer one, so none of it leaks.
  const run_result tie = feed(with_stops({"b", "ab"}), {"xa", "b"});
  EXPECT_EQ(tie.text, "x");
  EXPECT_EQ(tie.stop_string_index, 1);
  const run_result tie_included = feed(with_stops({"b", "ab"}, true), {"xa", "b", "c"});
  EXPECT_EQ(tie_included.text, "xab");
  EXPECT_EQ(tie_included.stop_string_index, 1);
}

TEST(StopCheckerTest, OverlappingOccurrencesOfOneStop) {
  // "aab" inside "aaab": the first "aa" is not the start of the match.
  EXPECT_EQ(feed(with_stops({"aab"}), {"a", "a", "a", "b"}).text, "a");
  EXPECT_EQ(feed(with_stops({"aab"}), {"aaa", "b"}).text, "a");
}

TEST(StopCheckerTest, StopAtTheVeryStart) {
  const run_result r = feed(with_stops({"\n\n"}), {"\n\nHello"});
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.reason, finish_reason::stop);
  const run_result split = feed(with_stops({"\n\n"}), {"\n", "\n"});
  EXPECT_EQ(split.text, "");
  EXPECT_EQ(split.emitted, (std::vector<std::string>{"", ""}));
}

TEST(StopCheckerTest, MultiByteCharacters) {
  // "é!" (C3 A9 21) after "caf": the held "é" is a whole character.
  const run_result r = feed(with_stops({"\xC3\xA9!"}), {"caf\xC3\xA9", "!"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"caf", ""}));
  EXPECT_EQ(r.reason, finish_reason::stop);
  // "世界" split over two tokens after "你好".
  const run_result cjk = feed(with_stops({"\xE4\xB8\x96\xE7\x95\x8C"}),
                              {"\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96", "\xE7\x95\x8C\xE3\x80\x82"});
  EXPECT_EQ(cjk.text, "\xE4\xBD\xA0\xE5\xA5\xBD");
  // "é" not followed by "!": released whole.
  const run_result no_stop = feed(with_stops({"\xC3\xA9!"}), {"caf\xC3\xA9", "?"});
  EXPECT_EQ(no_stop.emitted, (std::vector<std::string>{"caf", "\xC3\xA9?"}));
}

TEST(StopCheckerTest, EosStopsAndItsTextIsDropped) {
  const std::vector<token_id> eos_ids = {eos};
  const sampling_params p = with_stops({"###"});
  stop_checker checker(p, eos_ids);
  EXPECT_EQ(checker.append(plain, "done #").text, "done ");
  const stop_update u = checker.append(eos, "</s>");
  EXPECT_EQ(u.text, "#");  // the held text was not a stop string after all
  EXPECT_EQ(u.reason, finish_reason::stop);
  EXPECT_EQ(u.stop_token, eos);
  EXPECT_FALSE(u.stop_string_index.has_value());

  sampling_params include = p;
  include.include_stop_str_in_output = true;
  stop_checker including(include, eos_ids);
  EXPECT_EQ(including.append(eos, "</s>").text, "</s>");
}

TEST(StopCheckerTest, IgnoreEosAndStopTokenIds) {
  const std::vector<token_id> eos_ids = {eos};
  sampling_params p = with_stops({});
  p.ignore_eos = true;
  p.stop_token_ids = {7};
  stop_checker checker(p, eos_ids);
  EXPECT_EQ(checker.append(eos, "</s>").reason, finish_reason::none);
  const stop_update u = checker.append(7, "<end>");
  EXPECT_EQ(u.reason, finish_reason::stop);
  EXPECT_EQ(u.stop_token, 7);
  EXPECT_EQ(u.text, "");
}

TEST(StopCheckerTest, MinTokensDefersEveryStop) {
  const std::vector<token_id> eos_ids = {eos};
  sampling_params p = with_stops({"##"});
  p.min_tokens = 3;
  stop_checker checker(p, eos_ids);
  EXPECT_EQ(checker.append(eos, "E").reason, finish_reason::none);        // 1st: EOS ignored
  EXPECT_EQ(checker.append(plain, "x##y#").reason, finish_reason::none);  // 2nd: stop ignored
  // 3rd token: the stop that started in the 2nd token's text completes now and counts.
  const stop_update u = checker.append(plain, "#z");
  EXPECT_EQ(u.reason, finish_reason::stop);
  EXPECT_EQ(u.stop_string_index, 0);
  EXPECT_EQ(u.text, "");
  EXPECT_EQ(checker.num_generated(), 3);
}

TEST(StopCheckerTest, StopBeatsLengthOnTheSameToken) {
  sampling_params p = with_stops({"END"});
  p.max_tokens = 2;
  const run_result r = feed(p, {"ab", "cEND"});
  EXPECT_EQ(r.reason, finish_reason::stop);
  EXPECT_EQ(r.text, "abc");
  const run_result length = feed(p, {"ab", "cEN"});
  EXPECT_EQ(length.reason, finish_reason::length);
  EXPECT_EQ(length.text, "abcEN");  // held text is released when the length limit ends it
}

// ---- randomized comparison with a whole-text oracle -------------------------------------------

struct oracle_result {
  std::string output;
  int32_t stop_index = -1;
};

// Cuts at the stop occurrence with the smallest end, the longest (lowest list index on equal
// length) on ties.
oracle_result oracle(const std::string& text, const std::vector<std::string>& stops, bool include) {
  for (size_t end = 1; end <= text.size(); ++end) {
    int32_t best = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      const std::string& s = stops[i];
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0 &&
          (best < 0 || s.size() > stops[static_cast<size_t>(best)].size())) {
        best = static_cast<int32_t>(i);
      }
    }
    if (best >= 0) {
      const size_t len = stops[static_cast<size_t>(best)].size();
      return {text.substr(0, include ? end : end - len), best};
    }
  }
  return {text, -1};
}

// The longest suffix of `text` that is a proper prefix of a stop.
size_t oracle_held(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t k = 1; k < s.size() && k <= text.size(); ++k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) best = std::max(best, k);
    }
  }
  return best;
}

TEST(StopCheckerTest, MatchesWholeTextOracleForRandomSplits) {
  std::mt19937 rng(2024);
  const std::string alphabet = "aab#\n";
  auto random_string = [&](size_t min_len, size_t max_len) {
    std::uniform_int_distribution<size_t> len(min_len, max_len);
    std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
    std::string s(len(rng), ' ');
    for (char& c : s) c = alphabet[pick(rng)];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const bool include = trial % 3 == 0;
    std::vector<std::string> stops;
    const int num_stops = 1 + trial % 3;
    for (int i = 0; i < num_stops; ++i) stops.push_back(random_string(1, 4));
    const std::string text = random_string(0, 30);
    const oracle_result expected = oracle(text, stops, include);

    std::vector<std::string> deltas;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::uniform_int_distribution<size_t>(0, 4)(rng);
      deltas.push_back(text.substr(at, len));
      at += len;
    }
    SCOPED_TRACE(testing::Message() << "trial " << trial << " text '" << text << "'");

    const sampling_params p = with_stops(stops, include);
    stop_checker checker(p);
    std::string streamed;
    std::string received;
    bool stopped = false;
    for (const std::string& d : deltas) {
      const stop_update u = checker.append(plain, d);
      streamed += u.text;
      received += d;
      // Never anything that the final output will not contain.
      ASSERT_EQ(expected.output.compare(0, streamed.size(), streamed), 0) << "leaked: " << streamed;
      if (u.reason != finish_reason::none) {
        ASSERT_EQ(u.reason, finish_reason::stop);
        ASSERT_EQ(u.stop_string_index, expected.stop_index);
        stopped = true;
        break;
      }
      // Nothing held back longer than needed.
      const size_t held = include ? 0 : oracle_held(received, stops);
      ASSERT_EQ(checker.num_held_bytes(), held);
      ASSERT_EQ(streamed.size() + held, received.size());
    }
    if (!stopped) {
      ASSERT_EQ(expected.stop_index, -1);
      streamed += checker.flush();
    }
    ASSERT_EQ(streamed, expected.output);
  }
}

}  // namespace
}  // namespace tessera
