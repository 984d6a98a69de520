#include "gpu/sampling_batch.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace tessera::gpu {
namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

void sampling_batch::clear() {
  rows_.clear();
  ids_.clear();
  values_.clear();
  masks_.clear();
  mask_words_ = 0;
  max_top_ = 0;
}

void sampling_batch::add(const device_sampling& d, int32_t logits_row, int32_t pending_row) {
  if (d.counts_last_token && pending_row < 0)
    throw std::invalid_argument("sampling_batch: a request counting a pending token without its row");
  sampling_row r;
  r.pending_row = d.counts_last_token ? pending_row : -1;
  r.stream_key = d.stream_key;
  r.position = d.position;
  r.logits_row = logits_row;
  r.top_k = d.top_k;
  r.num_logprobs = d.num_logprobs;
  r.greedy = d.greedy ? 1 : 0;
  r.temperature = d.temperature;
  r.top_p = d.top_p;
  r.min_p = d.min_p;
  r.repetition_penalty = d.repetition_penalty;
  r.presence_penalty = d.presence_penalty;
  r.frequency_penalty = d.frequency_penalty;
  const auto mark = [this] { return static_cast<int32_t>(ids_.size()); };
  r.bias_begin = mark();
  for (const auto& [token, bias] : d.logit_bias) ids_.push_back(token), values_.push_back(bias);
  r.bias_count = mark() - r.bias_begin;
  r.mask_begin = mark();
  for (token_id t : d.masked) ids_.push_back(t), values_.push_back(0.0f);
  r.mask_count = mark() - r.mask_begin;
  r.rep_begin = mark();
  for (token_id t : d.penalized) ids_.push_back(t), values_.push_back(0.0f);
  r.rep_count = mark() - r.rep_begin;
  r.count_begin = mark();
  // The host multiplies by static_cast<float>(count): the same float.
  for (const auto& [token, count] : d.output_counts)
    ids_.push_back(token), values_.push_back(static_cast<float>(count));
  r.count_count = mark() - r.count_begin;
  if (!d.allowed_tokens.empty()) {
    r.mask_row = static_cast<int32_t>(masks_.size());
    masks_.push_back(d.allowed_tokens);
    mask_words_ = std::max(mask_words_, static_cast<int32_t>(d.allowed_tokens.size()));
  }
  max_top_ = std::max(max_top_, d.num_logprobs);
  rows_.push_back(r);
}

sampling_batch::layout sampling_batch::input_layout() const {
  layout l;
  l.rows = 0;
  l.ids = align16(rows_.size() * sizeof(sampling_row));
  l.values = l.ids + align16(ids_.size() * sizeof(int32_t));
  l.masks = l.values + align16(values_.size() * sizeof(float));
  l.end = l.masks + align16(masks_.size() * static_cast<size_t>(mask_words_) * sizeof(uint32_t));
  return l;
}

sampling_batch::out_layout sampling_batch::output_layout() const {
  const size_t n = rows_.size();
  const size_t top = n * static_cast<size_t>(max_top_);
  out_layout l;
  l.tokens = 0;
  l.logprobs = align16(n * sizeof(int32_t));
  l.top_ids = l.logprobs + align16(n * sizeof(float));
  l.top_logprobs = l.top_ids + align16(top * sizeof(int32_t));
  l.end = l.top_logprobs + align16(top * sizeof(float));
  return l;
}

size_t sampling_batch::input_bytes() const { return input_layout().end; }
size_t sampling_batch::output_bytes() const { return output_layout().end; }

void sampling_batch::pack_inputs(void* host, bool with_masks) const {
  const layout l = input_layout();
  auto* base = static_cast<char*>(host);
  std::memset(base, 0, l.masks);
  if (!rows_.empty()) std::memcpy(base + l.rows, rows_.data(), rows_.size() * sizeof(sampling_row));
  if (!ids_.empty()) std::memcpy(base + l.ids, ids_.data(), ids_.size() * sizeof(int32_t));
  if (!values_.empty()) std::memcpy(base + l.values, values_.data(), values_.size() * sizeof(float));
  if (with_masks) pack_masks(host);
}

void sampling_batch::pack_masks(void* host) const {
  const layout l = input_layout();
  auto* out = reinterpret_cast<uint32_t*>(static_cast<char*>(host) + l.masks);
  const auto words = static_cast<size_t>(mask_words_);
  for (size_t r = 0; r < masks_.size(); ++r) {
    // A row shorter than the widest is padded with zeros: tokens past its end are not allowed.
    std::memset(out + r * words, 0, words * sizeof(uint32_t));
    std::memcpy(out + r * words, masks_[r].data(), masks_[r].size() * sizeof(uint32_t));
  }
}

sampling_kernel_args sampling_batch::kernel_args(const void* device_inputs, void* device_outputs, const float* logits,
                                                 int32_t vocab, float* work, const int32_t* pending_tokens) const {
  const layout in = input_layout();
  const out_layout out = output_layout();
  const auto* src = static_cast<const char*>(device_inputs);
  auto* dst = static_cast<char*>(device_outputs);
  sampling_kernel_args a;
  a.logits = logits;
  a.vocab = vocab;
  a.work = work;
  a.rows = reinterpret_cast<const sampling_row*>(src + in.rows);
  a.num_rows = num_rows();
  a.ids = reinterpret_cast<const int32_t*>(src + in.ids);
  a.values = reinterpret_cast<const float*>(src + in.values);
  a.allowed = reinterpret_cast<const uint32_t*>(src + in.masks);
  a.mask_words = mask_words_;
  a.pending_tokens = pending_tokens;
  a.out_tokens = reinterpret_cast<int32_t*>(dst + out.tokens);
  a.out_logprobs = reinterpret_cast<float*>(dst + out.logprobs);
  a.max_top = max_top_;
  a.out_top_ids = reinterpret_cast<int32_t*>(dst + out.top_ids);
  a.out_top_logprobs = reinterpret_cast<float*>(dst + out.top_logprobs);
  return a;
}

std::vector<sampled_token> sampling_batch::unpack_outputs(const void* host) const {
  const out_layout l = output_layout();
  const auto* base = static_cast<const char*>(host);
  std::vector<sampled_token> out(rows_.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    sampled_token& s = out[i];
    std::memcpy(&s.token, base + l.tokens + i * sizeof(int32_t), sizeof(int32_t));
    const int32_t n = rows_[i].num_logprobs;
    if (n < 0) continue;
    std::memcpy(&s.logprob, base + l.logprobs + i * sizeof(float), sizeof(float));
    for (int32_t j = 0; j < n; ++j) {
      const size_t k = i * static_cast<size_t>(max_top_) + static_cast<size_t>(j);
      int32_t id = -1;
      float lp = 0.0f;
      std::memcpy(&id, base + l.top_ids + k * sizeof(int32_t), sizeof(int32_t));
      if (id < 0) break;
      std::memcpy(&lp, base + l.top_logprobs + k * sizeof(float), sizeof(float));
      s.top_logprobs.emplace_back(id, lp);
    }
  }
  return out;
}

}  // namespace tessera::gpu
