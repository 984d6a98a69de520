// Hand-written equivalents of llama.cpp's pre-tokenizer split expressions; see the header.
// Each matcher walks one segment [begin, end) of code points; positions outside the segment read as
// "no character" (flags 0), which is what makes \s+(?!\S) take a trailing whitespace run whole.
#include "engine/text/tokenizer_pretokenize.hpp"

#include <array>

#include "engine/text/unicode_tables.hpp"

namespace tessera::tokenizer_detail {
namespace {

namespace uf = unicode_flag;

uint16_t flags_of(uint32_t cpt) {
  // ASCII dominates real text: a small table avoids the binary search.
  static const std::array<uint16_t, 128> ascii = [] {
    std::array<uint16_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) t[c] = unicode_flags_lookup(c);
    return t;
  }();
  return cpt < 128 ? ascii[cpt] : unicode_flags_lookup(cpt);
}

// One segment being split: emits pieces as their end positions are found.
class segment_splitter {
 public:
  segment_splitter(std::span<const uint32_t> cpts, std::span<const uint16_t> flags, size_t begin, size_t end,
                   std::vector<uint32_t>& lengths)
      : cpts_(cpts), flags_(flags), begin_(begin), end_(end), prev_end_(begin), lengths_(lengths) {}

  static constexpr uint32_t k_none = 0xFFFFFFFF;

  uint32_t cpt(size_t pos) const { return pos >= begin_ && pos < end_ ? cpts_[pos] : k_none; }
  uint16_t flags(size_t pos) const { return pos >= begin_ && pos < end_ ? flags_[pos] : 0; }
  bool is(size_t pos, uint16_t flag) const { return (flags(pos) & flag) != 0; }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }

  // Ends the current piece at `pos` (an empty piece is dropped).
  void emit(size_t pos) {
    if (pos > prev_end_) lengths_.push_back(static_cast<uint32_t>(pos - prev_end_));
    prev_end_ = pos;
  }

  // 's|'t|'re|'ve|'m|'ll|'d at pos (case-insensitive when asked); returns the match length or 0.
  size_t contraction(size_t pos, bool ignore_case) const {
    if (cpt(pos) != '\'') return 0;
    auto lower = [&](uint32_t c) { return ignore_case && c >= 'A' && c <= 'Z' ? c + 32 : c; };
    const uint32_t c1 = lower(cpt(pos + 1));
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    const uint32_t c2 = lower(cpt(pos + 2));
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
  }

  size_t whitespace_run(size_t pos) const {
    size_t n = 0;
    while (is(pos + n, uf::whitespace)) ++n;
    return n;
  }

 private:
  std::span<const uint32_t> cpts_;
  std::span<const uint16_t> flags_;
  size_t begin_;
  size_t end_;
  size_t prev_end_;
  std::vector<uint32_t>& lengths_;
};

constexpr uint16_t k_word_class = uf::whitespace | uf::letter | uf::number;

// [^\s\p{L}\p{N}]: any real character (flags != 0) outside those classes.
bool is_other(uint16_t flags) { return flags != 0 && (flags & k_word_class) == 0; }

void split_gpt2(segment_splitter& s) {
  size_t pos = s.begin();
  while (pos < s.end()) {
    const uint32_t c = s.cpt(pos);
    if (const size_t n = s.contraction(pos, /*ignore_case=*/false)) {
      pos += n;
      s.emit(pos);
      continue;
    }
    // " ?X+" for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: the optional space belongs to the run after it.
    const size_t run = pos + (c == ' ' ? 1 : 0);
    const uint16_t f = s.flags(run);
    if (f & uf::letter) {
      pos = run;
      while (s.is(pos, uf::letter)) ++pos;
      s.emit(pos);
      continue;
    }
    if (f & uf::number) {
      pos = run;
      while (s.is(pos, uf::number)) ++pos;
      s.emit(pos);
      continue;
    }
    if (is_other(f)) {
      pos = run;
      while (is_other(s.flags(pos))) ++pos;
      s.emit(pos);
      continue;
    }
    const size_t num_ws = s.whitespace_run(pos);
    if (num_ws > 1 && pos + num_ws < s.end()) {
      pos += num_ws - 1;  // \s+(?!\S): leave the last blank to prefix the next word
    } else if (num_ws > 0) {
      pos += num_ws;  // \s+ (a single blank, or a run ending the segment)
    } else {
      ++pos;  // unreachable for real characters; kept so the loop always advances
    }
    s.emit(pos);
  }
}

void split_llama3(segment_splitter& s, size_t max_digits) {
  size_t pos = s.begin();
  while (pos < s.end()) {
    const uint32_t c = s.cpt(pos);
    const uint16_t f = s.flags(pos);
    if (const size_t n = s.contraction(pos, /*ignore_case=*/true)) {
      pos += n;
      s.emit(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(c == '\r' || c == '\n' || (f & uf::number)) && ((f & uf::letter) || s.is(pos + 1, uf::letter))) {
      ++pos;
      while (s.is(pos, uf::letter)) ++pos;
      s.emit(pos);
      continue;
    }
    // \p{N}{1,max_digits}
    if (f & uf::number) {
      size_t group_start = pos;
      while (s.is(pos, uf::number)) {
        if (++pos - group_start >= max_digits) {
          s.emit(pos);
          group_start = pos;
        }
      }
      s.emit(pos);
      continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    const uint16_t f2 = c == ' ' ? s.flags(pos + 1) : f;
    if ((f2 & k_word_class) == 0 && f != 0) {
      if (c == ' ') ++pos;
      while (is_other(s.flags(pos))) ++pos;
      while (s.cpt(pos) == '\r' || s.cpt(pos) == '\n') ++pos;
      s.emit(pos);
      continue;
    }
    size_t num_ws = 0;
    size_t last_newline_end = 0;
    while (s.is(pos + num_ws, uf::whitespace)) {
      const uint32_t w = s.cpt(pos + num_ws);
      if (w == '\r' || w == '\n') last_newline_end = pos + num_ws + 1;
      ++num_ws;
    }
    if (last_newline_end > 0) {
      pos = last_newline_end;  // \s*[\r\n]+
    } else if (num_ws > 1 && pos + num_ws < s.end()) {
      pos += num_ws - 1;  // \s+(?!\S)
    } else if (num_ws > 0) {
      pos += num_ws;  // \s+
    } else {
      ++pos;
    }
    s.emit(pos);
  }
}

}  // namespace

void pretokenize(pretokenizer_kind kind, std::span<const uint32_t> cpts, std::vector<uint32_t>& lengths) {
  std::vector<uint16_t> flags(cpts.size());
  for (size_t i = 0; i < cpts.size(); ++i) flags[i] = flags_of(cpts[i]);

  switch (kind) {
    case pretokenizer_kind::gpt2: {
      segment_splitter s(cpts, flags, 0, cpts.size(), lengths);
      split_gpt2(s);
      break;
    }
    case pretokenizer_kind::digits_then_gpt2: {
      // llama.cpp applies the expressions in sequence: \p{N} cuts the text into single digits and
      // the runs between them, and the GPT-2 expression then splits each run on its own.
      size_t pos = 0;
      while (pos < cpts.size()) {
        if (flags[pos] & uf::number) {
          lengths.push_back(1);
          ++pos;
          continue;
        }
        size_t end = pos;
        while (end < cpts.size() && !(flags[end] & uf::number)) ++end;
        segment_splitter s(cpts, flags, pos, end, lengths);
        split_gpt2(s);
        pos = end;
      }
      break;
    }
    case pretokenizer_kind::llama3:
    case pretokenizer_kind::qwen2: {
      segment_splitter s(cpts, flags, 0, cpts.size(), lengths);
      split_llama3(s, kind == pretokenizer_kind::llama3 ? 3 : 1);
      break;
    }
  }
}

}  // namespace tessera::tokenizer_detail
