// The GPU sampler (see gpu/sampling.hpp). One CTA of kThreads threads per row; the row's processed
// logits, then weights, live in `work`. Element-wise passes stride over the row (coalesced); the two
// passes that need id order (the inverse CDF, the tie cut) give each thread a contiguous chunk and
// scan the chunk totals in one thread, so the prefix sums tile the row exactly.
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/sampling_math.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/launch.cuh"
#include "gpu/sampling.hpp"

namespace tessera::gpu {
namespace {

namespace sm = tessera::sampling_math;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kSearchWays = 16;  // thresholds tested per pass of the threshold search
constexpr unsigned kFullMask = 0xffffffffu;

// The penalty arithmetic must round like the host's separate float operations: no FMA contraction.
__device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__device__ __forceinline__ float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__device__ __forceinline__ float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

__device__ __forceinline__ uint32_t float_bits(float x) {
  uint32_t b = 0;
  memcpy(&b, &x, sizeof b);
  return b;
}
__device__ __forceinline__ float bits_float(uint32_t b) {
  float x = 0.0f;
  memcpy(&x, &b, sizeof x);
  return x;
}

// Doubles through two 32-bit shuffles.
__device__ __forceinline__ double shfl_xor_double(double v, int lane_mask) {
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof bits);
  auto lo = static_cast<int32_t>(static_cast<uint32_t>(bits));
  auto hi = static_cast<int32_t>(static_cast<uint32_t>(bits >> 32));
  lo = __shfl_xor_sync(kFullMask, lo, lane_mask);
  hi = __shfl_xor_sync(kFullMask, hi, lane_mask);
  bits = (static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) | static_cast<uint32_t>(lo);
  memcpy(&v, &bits, sizeof v);
  return v;
}

// Block-wide sums of N doubles, in place; every thread gets the totals. The reduction tree is fixed,
// so the result is the same on every run (IEEE addition is commutative, so the xor butterfly leaves
// the same bits in every lane).
template <int N>
__device__ void block_sum(double (&v)[N]) {
  __shared__ double partial[N][kWarps];
  __shared__ double total[N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    for (int off = 16; off > 0; off >>= 1) v[j] += shfl_xor_double(v[j], off);
  }
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) partial[j][warp] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    double s = 0.0;
    for (int w = 0; w < kWarps; ++w) s += partial[threadIdx.x][w];
    total[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = total[j];
  __syncthreads();  // the arrays are reused by the next call
}

__device__ float block_max(float v) {
  __shared__ float partial[kWarps];
  __shared__ float result;
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = partial[0];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, partial[w]);
    result = m;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();
  return r;
}

__device__ int32_t block_max_int(int32_t v) {
  __shared__ int32_t partial[kWarps];
  __shared__ int32_t result;
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, off));
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t m = partial[0];
    for (int w = 1; w < kWarps; ++w) m = max(m, partial[w]);
    result = m;
  }
  __syncthreads();
  const int32_t r = result;
  __syncthreads();
  return r;
}

// The sampler's total order: higher value first, lower id first on ties.
__device__ __forceinline__ bool ranks_before(float v, int32_t id, float best_v, int32_t best_id) {
  return v > best_v || (v == best_v && id < best_id);
}

struct ranked {
  float value;
  int32_t id;
};

// The best-ranked (value, id) over the block; (-inf, INT_MAX) when no thread has one.
__device__ ranked block_best(float v, int32_t id) {
  __shared__ float partial_v[kWarps];
  __shared__ int32_t partial_id[kWarps];
  __shared__ ranked result;
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, off);
    const int32_t oid = __shfl_xor_sync(kFullMask, id, off);
    if (ranks_before(ov, oid, v, id)) v = ov, id = oid;
  }
  if ((threadIdx.x & 31) == 0) partial_v[threadIdx.x >> 5] = v, partial_id[threadIdx.x >> 5] = id;
  __syncthreads();
  if (threadIdx.x == 0) {
    ranked b{partial_v[0], partial_id[0]};
    for (int w = 1; w < kWarps; ++w) {
      if (ranks_before(partial_v[w], partial_id[w], b.value, b.id)) b = {partial_v[w], partial_id[w]};
    }
    result = b;
  }
  __syncthreads();
  const ranked r = result;
  __syncthreads();
  return r;
}

// The lowest-id maximum of get(i) over [0, vocab): the host's argmax (all -inf: id 0).
template <class Get>
__device__ ranked row_argmax(int32_t vocab, Get get) {
  float best_v = -INFINITY;
  int32_t best_id = INT_MAX;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = get(i);
    if (ranks_before(v, i, best_v, best_id)) best_v = v, best_id = i;
  }
  return block_best(best_v, best_id);
}

// This thread's contiguous chunk [begin, end) of the row, for the passes that need id order.
struct chunk {
  int32_t begin, end;
};
__device__ __forceinline__ chunk my_chunk(int32_t vocab) {
  const int32_t size = (vocab + kThreads - 1) / kThreads;
  const int32_t begin = min(vocab, static_cast<int32_t>(threadIdx.x) * size);
  return {begin, min(vocab, begin + size)};
}

// The id of the n-th (0-based, in id order) entry for which pred(i, work[i]) holds; vocab when there
// are not that many.
template <class Pred>
__device__ int32_t nth_id(const float* work, int32_t vocab, int32_t n, Pred pred) {
  __shared__ int32_t before[kThreads];
  __shared__ int32_t result;
  const chunk c = my_chunk(vocab);
  int32_t count = 0;
  for (int32_t i = c.begin; i < c.end; ++i) count += pred(i, work[i]) ? 1 : 0;
  before[threadIdx.x] = count;
  if (threadIdx.x == 0) result = vocab;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int32_t x = before[t];
      before[t] = run;
      run += x;
    }
  }
  __syncthreads();
  const int32_t first = before[threadIdx.x];
  if (n >= first && n < first + count) {
    int32_t seen = first;
    for (int32_t i = c.begin; i < c.end; ++i) {
      if (!pred(i, work[i])) continue;
      if (seen == n) {
        result = i;
        break;
      }
      ++seen;
    }
  }
  __syncthreads();
  const int32_t r = result;
  __syncthreads();
  return r;
}

// The smallest key K in [lo, hi] with F(K) < target, where F(K) is the sum of `value` over the
// entries whose `key` exceeds K (non-increasing in K). pre: F(hi) < target and no key exceeds hi.
// Each pass evaluates F at kSearchWays evenly spaced thresholds t_j over the remaining range: an
// entry lands in bin c = #{j : t_j < key} (one division), and F(t_j) is the sum of the bins above j,
// so the range shrinks kSearchWays-fold per pass for the cost of one add per entry.
template <class Contrib>
__device__ uint32_t search_threshold(const float* work, int32_t vocab, uint32_t lo, uint32_t hi, double target,
                                     Contrib contrib) {
  while (lo < hi) {
    const uint32_t range = hi - lo;
    const uint32_t step = range / kSearchWays + (range % kSearchWays != 0 ? 1u : 0u);  // t_j = lo + j * step
    double bins[kSearchWays + 1];
#pragma unroll
    for (int c = 0; c <= kSearchWays; ++c) bins[c] = 0.0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      uint32_t key = 0;
      double value = 0.0;
      contrib(work[i], key, value);
      if (value == 0.0 || key <= lo) continue;  // key <= t_0: above no threshold
      const uint32_t d = min(key, hi) - lo;     // thresholds below key: j * step < d
      const uint32_t c = d / step + (d % step != 0 ? 1u : 0u);
      bins[c < kSearchWays ? c : kSearchWays] += value;
    }
    double above[kSearchWays];  // above[j] = F(t_j): the bins of entries with more than j thresholds below
    double run = 0.0;
#pragma unroll
    for (int j = kSearchWays - 1; j >= 0; --j) {
      run += bins[j + 1];
      above[j] = run;
    }
    block_sum(above);
    int j = 0;
    while (j < kSearchWays && !(above[j] < target)) ++j;
    // t_j = lo + j * step, clipped to hi (F(hi) < target, so a clipped threshold is never passed over).
    const auto threshold = [lo, hi, step](int jj) {
      const uint64_t x = lo + static_cast<uint64_t>(jj) * step;
      return x < hi ? static_cast<uint32_t>(x) : hi;
    };
    if (j == 0) {
      hi = lo;
    } else if (j == kSearchWays) {
      lo = threshold(kSearchWays - 1) + 1;
    } else {
      lo = threshold(j - 1) + 1;
      hi = threshold(j);
    }
  }
  return lo;
}

struct kth_key {
  uint32_t key;        // order_key of the k-th best finite logit
  int32_t keep_equal;  // how many entries with that key are among the k best (the lowest ids)
};

// The k-th best finite logit (k >= 1), by radix selection on order_key from the most significant byte
// down: one pass per byte with a 256-bucket count histogram in shared memory (integer atomics: exact
// and order-independent). Key 0 when there are at most k finite entries (every finite key exceeds it).
__device__ kth_key kth_largest_key(const float* work, int32_t vocab, int32_t k) {
  __shared__ int32_t histogram[256];
  __shared__ uint32_t shared_prefix;
  __shared__ int32_t shared_remaining;
  uint32_t prefix = 0, mask = 0;
  int32_t remaining = k;  // rank wanted among the entries that match prefix under mask
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) histogram[b] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = work[i];
      if (!(l > -INFINITY)) continue;
      const uint32_t key = sm::order_key(l);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t above = 0;
      int b = 255;
      while (b >= 0 && above + histogram[b] < remaining) above += histogram[b--];
      if (b < 0) {  // fewer than k entries: keep them all
        shared_prefix = 0;
        shared_remaining = -1;
      } else {
        shared_prefix = prefix | (static_cast<uint32_t>(b) << shift);
        shared_remaining = remaining - above;
      }
    }
    __syncthreads();
    remaining = shared_remaining;
    prefix = shared_prefix;
    __syncthreads();
    if (remaining < 0) return {0u, 0};
    mask |= 255u << shift;
  }
  return {prefix, remaining};
}

// Inverse CDF over the weights in id order with one uniform draw (the host's pick_weights). -1 when
// no weight is positive.
__device__ int32_t pick(const float* w, int32_t vocab, double uniform) {
  __shared__ double before[kThreads];
  __shared__ double total_mass;
  __shared__ int32_t picked;
  const chunk c = my_chunk(vocab);
  double mass = 0.0;
  for (int32_t i = c.begin; i < c.end; ++i) {
    const float x = w[i];
    if (x > 0.0f) mass += x;
  }
  before[threadIdx.x] = mass;
  if (threadIdx.x == 0) picked = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      const double x = before[t];
      before[t] = run;
      run += x;
    }
    total_mass = run;
  }
  __syncthreads();
  const double total = total_mass;
  if (!(total > 0.0)) return -1;
  const double target = uniform * total;
  const double first = before[threadIdx.x];
  const double next = threadIdx.x + 1 < kThreads ? before[threadIdx.x + 1] : total;
  if (first <= target && target < next) {  // exactly one chunk, and it has positive mass
    double cumulative = first;
    int32_t last = -1;
    for (int32_t i = c.begin; i < c.end; ++i) {
      const float x = w[i];
      if (x <= 0.0f) continue;
      cumulative += x;
      last = i;
      if (target < cumulative) break;
    }
    picked = last;
  }
  __syncthreads();
  const int32_t token = picked;
  if (token >= 0) return token;
  // Rounding left the target at the very end of the CDF: the last positive weight.
  int32_t last = -1;
  for (int32_t i = c.begin; i < c.end; ++i) {
    if (w[i] > 0.0f) last = i;
  }
  return block_max_int(last);
}

// Temperature, top-k, top-p, min-p and the draw over the processed logits in `work` (which ends up
// holding the final weights). -1 when nothing has positive mass.
__device__ int32_t sample_processed(const sampling_row& r, float* work, int32_t vocab) {
  __shared__ int32_t shared_keep_ties;
  const bool temper = r.temperature != 1.0f;
  float local_max = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    float l = work[i];
    if (temper) {
      l = fminf(l / r.temperature, FLT_MAX);
      work[i] = l;
    }
    local_max = fmaxf(local_max, l);
  }
  const float max_logit = block_max(local_max);  // also orders the writes above before the reads below
  if (!(max_logit > -INFINITY)) return -1;

  // Top-k over the logits: keys above key_k, and the first (top_k - above) entries equal to it.
  const bool use_k = r.top_k > 0 && r.top_k < vocab;
  uint32_t key_k = 0;
  int32_t cut_k = vocab;
  if (use_k) {
    const kth_key kth = kth_largest_key(work, vocab, r.top_k);
    key_k = kth.key;
    cut_k = nth_id(work, vocab, kth.keep_equal,
                   [key_k](int32_t, float l) { return l > -INFINITY && sm::order_key(l) == key_k; });
  }

  // Weights, exactly as the host computes them (engine/sampling_math.hpp); outside top-k: 0.
  double total[1] = {0.0};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float l = work[i];
    bool keep = true;
    if (use_k) {
      const uint32_t key = sm::order_key(l);
      keep = l > -INFINITY && (key > key_k || (key == key_k && i < cut_k));
    }
    const float w = keep ? sm::candidate_weight(l, max_logit) : 0.0f;
    work[i] = w;
    total[0] += w;
  }
  block_sum(total);

  // Top-p over the weights (ranked by weight, then id): an entry stays when the mass ranked above it
  // is below top_p * total. Non-negative floats order like their bits.
  const bool use_p = r.top_p < 1.0f;
  uint32_t key_p = 0;
  int32_t cut_p = vocab;
  if (use_p) {
    const double target = static_cast<double>(r.top_p) * total[0];
    key_p = search_threshold(work, vocab, 0u, float_bits(1.0f), target, [](float w, uint32_t& key, double& value) {
      key = float_bits(w);
      value = w;
    });
    double stats[2] = {0.0, 0.0};  // mass above key_p, entries equal to it
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float w = work[i];
      const uint32_t b = float_bits(w);
      stats[0] += b > key_p ? static_cast<double>(w) : 0.0;
      stats[1] += b == key_p ? 1.0 : 0.0;
    }
    block_sum(stats);
    if (threadIdx.x == 0) {
      const auto num_equal = static_cast<int32_t>(stats[1]);
      const float v = bits_float(key_p);
      int32_t kept = num_equal;
      if (v > 0.0f) {  // ties in id order, each kept while the mass ranked above it is below target
        double mass = stats[0];
        kept = 0;
        while (kept < num_equal && mass < target) {
          mass += v;
          ++kept;
        }
      }
      shared_keep_ties = kept;
    }
    __syncthreads();
    const int32_t kept = shared_keep_ties;
    cut_p = nth_id(work, vocab, kept, [key_p](int32_t, float w) { return float_bits(w) == key_p; });
  }

  // Top-p and min-p (p / p_max == w: the most likely entry has weight 1 and survives both).
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float w = work[i];
    bool keep = true;
    if (use_p) {
      const uint32_t b = float_bits(w);
      keep = b > key_p || (b == key_p && i < cut_p);
    }
    work[i] = keep && w >= r.min_p ? w : 0.0f;
  }
  __syncthreads();
  return pick(work, vocab, sm::uniform_draw(r.stream_key, r.position));
}

__global__ void __launch_bounds__(kThreads, 2) sample_kernel(sampling_kernel_args a) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const sampling_row r = a.rows[blockIdx.x];
  const int32_t vocab = a.vocab;
  const float* logits = a.logits + static_cast<int64_t>(r.logits_row) * vocab;
  float* work = a.work + static_cast<int64_t>(blockIdx.x) * vocab;
  const auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };
  // The row as the sampler sees it: sanitized, and -inf where the grammar's mask disallows the token
  // (before everything else, raw logprobs included, as the host does).
  const uint32_t* allowed = r.mask_row >= 0 ? a.allowed + static_cast<int64_t>(r.mask_row) * a.mask_words : nullptr;
  const int32_t mask_words = a.mask_words;
  const auto raw = [logits, allowed, mask_words](int32_t i) {
    if (allowed && (i / 32 >= mask_words || !((allowed[i / 32] >> (i % 32)) & 1u))) return -INFINITY;
    return sm::sanitize_logit(logits[i]);
  };

  // Overlapped steps: one more generated token, in neither list (sampling_row::pending_row). It is
  // penalised where the host, which has it in its lists, would: once by the repetition penalty, and
  // with its count one higher (one, if not listed) by presence/frequency. (pending is the same for
  // the whole CTA, so the barriers only its rows need stay out of the other rows' way.)
  const int32_t pending = r.pending_row >= 0 ? a.pending_tokens[r.pending_row] : -1;
  __shared__ int32_t pending_listed[2];  // in the repetition list, in the count list
  if (threadIdx.x == 0) pending_listed[0] = pending_listed[1] = 0;

  // The logit processors, in the host's order; a token may be in several lists, so each list is
  // finished (barrier) before the next starts. Within a list the ids are distinct.
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) work[i] = raw(i);
  __syncthreads();
  for (int32_t j = threadIdx.x; j < r.bias_count; j += kThreads) {
    const int32_t t = a.ids[r.bias_begin + j];
    if (in_vocab(t)) work[t] = add_rn(work[t], a.values[r.bias_begin + j]);
  }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < r.mask_count; j += kThreads) {
    const int32_t t = a.ids[r.mask_begin + j];
    if (in_vocab(t)) work[t] = -INFINITY;
  }
  __syncthreads();
  const auto repetition = [&](int32_t t) {
    const float l = work[t];
    work[t] = l > 0.0f ? fminf(l / r.repetition_penalty, FLT_MAX) : mul_rn(l, r.repetition_penalty);
  };
  for (int32_t j = threadIdx.x; j < r.rep_count; j += kThreads) {
    const int32_t t = a.ids[r.rep_begin + j];
    if (!in_vocab(t)) continue;
    if (t == pending) pending_listed[0] = 1;
    repetition(t);
  }
  __syncthreads();
  if (in_vocab(pending)) {
    if (threadIdx.x == 0 && r.repetition_penalty != 1.0f && !pending_listed[0]) repetition(pending);
    __syncthreads();
  }
  const auto presence_frequency = [&](int32_t t, float count) {
    const float penalty = add_rn(mul_rn(r.frequency_penalty, count), r.presence_penalty);
    work[t] = sub_rn(work[t], penalty);
  };
  for (int32_t j = threadIdx.x; j < r.count_count; j += kThreads) {
    const int32_t t = a.ids[r.count_begin + j];
    if (!in_vocab(t)) continue;
    float count = a.values[r.count_begin + j];
    if (t == pending) {
      pending_listed[1] = 1;
      count += 1.0f;  // a whole number below 2^24: exact, the host's float of the count
    }
    presence_frequency(t, count);
  }
  __syncthreads();
  if (in_vocab(pending)) {
    if (threadIdx.x == 0 && (r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f) && !pending_listed[1])
      presence_frequency(pending, 1.0f);
    __syncthreads();
  }

  int32_t token = -1;
  if (r.greedy) {
    const ranked best = row_argmax(vocab, [work](int32_t i) { return work[i]; });
    token = best.value > -INFINITY ? best.id : -1;
  } else {
    token = sample_processed(r, work, vocab);
  }
  // Everything masked: the raw argmax, as the host.
  if (token < 0) token = row_argmax(vocab, raw).id;
  if (threadIdx.x == 0) a.out_tokens[blockIdx.x] = token;

  if (r.num_logprobs < 0) return;
  // Raw logprobs: log_softmax of the sanitized logits as given.
  float local_max = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) local_max = fmaxf(local_max, raw(i));
  const float max_raw = block_max(local_max);
  double sum[1] = {0.0};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) sum[0] += expf(raw(i) - max_raw);
  block_sum(sum);
  const double log_normalizer = static_cast<double>(max_raw) + log(sum[0]);
  if (threadIdx.x == 0) {
    a.out_logprobs[blockIdx.x] = static_cast<float>(static_cast<double>(raw(token)) - log_normalizer);
  }
  const int32_t num_top = min(r.num_logprobs, a.max_top);
  int32_t* top_ids = a.out_top_ids + static_cast<int64_t>(blockIdx.x) * a.max_top;
  float* top_logprobs = a.out_top_logprobs + static_cast<int64_t>(blockIdx.x) * a.max_top;
  if (threadIdx.x == 0) {
    for (int32_t j = 0; j < a.max_top; ++j) top_ids[j] = -1;
  }
  // The n best finite entries by repeated argmax below the previous one (n <= 20 passes).
  float prev_v = INFINITY;
  int32_t prev_id = -1;
  for (int32_t j = 0; j < num_top; ++j) {
    const ranked best = row_argmax(vocab, [raw, prev_v, prev_id](int32_t i) {
      const float v = raw(i);
      return ranks_before(prev_v, prev_id, v, i) ? v : -INFINITY;
    });
    if (!(best.value > -INFINITY)) break;
    if (threadIdx.x == 0) {
      top_ids[j] = best.id;
      top_logprobs[j] = static_cast<float>(static_cast<double>(best.value) - log_normalizer);
    }
    prev_v = best.value;
    prev_id = best.id;
  }
}

}  // namespace

void sample_rows(const sampling_kernel_args& a, cudaStream_t stream) {
  if (a.num_rows == 0) return;
  TESSERA_LAUNCH_PDL(a.num_rows, kThreads, 0, stream, sample_kernel)(a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tessera::gpu
