#include "engine/sampler.hpp"

#include "engine/sampling_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {
namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();
constexpr float max_float = std::numeric_limits<float>::max();

using sampling_math::candidate_weight;
using sampling_math::order_key;
using sampling_math::sanitize_logit;

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
}

// NaN (a broken executor row) must not reach the comparisons below, whose sort algorithms need a
// strict weak order; +inf would turn the softmax into NaN (engine/sampling_math.hpp).
float sanitize(float x) { return sanitize_logit(x); }

struct candidate {
  float score;  // a logit, later an unnormalized probability (monotone in the logit)
  token_id id;
};

// Total order: higher score first, lower id first on ties. Makes every selection reproducible.
bool ranks_before(const candidate& a, const candidate& b) {
  return a.score > b.score || (a.score == b.score && a.id < b.id);
}

// Lowest id among the maxima, ignoring NaN; 0 when nothing is above -inf.
token_id argmax(std::span<const float> logits) {
  token_id best = 0;
  float best_value = neg_inf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (v > best_value) {
      best_value = v;
      best = static_cast<token_id>(i);
    }
  }
  return best;
}

// The `count` best-ranked finite entries of `logits`, in no particular order, via a bounded heap:
// after the first few, most entries are rejected by one comparison, so small top-k costs one pass.
void select_top(std::span<const float> logits, size_t count, std::vector<candidate>& out) {
  out.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    const candidate c{logits[i], static_cast<token_id>(i)};
    if (!(c.score > neg_inf)) continue;  // also skips NaN
    if (out.size() < count) {
      out.push_back(c);
      std::push_heap(out.begin(), out.end(), ranks_before);  // front: the worst kept
    } else if (ranks_before(c, out.front())) {
      std::pop_heap(out.begin(), out.end(), ranks_before);
      out.back() = c;
      std::push_heap(out.begin(), out.end(), ranks_before);
    }
  }
}

// The `count` best-ranked finite entries of `logits` for large counts, by one round of radix
// selection: a histogram over the top 12 bits of order_key finds the bucket holding the count-th
// best; entries above it are taken as they come and only that bucket goes through nth_element.
void select_top_radix(std::span<const float> logits, size_t count, std::vector<candidate>& out) {
  constexpr int shift = 20;
  constexpr size_t num_buckets = size_t{1} << (32 - shift);
  thread_local std::vector<uint32_t> tls_histogram;
  std::vector<uint32_t>& histogram = tls_histogram;
  histogram.assign(num_buckets, 0);
  for (float x : logits) {
    if (x > neg_inf) ++histogram[order_key(x) >> shift];
  }
  size_t above = 0;
  size_t boundary = 0;
  for (size_t b = num_buckets; b-- > 0;) {
    if (above + histogram[b] >= count) {
      boundary = b;
      break;
    }
    above += histogram[b];
  }
  out.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > neg_inf && (order_key(logits[i]) >> shift) > boundary) {
      out.push_back({logits[i], static_cast<token_id>(i)});
    }
  }
  const size_t sure = out.size();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > neg_inf && (order_key(logits[i]) >> shift) == boundary) {
      out.push_back({logits[i], static_cast<token_id>(i)});
    }
  }
  if (out.size() > count) {
    std::nth_element(out.begin() + static_cast<ptrdiff_t>(sure), out.begin() + static_cast<ptrdiff_t>(count), out.end(),
                     ranks_before);
    out.resize(count);
  }
}

// Top-p needs the weights in rank order only near the cut. For non-negative floats the bit pattern
// orders like the value, so its top bits name buckets that are ordered by weight: 16 per octave
// (weights within ~4.4% of each other share one), 2033 for the range (0, 1] of the weights.
constexpr int weight_bucket_shift = 19;
constexpr size_t num_weight_buckets = (0x3F800000u >> weight_bucket_shift) + 1;  // 1.0f's bucket + 1

size_t weight_bucket(float w) {
  uint32_t bits = 0;
  static_assert(sizeof bits == sizeof w);
  std::memcpy(&bits, &w, sizeof bits);
  return std::min<size_t>(bits >> weight_bucket_shift, num_weight_buckets - 1);
}

// Keeps the smallest set of most likely candidates whose mass reaches top_p of the total: a
// candidate stays when the mass of the candidates ranked above it is below top_p (vLLM's rule,
// which always keeps the top one). `bucket_mass` is the weights' mass per weight_bucket.
//
// Candidates in buckets above the one where the cumulative mass (from the top) first reaches the
// target are all kept and those below it all dropped, without sorting; only the boundary bucket is
// resolved exactly, by bisecting on rank with nth_element (expected linear in its size). Leaves the
// kept candidates first, in a deterministic order.
void apply_top_p(std::vector<candidate>& cands, const std::vector<double>& bucket_mass, double target) {
  double above = 0.0;  // mass of the buckets above `boundary`
  size_t boundary = num_weight_buckets;
  for (size_t b = num_weight_buckets; b-- > 0;) {
    if (above + bucket_mass[b] >= target) {
      boundary = b;
      break;
    }
    above += bucket_mass[b];
  }
  if (boundary == num_weight_buckets) return;  // rounding: the whole mass is just short: keep all

  const auto sure_end = std::partition(cands.begin(), cands.end(),
                                       [boundary](const candidate& c) { return weight_bucket(c.score) > boundary; });
  const auto boundary_end = std::partition(
      sure_end, cands.end(), [boundary](const candidate& c) { return weight_bucket(c.score) == boundary; });
  cands.erase(boundary_end, cands.end());

  double remaining = target - above;  // target minus the mass ranked above position lo
  size_t lo = static_cast<size_t>(sure_end - cands.begin());
  size_t hi = cands.size();  // invariant: the mass ranked above hi reaches the target
  constexpr size_t small_range = 64;
  while (hi - lo > small_range) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(cands.begin() + static_cast<ptrdiff_t>(lo), cands.begin() + static_cast<ptrdiff_t>(mid),
                     cands.begin() + static_cast<ptrdiff_t>(hi), ranks_before);
    double mass = 0.0;
    for (size_t j = lo; j < mid; ++j) mass += cands[j].score;
    if (mass >= remaining) {
      hi = mid;
    } else {
      remaining -= mass;
      lo = mid;
    }
  }
  std::sort(cands.begin() + static_cast<ptrdiff_t>(lo), cands.begin() + static_cast<ptrdiff_t>(hi), ranks_before);
  double within = 0.0;
  for (size_t j = lo; j < hi; ++j) {
    if (within >= remaining) {
      cands.resize(j);
      return;
    }
    within += cands[j].score;
  }
  cands.resize(hi);
}

// Inverse-CDF sampling with one uniform draw over `count` (id, weight) entries given in increasing id
// order, and their total (summed in any order: only rounding depends on it). Returns -1 when no weight
// is positive.
template <class Entry>  // entry(i) -> std::pair<token_id, float>
token_id walk_cdf(size_t count, Entry entry, double total, double uniform) {
  if (!(total > 0.0)) return -1;
  const double target = uniform * total;
  double cumulative = 0.0;
  token_id last_positive = -1;
  for (size_t i = 0; i < count; ++i) {
    const auto [id, weight] = entry(i);
    if (weight <= 0.0f) continue;
    cumulative += weight;
    last_positive = id;
    if (target < cumulative) return id;
  }
  return last_positive;  // rounding left target at the very end of the CDF
}

// walk_cdf() over weights indexed by token id.
token_id pick_weights(std::span<const float> weights, double total, double uniform) {
  return walk_cdf(
      weights.size(),
      [&](size_t i) {
        return std::pair{static_cast<token_id>(i), weights[i]};
      },
      total, uniform);
}

// walk_cdf() over a candidate list: the CDF runs in token id order whatever order truncation left the
// candidates in, so the draw does not depend on the selection algorithm (and the GPU sampler,
// gpu/sampling.cu, walks the same order). Small lists are sorted by id; large ones are scattered into
// a vocabulary-sized row (no sort).
token_id pick(std::vector<candidate>& cands, size_t vocab, double uniform) {
  double total = 0.0;
  for (const candidate& c : cands) total += c.score;
  constexpr size_t sort_limit = 2048;
  if (cands.size() > sort_limit) {
    thread_local std::vector<float> tls_row;
    std::vector<float>& row = tls_row;
    row.assign(vocab, 0.0f);
    for (const candidate& c : cands) row[static_cast<size_t>(c.id)] = c.score;
    return pick_weights(row, total, uniform);
  }
  std::sort(cands.begin(), cands.end(), [](const candidate& a, const candidate& b) { return a.id < b.id; });
  return walk_cdf(
      cands.size(),
      [&](size_t i) {
        return std::pair{cands[i].id, cands[i].score};
      },
      total, uniform);
}

// Without top-k/top-p (min-p at most): the processed logits in `work` become their weights, in place,
// in id order, no candidate list. Returns their total (0: every logit is -inf).
double whole_vocabulary_weights(std::span<float> work, float min_p) {
  float max_logit = neg_inf;
  for (float l : work) max_logit = l > max_logit ? l : max_logit;
  if (max_logit == neg_inf) return 0.0;
  double total = 0.0;
  for (float& l : work) {
    const float w = candidate_weight(l, max_logit);  // -inf: 0; the top token: exactly 1
    l = w >= min_p ? w : 0.0f;                       // min-p (p / p_max == w); NaN: 0
    total += l;
  }
  return total;
}

// Top-k, then top-p on the top-k distribution, then min-p, over the processed logits in `work`: the
// surviving candidates with their weights in `cands` (empty: every logit is -inf).
void truncated_candidates(std::span<const float> work, const sampling_params& params, std::vector<candidate>& cands) {
  const size_t vocab = work.size();
  const auto top_k = static_cast<size_t>(std::max(params.top_k, 0));
  if (top_k > 0 && top_k <= 256) {
    select_top(work, top_k, cands);
  } else if (top_k > 0 && top_k < vocab) {
    select_top_radix(work, top_k, cands);
  } else {
    cands.clear();
    for (size_t i = 0; i < vocab; ++i) {
      if (work[i] > neg_inf) cands.push_back({work[i], static_cast<token_id>(i)});
    }
  }
  if (cands.empty()) return;

  float max_logit = neg_inf;
  for (const candidate& c : cands) max_logit = std::max(max_logit, c.score);
  const bool nucleus = params.top_p < 1.0f;
  thread_local std::vector<double> tls_bucket_mass;
  std::vector<double>& bucket_mass = tls_bucket_mass;
  if (nucleus) bucket_mass.assign(num_weight_buckets, 0.0);
  double total = 0.0;
  for (candidate& c : cands) {
    c.score = candidate_weight(c.score, max_logit);  // the top candidate's weight is exactly 1
    total += c.score;
    if (nucleus) bucket_mass[weight_bucket(c.score)] += c.score;
  }
  if (nucleus) apply_top_p(cands, bucket_mass, static_cast<double>(params.top_p) * total);
  if (params.min_p > 0.0f) {
    // p_i < min_p * p_max  <=>  w_i < min_p, since the most likely token has weight 1 and survives
    // top-k and top-p.
    std::erase_if(cands, [&](const candidate& c) { return c.score < params.min_p; });
  }
}

bool truncates(const sampling_params& params, size_t vocab) {
  return (params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab) || params.top_p < 1.0f;
}

// Entry i of masked_row().
float masked_logit(std::span<const float> logits, std::span<const uint32_t> allowed, size_t i) {
  return !allowed.empty() && !((allowed[i / 32] >> (i % 32)) & 1u) ? neg_inf : sanitize(logits[i]);
}

// The sanitized row with the grammar's disallowed tokens at -inf (`allowed`: a packed bitmask, empty
// for none), in a vocabulary-sized scratch row of this thread: the constrained model's distribution,
// which sampling and the reported logprobs start from.
std::vector<float>& masked_row(std::span<const float> logits, std::span<const uint32_t> allowed) {
  const size_t vocab = logits.size();
  if (vocab == 0) throw std::invalid_argument("sampler: empty logits row");
  if (!allowed.empty() && allowed.size() < (vocab + 31) / 32) {
    throw std::invalid_argument("sampler: the allowed-token mask is shorter than the vocabulary");
  }
  thread_local std::vector<float> tls_work;
  std::vector<float>& work = tls_work;
  work.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) work[i] = masked_logit(logits, allowed, i);
  return work;
}

}  // namespace

token_id draw_from(std::span<const float> probs, double uniform) {
  double total = 0.0;
  for (float p : probs) total += p;
  return pick_weights(probs, total, uniform);
}

bool processed_distribution(std::span<const float> processed, const sampling_params& params,
                            std::vector<float>& probs) {
  const size_t vocab = processed.size();
  probs.assign(vocab, 0.0f);
  if (params.greedy()) {
    const token_id t = argmax(processed);
    if (!(processed[static_cast<size_t>(t)] > neg_inf)) return false;
    probs[static_cast<size_t>(t)] = 1.0f;
    return true;
  }
  double total = 0.0;
  if (truncates(params, vocab)) {
    thread_local std::vector<candidate> tls_cands;
    std::vector<candidate>& cands = tls_cands;
    truncated_candidates(processed, params, cands);
    for (const candidate& c : cands) total += probs[static_cast<size_t>(c.id)] = c.score;
  } else {
    std::copy(processed.begin(), processed.end(), probs.begin());
    total = whole_vocabulary_weights(probs, params.min_p);
  }
  if (!(total > 0.0)) return false;
  for (float& p : probs) p = static_cast<float>(p / total);
  return true;
}

namespace {}  // namespace

uint64_t sampler::derive_stream_key(uint64_t seed, uint64_t fork_index) {
  return sampling_math::derive_stream_key(seed, fork_index);
}

double sampler::uniform_draw(uint64_t key, uint64_t position) { return sampling_math::uniform_draw(key, position); }

sampler::sampler(const sampling_params& params, uint64_t fork_index, std::span<const token_id> prompt,
                 std::span<const token_id> eos_token_ids)
    : params_(params), stream_key_(derive_stream_key(params.seed ? *params.seed : random_seed(), fork_index)) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_unique_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_unique_.begin(), prompt_unique_.end());
    prompt_unique_.erase(std::unique(prompt_unique_.begin(), prompt_unique_.end()), prompt_unique_.end());
  }
  if (params_.min_tokens > 0) {
    min_tokens_mask_ = params_.stop_token_ids;
    if (!params_.ignore_eos) {
      min_tokens_mask_.insert(min_tokens_mask_.end(), eos_token_ids.begin(), eos_token_ids.end());
    }
  }
}

void sampler::process_logits(std::span<float> logits) const {
  const auto vocab = static_cast<token_id>(logits.size());
  const auto in_vocab = [vocab](token_id t) { return t >= 0 && t < vocab; };

  for (const auto& [token, bias] : params_.logit_bias) {
    if (in_vocab(token)) logits[static_cast<size_t>(token)] += bias;
  }

  if (num_generated_ < params_.min_tokens) {
    for (token_id token : min_tokens_mask_) {
      if (in_vocab(token)) logits[static_cast<size_t>(token)] = neg_inf;
    }
  }

  // Repetition penalty (Keskar et al. 2019, CTRL, eq. in sec. 4.1 as implemented by HF/vLLM): once
  // per distinct token seen in the prompt or the output.
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    const auto penalize = [&](token_id token) {
      if (!in_vocab(token)) return;
      float& l = logits[static_cast<size_t>(token)];
      l = l > 0.0f ? std::min(l / rep, max_float) : l * rep;  // +inf would poison the softmax
    };
    for (token_id token : prompt_unique_) penalize(token);
    for (const auto& entry : output_counts_) {
      if (!std::binary_search(prompt_unique_.begin(), prompt_unique_.end(), entry.first)) { penalize(entry.first); }
    }
  }

  // OpenAI presence/frequency penalties, over generated tokens only.
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : output_counts_) {
      if (!in_vocab(token)) continue;
      logits[static_cast<size_t>(token)] -=
          params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    }
  }

  if (!params_.greedy() && params_.temperature != 1.0f) {
    for (float& l : logits) l = std::min(l / params_.temperature, max_float);
  }
}

raw_logprobs compute_raw_logprobs(std::span<const float> row, size_t top_k) {
  raw_logprobs out;
  float max_raw = neg_inf;
  for (float v : row) max_raw = std::max(max_raw, v);
  double sum = 0.0;
  for (float v : row) sum += std::exp(v - max_raw);
  out.log_normalizer = max_raw + std::log(sum);
  if (top_k > 0) {
    std::vector<candidate> top;
    select_top(row, top_k, top);
    std::sort(top.begin(), top.end(), ranks_before);
    out.top.reserve(top.size());
    for (const candidate& c : top) out.top.emplace_back(c.id, static_cast<float>(c.score - out.log_normalizer));
  }
  return out;
}

// Reports the raw distribution's top logprobs into `result` when the request asks for logprobs;
// returns its log normalizer (what a token's logprob is taken against).
double sampler::report_top_logprobs(std::span<const float> masked, sample_result& result) const {
  if (params_.logprobs < 0) return 0.0;
  raw_logprobs raw_lp = compute_raw_logprobs(masked, static_cast<size_t>(params_.logprobs));
  result.top_logprobs = std::move(raw_lp.top);
  return raw_lp.log_normalizer;
}

sample_result sampler::sample(std::span<const float> logits, std::span<const uint32_t> allowed) {
  std::vector<float>& work = masked_row(logits, allowed);
  const size_t vocab = work.size();
  // Reported logprobs come from the raw distribution, so take them before any processing.
  sample_result result;
  const double log_normalizer = report_top_logprobs(work, result);

  process_logits(work);

  if (params_.greedy()) {
    result.token = argmax(work);
    if (!(work[static_cast<size_t>(result.token)] > neg_inf)) result.token = -1;
  } else {
    const double uniform = uniform_draw(stream_key_, static_cast<uint64_t>(num_generated_));
    if (truncates(params_, vocab)) {
      thread_local std::vector<candidate> tls_cands;
      truncated_candidates(work, params_, tls_cands);
      result.token = tls_cands.empty() ? -1 : pick(tls_cands, vocab, uniform);
    } else {
      result.token = pick_weights(work, whole_vocabulary_weights(work, params_.min_p), uniform);
    }
  }
  // Everything was masked (e.g. min_tokens over a vocabulary of stop tokens): fall back to the raw
  // argmax (within the grammar's tokens) rather than fail the request.
  if (result.token < 0) result.token = argmax(masked_row(logits, allowed));
  if (params_.logprobs >= 0) {
    result.logprob =
        static_cast<float>(masked_logit(logits, allowed, static_cast<size_t>(result.token)) - log_normalizer);
  }
  record(result.token);
  return result;
}

void sampler::distribution(std::span<const float> logits, std::span<const uint32_t> allowed,
                           std::vector<float>& probs) const {
  std::vector<float>& work = masked_row(logits, allowed);
  process_logits(work);
  if (processed_distribution(work, params_, probs)) return;
  // sample()'s fallback when everything was masked: the raw argmax.
  probs.assign(logits.size(), 0.0f);
  probs[static_cast<size_t>(argmax(masked_row(logits, allowed)))] = 1.0f;
}

sample_result sampler::take(std::span<const float> logits, std::span<const uint32_t> allowed, token_id token) {
  const std::vector<float>& masked = masked_row(logits, allowed);
  if (token < 0 || static_cast<size_t>(token) >= masked.size())
    throw std::invalid_argument("sampler::take: token " + std::to_string(token) + " is outside the vocabulary");
  sample_result result;
  const double log_normalizer = report_top_logprobs(masked, result);
  result.token = token;
  if (params_.logprobs >= 0) result.logprob = static_cast<float>(masked[static_cast<size_t>(token)] - log_normalizer);
  record(token);
  return result;
}

void sampler::append_external_token(token_id token) { record(token); }

std::optional<device_sampling> sampler::device_request(int32_t ahead) const {
  // The penalties count the tokens before this one: `ahead` of them are not known here yet. One the
  // executor adds itself (device_sampling::counts_last_token); more, nobody.
  const bool penalties =
      params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (ahead > 1 && penalties) return std::nullopt;
  device_sampling d;
  d.counts_last_token = ahead == 1 && penalties;
  d.logit_bias = params_.logit_bias;
  std::vector<token_id> bias_ids;
  bias_ids.reserve(d.logit_bias.size());
  for (const auto& entry : d.logit_bias) bias_ids.push_back(entry.first);
  std::sort(bias_ids.begin(), bias_ids.end());
  if (std::adjacent_find(bias_ids.begin(), bias_ids.end()) != bias_ids.end()) return std::nullopt;
  d.greedy = params_.greedy();
  d.temperature = params_.temperature;
  d.top_p = params_.top_p;
  d.top_k = params_.top_k;
  d.min_p = params_.min_p;
  d.repetition_penalty = params_.repetition_penalty;
  d.presence_penalty = params_.presence_penalty;
  d.frequency_penalty = params_.frequency_penalty;
  d.num_logprobs = params_.logprobs;
  d.stream_key = stream_key_;
  d.position = static_cast<uint64_t>(num_generated_ + ahead);
  if (num_generated_ + ahead < params_.min_tokens) d.masked = min_tokens_mask_;
  if (params_.repetition_penalty != 1.0f) {
    d.penalized = prompt_unique_;
    for (const auto& entry : output_counts_) {
      if (!std::binary_search(prompt_unique_.begin(), prompt_unique_.end(), entry.first)) {
        d.penalized.push_back(entry.first);
      }
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    d.output_counts.assign(output_counts_.begin(), output_counts_.end());
  }
  return d;
}

void sampler::record(token_id token) {
  ++num_generated_;
  ++output_counts_[token];
}

}  // namespace tessera
