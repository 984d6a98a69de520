#include "server/metrics.hpp"

#include <cstdio>
#include <string>

namespace tessera::server {

namespace {

// Request sizes in tokens: 1-2-5 steps up to a million (vLLM's request_*_tokens histograms use the same series).
std::vector<double> token_bounds() {
  std::vector<double> out;
  for (double decade = 1; decade <= 1e6; decade *= 10) {
    for (double step : {1.0, 2.0, 5.0}) out.push_back(step * decade);
  }
  return out;
}

// Request latencies and their phases, in seconds.
std::vector<double> seconds_bounds() {
  return {0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240};
}

double ratio(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

double usage(const pool_usage& u) { return ratio(u.num_used, u.num_total); }

// A family of one unlabelled sample.
void gauge(prometheus_text& out, const char* name, const char* help, double value) {
  out.family(name, metric_type::gauge, help);
  out.sample({}, value);
}

void counter(prometheus_text& out, const char* name, const char* help, double value) {
  out.family(name, metric_type::counter, help);
  out.sample({}, value);
}

void swapped_blocks(prometheus_text& out, const char* name, const engine_stats& e) {
  out.family(name, metric_type::counter, "KV blocks copied between the pools by swapping");
  out.sample({{"direction", "in"}}, double(e.num_blocks_swapped_in));
  out.sample({{"direction", "out"}}, double(e.num_blocks_swapped_out));
}

}  // namespace

void histogram::observe(double value) {
  std::lock_guard lock(mutex_);
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

uint64_t histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void histogram::write(prometheus_text& out, std::string_view name, std::string_view help) const {
  std::lock_guard lock(mutex_);
  out.family(name, metric_type::histogram, help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    char le[32];
    std::snprintf(le, sizeof le, "%g", bounds_[i]);
    const metric_label bucket{"le", le};
    out.sample_of("_bucket", {}, &bucket, double(cumulative));
  }
  cumulative += counts_.back();
  const metric_label inf{"le", "+Inf"};
  out.sample_of("_bucket", {}, &inf, double(cumulative));
  out.sample_of("_sum", {}, nullptr, sum_);
  out.sample_of("_count", {}, nullptr, double(count_));
}

server_metrics::server_metrics()
    : ttft_({0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}),
      e2e_(seconds_bounds()),
      queue_(seconds_bounds()),
      prefill_(seconds_bounds()),
      decode_(seconds_bounds()),
      prompt_tokens_(token_bounds()),
      generation_tokens_(token_bounds()) {}

std::string_view to_string(close_reason r) {
  switch (r) {
    case close_reason::write_timeout: return "write_timeout";
    case close_reason::read_timeout: return "read_timeout";
    case close_reason::pipeline_flood: return "pipeline_flood";
    case close_reason::ws_auth_timeout: return "ws_auth_timeout";
    case close_reason::ws_slow_reader: return "ws_slow_reader";
    case close_reason::internal_error: return "internal_error";
  }
  return "unknown";
}

void server_metrics::record_closed(close_reason reason) {
  const auto i = static_cast<size_t>(reason);
  if (i < closed_.size()) closed_[i].fetch_add(1, std::memory_order_relaxed);
}

void server_metrics::record_finish(finish_reason reason) {
  const auto i = static_cast<size_t>(reason);
  if (i < finished_.size()) finished_[i].fetch_add(1, std::memory_order_relaxed);
}

void server_metrics::record_rejected(int status) {
  (status == 429 ? rejected_429_ : rejected_503_).fetch_add(1, std::memory_order_relaxed);
}

void server_metrics::record_http(int status) {
  const int c = status / 100;
  if (c >= 1 && c <= 5) http_by_class_[static_cast<size_t>(c)].fetch_add(1, std::memory_order_relaxed);
}

void server_metrics::observe_finished(const finished_request& r) {
  e2e_.observe(r.e2e_seconds);
  if (r.queue_seconds >= 0) queue_.observe(r.queue_seconds);
  if (r.prefill_seconds >= 0) prefill_.observe(r.prefill_seconds);
  if (r.decode_seconds >= 0) decode_.observe(r.decode_seconds);
  prompt_tokens_.observe(r.prompt_tokens);
  generation_tokens_.observe(r.generation_tokens);
}

void server_metrics::write_finished(prometheus_text& out, const char* name) const {
  out.family(name, metric_type::counter, "Finished requests by finish reason");
  for (finish_reason r : {finish_reason::stop, finish_reason::length, finish_reason::abort, finish_reason::error}) {
    out.sample({{"finished_reason", to_string(r)}}, double(finished_[static_cast<size_t>(r)].load()));
  }
}

std::string server_metrics::render(const actors::engine_facade& engine, const std::string& model_name) const {
  const actors::facade_stats s = engine.stats();
  const actors::health_report h = engine.health();
  prometheus_text out;
  gauge(out, "tessera_healthy", "1 when the engine runtime is healthy", h.healthy ? 1 : 0);

  write_finished(out, "tessera_request_success_total");
  out.family("tessera_requests_rejected_total", metric_type::counter,
             "Requests refused before they reached the engine");
  out.sample({{"status", "429"}}, double(rejected_429_.load()));
  out.sample({{"status", "503"}}, double(rejected_503_.load()));
  out.family("tessera_http_responses_total", metric_type::counter, "HTTP responses by status class");
  for (int c = 1; c <= 5; ++c) {
    const std::string code = std::to_string(c) + "xx";
    out.sample({{"code", code}}, double(http_by_class_[static_cast<size_t>(c)].load()));
  }

  out.family("tessera_connections_open", metric_type::gauge, "Open client connections by protocol");
  out.sample({{"protocol", "http"}}, double(open_[static_cast<size_t>(connection_kind::http)].load()));
  out.sample({{"protocol", "websocket"}}, double(open_[static_cast<size_t>(connection_kind::websocket)].load()));
  out.family("tessera_connections_closed_total", metric_type::counter,
             "Connections the server closed itself, by reason");
  for (size_t i = 0; i < num_close_reasons; ++i) {
    out.sample({{"reason", to_string(static_cast<close_reason>(i))}}, double(closed_[i].load()));
  }
  counter(out, "tessera_server_exceptions_total", "Exceptions caught from I/O handlers (each closed its connection)",
          double(exceptions_.load()));

  gauge(out, "tessera_num_requests_running", "Sequences running in the engine", s.num_running);
  gauge(out, "tessera_num_requests_waiting", "Sequences waiting in the engine", s.num_waiting);
  gauge(out, "tessera_num_requests_swapped", "Sequences whose KV is in the host swap pool", s.num_swapped);
  gauge(out, "tessera_num_requests_queued", "Requests submitted but not yet admitted", s.num_queued);
  gauge(out, "tessera_num_streams_open", "Request streams whose final message has not been sent", s.num_open);

  out.family("tessera_kv_cache_info", metric_type::gauge, "The KV cache's element type and bytes per block (value 1)");
  const std::string block_bytes = std::to_string(engine.kv_block_bytes());
  out.sample(
      {{"dtype", engine.kv_cache_dtype().empty() ? "unknown" : engine.kv_cache_dtype()}, {"block_bytes", block_bytes}},
      1);
  // One family per quantity, each with a sample per pool (device, host swap).
  struct pool_gauge {
    const char* name;
    const char* help;
    double (*of)(const pool_usage&);
  };
  for (const pool_gauge& g : {
           pool_gauge{"tessera_kv_blocks_capacity", "KV blocks in the pool",
                      [](const pool_usage& u) { return double(u.num_total); }},
           pool_gauge{"tessera_kv_blocks_used", "KV blocks held by sequences",
                      [](const pool_usage& u) { return double(u.num_used); }},
           pool_gauge{"tessera_kv_blocks_free", "KV blocks free",
                      [](const pool_usage& u) { return double(u.num_free); }},
           pool_gauge{"tessera_kv_blocks_cached", "Free KV blocks that still hold a cached prefix",
                      [](const pool_usage& u) { return double(u.num_cached); }},
           pool_gauge{"tessera_kv_cache_usage_perc", "Used / capacity (0..1)", usage},
       }) {
    out.family(g.name, metric_type::gauge, g.help);
    out.sample({{"pool", "device"}}, g.of(s.device));
    out.sample({{"pool", "host"}}, g.of(s.host));
  }

  const engine_stats& e = s.engine;
  gauge(out, "tessera_prefix_cache_hit_rate", "Prompt tokens served by the prefix cache / prompt tokens",
        ratio(double(e.num_cached_prompt_tokens), double(e.num_cached_prompt_tokens) + double(e.num_prefill_tokens)));
  out.family("tessera_num_preemptions_total", metric_type::counter, "Preemptions by mode");
  out.sample({{"mode", "swap"}}, double(e.num_preemptions_swap));
  out.sample({{"mode", "recompute"}}, double(e.num_preemptions_recompute));
  swapped_blocks(out, "tessera_kv_blocks_swapped_total", e);
  counter(out, "tessera_kv_blocks_window_freed_total",
          "KV blocks freed early because no layer's sliding window reached them any more",
          double(e.num_window_freed_blocks));
  counter(out, "tessera_prompt_tokens_total", "Prompt tokens computed (prefill and recompute)",
          double(e.num_prefill_tokens));
  counter(out, "tessera_cached_prompt_tokens_total", "Prompt tokens served by the prefix cache",
          double(e.num_cached_prompt_tokens));
  counter(out, "tessera_generation_tokens_total", "Generated tokens", double(e.num_generated_tokens));
  counter(out, "tessera_engine_steps_total", "Engine steps", double(e.num_steps));
  counter(out, "tessera_failed_steps_total", "Engine steps whose execution failed", double(e.num_failed_steps));
  counter(out, "tessera_overlapped_steps_total",
          "Engine steps planned and queued while the previous one ran on the device (overlapped steps)",
          double(e.num_overlapped_steps));
  counter(out, "tessera_tokenizer_restarts_total", "Tokenizer actors that died and were replaced",
          double(s.num_tokenizer_restarts));
  // Constrained decoding: the masks are computed while the forward pass runs, so the wait stays ~0
  // unless the grammar workers fall behind (docs/structured_output.md).
  counter(out, "tessera_grammar_masks_total", "Grammar token masks computed (constrained sequences x steps)",
          double(e.num_token_masks));
  counter(out, "tessera_grammar_mask_wait_seconds_total",
          "Time steps waited for grammar masks after the forward pass (host sampling)", e.mask_wait_seconds);
  // Speculative decoding (docs/speculative.md), named as vLLM's spec_decode metrics.
  counter(out, "tessera_spec_decode_num_drafts_total", "Drafts verified (one per sequence and speculative step)",
          double(e.num_spec_verifications));
  counter(out, "tessera_spec_decode_num_draft_tokens_total", "Draft tokens verified by the target model",
          double(e.num_draft_tokens));
  counter(out, "tessera_spec_decode_num_accepted_tokens_total", "Draft tokens the target model accepted",
          double(e.num_accepted_draft_tokens));
  counter(out, "tessera_spec_decode_num_tree_branch_tokens_total",
          "Draft tokens accepted from a token tree's side branch (the next step computes them again)",
          double(e.num_tree_branch_tokens));
  gauge(out, "tessera_spec_decode_draft_acceptance_rate", "Accepted draft tokens / draft tokens (0 before any)",
        ratio(double(e.num_accepted_draft_tokens), double(e.num_draft_tokens)));
  gauge(out, "tessera_spec_decode_mean_accepted_length",
        "Tokens committed per verified draft: (accepted + drafts) / drafts (0 before any)",
        ratio(double(e.num_accepted_draft_tokens + e.num_spec_verifications), double(e.num_spec_verifications)));
  // The draft model's own KV pool (--speculative draft): separate from the target's tessera_kv_blocks_*.
  gauge(out, "tessera_spec_decode_draft_kv_blocks", "Blocks of the draft model's KV pool (0 without a draft model)",
        double(e.num_draft_kv_blocks));
  gauge(out, "tessera_spec_decode_draft_kv_blocks_used", "Draft model KV blocks holding sequences' draft state",
        double(e.num_draft_kv_blocks_used));
  counter(out, "tessera_requests_submitted_total", "Requests accepted by the runtime", double(s.num_submitted));
  // Stall-free batching (docs/engine.md#the-prefill-share): what the last step was allowed to prefill,
  // and how well the step cost model that sized it predicts the steps.
  gauge(out, "tessera_target_itl_seconds", "Step-time target of stall-free batching (--target-itl-ms; 0: off)",
        e.target_step_seconds);
  gauge(out, "tessera_step_prefill_budget_tokens",
        "Prefill tokens the last step was allowed: by the ITL target next to decodes, else what "
        "--max-num-batched-tokens left",
        e.prefill_budget_tokens);
  gauge(out, "tessera_step_time_predicted_seconds", "The step cost model's prediction of the last step's time",
        e.predicted_step_seconds);
  gauge(out, "tessera_step_time_measured_seconds", "The last step's measured time (plan to outputs)",
        e.measured_step_seconds);
  gauge(out, "tessera_step_time_prediction_error",
        "Recent mean of |predicted - measured| / measured step time (exponentially weighted, out of sample)",
        e.step_time_prediction_error);
  counter(out, "tessera_steps_prefill_limited_total", "Steps whose prefill the ITL target cut",
          double(e.num_steps_prefill_limited));
  out.family("tessera_step_cost_model_seconds", metric_type::gauge,
             "The step cost model's coefficients: seconds per step (base), per decode token, per prefill token, "
             "per million attended key positions");
  out.sample({{"term", "base"}}, e.step_cost.base);
  out.sample({{"term", "decode_token"}}, e.step_cost.decode_token);
  out.sample({{"term", "prefill_token"}}, e.step_cost.prefill_token);
  out.sample({{"term", "attention_mpos"}}, e.step_cost.attention_mpos);

  ttft_.write(out, "tessera_time_to_first_token_seconds", "Time to first token");
  itl_.write(out, "tessera_inter_token_latency_seconds", "Time between consecutive tokens of a choice");
  e2e_.write(out, "tessera_e2e_request_latency_seconds", "End-to-end request latency");
  render_vllm_names(out, s, model_name);
  return out.take();
}

// vLLM's metric names (V1, plus V0's swap gauges) under the `tessera:` prefix, each sample labelled
// with the served model's name as vLLM does, for dashboards and alerts written for vLLM.
void server_metrics::render_vllm_names(prometheus_text& out, const actors::facade_stats& s,
                                       const std::string& model_name) const {
  out.set_common_label("model_name", model_name);
  const engine_stats& e = s.engine;
  gauge(out, "tessera:num_requests_running", "Requests running in the engine", s.num_running);
  // vLLM's "waiting": accepted and not running, here the engine's waiting queue plus the requests
  // submitted and not yet admitted into it.
  gauge(out, "tessera:num_requests_waiting", "Requests waiting to run", double(s.num_waiting) + double(s.num_queued));
  gauge(out, "tessera:num_requests_swapped", "Requests whose KV is in the host swap pool", s.num_swapped);
  gauge(out, "tessera:kv_cache_usage_perc", "Device KV cache usage (0..1)", usage(s.device));
  gauge(out, "tessera:cpu_cache_usage_perc", "Host swap pool usage (0..1)", usage(s.host));
  counter(out, "tessera:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
          double(e.num_cached_prompt_tokens) + double(e.num_prefill_tokens));
  counter(out, "tessera:prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
          double(e.num_cached_prompt_tokens));
  counter(out, "tessera:num_preemptions_total", "Preemptions (swap and recompute)",
          double(e.num_preemptions_swap) + double(e.num_preemptions_recompute));
  counter(out, "tessera:prompt_tokens_total", "Prompt tokens computed (prefill and recompute)",
          double(e.num_prefill_tokens));
  counter(out, "tessera:generation_tokens_total", "Generated tokens", double(e.num_generated_tokens));
  write_finished(out, "tessera:request_success_total");
  swapped_blocks(out, "tessera:kv_blocks_swapped_total", e);
  ttft_.write(out, "tessera:time_to_first_token_seconds", "Time to first token");
  itl_.write(out, "tessera:inter_token_latency_seconds", "Time between consecutive tokens of a choice");
  e2e_.write(out, "tessera:e2e_request_latency_seconds", "End-to-end request latency");
  queue_.write(out, "tessera:request_queue_time_seconds", "Time from arrival to the first schedule");
  prefill_.write(out, "tessera:request_prefill_time_seconds", "Time from the first schedule to the first token");
  decode_.write(out, "tessera:request_decode_time_seconds", "Time from the first token to the last");
  prompt_tokens_.write(out, "tessera:request_prompt_tokens", "Prompt tokens per request");
  generation_tokens_.write(out, "tessera:request_generation_tokens", "Generated tokens per request (all choices)");
  out.set_common_label("", "");
}

}  // namespace tessera::server
