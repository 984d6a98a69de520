#include "server/metrics.hpp"

#include <cstdio>

namespace tessera::server {

namespace {

void append_f(std::string& out, const char* fmt, auto... args) {
  char line[512];
  const int n = std::snprintf(line, sizeof line, fmt, args...);
  if (n > 0) out.append(line, std::min<size_t>(static_cast<size_t>(n), sizeof line - 1));
}

void metric(std::string& out, const char* name, const char* type, const char* help) {
  append_f(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
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

void histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  metric(out, name.c_str(), "histogram", help.c_str());
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    append_f(out, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), bounds_[i], static_cast<unsigned long long>(cumulative));
  }
  cumulative += counts_.back();
  append_f(out, "%s_bucket{le=\"+Inf\"} %llu\n", name.c_str(), static_cast<unsigned long long>(cumulative));
  append_f(out, "%s_sum %.6f\n%s_count %llu\n", name.c_str(), sum_, name.c_str(), static_cast<unsigned long long>(count_));
}

server_metrics::server_metrics()
    : ttft_({0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240}) {}

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

std::string server_metrics::render(const actors::engine_facade& engine) const {
  const actors::facade_stats s = engine.stats();
  const actors::health_report h = engine.health();
  std::string out;
  out.reserve(8192);
  metric(out, "tessera_healthy", "gauge", "1 when the engine runtime is healthy");
  append_f(out, "tessera_healthy %d\n", h.healthy ? 1 : 0);

  metric(out, "tessera_request_success_total", "counter", "Finished requests by finish reason");
  for (finish_reason r : {finish_reason::stop, finish_reason::length, finish_reason::abort, finish_reason::error}) {
    append_f(out, "tessera_request_success_total{finished_reason=\"%s\"} %llu\n", std::string(to_string(r)).c_str(),
             static_cast<unsigned long long>(finished_[static_cast<size_t>(r)].load()));
  }
  metric(out, "tessera_requests_rejected_total", "counter", "Requests refused before they reached the engine");
  append_f(out, "tessera_requests_rejected_total{status=\"429\"} %llu\n", static_cast<unsigned long long>(rejected_429_.load()));
  append_f(out, "tessera_requests_rejected_total{status=\"503\"} %llu\n", static_cast<unsigned long long>(rejected_503_.load()));
  metric(out, "tessera_http_responses_total", "counter", "HTTP responses by status class");
  for (int c = 1; c <= 5; ++c) {
    append_f(out, "tessera_http_responses_total{code=\"%dxx\"} %llu\n", c,
             static_cast<unsigned long long>(http_by_class_[static_cast<size_t>(c)].load()));
  }

  metric(out, "tessera_connections_open", "gauge", "Open client connections by protocol");
  append_f(out, "tessera_connections_open{protocol=\"http\"} %lld\n",
           static_cast<long long>(open_[static_cast<size_t>(connection_kind::http)].load()));
  append_f(out, "tessera_connections_open{protocol=\"websocket\"} %lld\n",
           static_cast<long long>(open_[static_cast<size_t>(connection_kind::websocket)].load()));
  metric(out, "tessera_connections_closed_total", "counter", "Connections the server closed itself, by reason");
  for (size_t i = 0; i < num_close_reasons; ++i) {
    append_f(out, "tessera_connections_closed_total{reason=\"%s\"} %llu\n",
             std::string(to_string(static_cast<close_reason>(i))).c_str(), static_cast<unsigned long long>(closed_[i].load()));
  }
  metric(out, "tessera_server_exceptions_total", "counter", "Exceptions caught from I/O handlers (each closed its connection)");
  append_f(out, "tessera_server_exceptions_total %llu\n", static_cast<unsigned long long>(exceptions_.load()));

  metric(out, "tessera_num_requests_running", "gauge", "Sequences running in the engine");
  append_f(out, "tessera_num_requests_running %d\n", s.num_running);
  metric(out, "tessera_num_requests_waiting", "gauge", "Sequences waiting in the engine");
  append_f(out, "tessera_num_requests_waiting %d\n", s.num_waiting);
  metric(out, "tessera_num_requests_swapped", "gauge", "Sequences whose KV is in the host swap pool");
  append_f(out, "tessera_num_requests_swapped %d\n", s.num_swapped);
  metric(out, "tessera_num_requests_queued", "gauge", "Requests submitted but not yet admitted");
  append_f(out, "tessera_num_requests_queued %d\n", s.num_queued);
  metric(out, "tessera_num_streams_open", "gauge", "Request streams whose final message has not been sent");
  append_f(out, "tessera_num_streams_open %d\n", s.num_open);

  auto pool = [&](const char* name, const pool_usage& u) {
    append_f(out, "tessera_kv_blocks_total{pool=\"%s\"} %d\n", name, u.num_total);
    append_f(out, "tessera_kv_blocks_used{pool=\"%s\"} %d\n", name, u.num_used);
    append_f(out, "tessera_kv_blocks_free{pool=\"%s\"} %d\n", name, u.num_free);
    append_f(out, "tessera_kv_blocks_cached{pool=\"%s\"} %d\n", name, u.num_cached);
    append_f(out, "tessera_kv_cache_usage_perc{pool=\"%s\"} %.6f\n", name,
             u.num_total > 0 ? double(u.num_used) / u.num_total : 0.0);
  };
  metric(out, "tessera_kv_cache_info", "gauge", "The KV cache's element type and bytes per block (value 1)");
  append_f(out, "tessera_kv_cache_info{dtype=\"%s\",block_bytes=\"%lld\"} 1\n",
           engine.kv_cache_dtype().empty() ? "unknown" : engine.kv_cache_dtype().c_str(),
           static_cast<long long>(engine.kv_block_bytes()));
  metric(out, "tessera_kv_blocks", "gauge", "KV blocks per pool (device, host swap): total, used, free, cached");
  pool("device", s.device);
  pool("host", s.host);

  const engine_stats& e = s.engine;
  const double lookups = double(e.num_cached_prompt_tokens) + double(e.num_prefill_tokens);
  metric(out, "tessera_prefix_cache_hit_rate", "gauge", "Prompt tokens served by the prefix cache / prompt tokens");
  append_f(out, "tessera_prefix_cache_hit_rate %.6f\n", lookups > 0 ? double(e.num_cached_prompt_tokens) / lookups : 0.0);
  metric(out, "tessera_num_preemptions_total", "counter", "Preemptions by mode");
  append_f(out, "tessera_num_preemptions_total{mode=\"swap\"} %llu\n", static_cast<unsigned long long>(e.num_preemptions_swap));
  append_f(out, "tessera_num_preemptions_total{mode=\"recompute\"} %llu\n",
           static_cast<unsigned long long>(e.num_preemptions_recompute));
  metric(out, "tessera_kv_blocks_swapped_total", "counter", "KV blocks copied between the pools by swapping");
  append_f(out, "tessera_kv_blocks_swapped_total{direction=\"in\"} %llu\n", static_cast<unsigned long long>(e.num_blocks_swapped_in));
  append_f(out, "tessera_kv_blocks_swapped_total{direction=\"out\"} %llu\n",
           static_cast<unsigned long long>(e.num_blocks_swapped_out));
  metric(out, "tessera_kv_blocks_window_freed_total", "counter",
         "KV blocks freed early because no layer's sliding window reached them any more");
  append_f(out, "tessera_kv_blocks_window_freed_total %llu\n", static_cast<unsigned long long>(e.num_window_freed_blocks));
  metric(out, "tessera_prompt_tokens_total", "counter", "Prompt tokens computed (prefill and recompute)");
  append_f(out, "tessera_prompt_tokens_total %llu\n", static_cast<unsigned long long>(e.num_prefill_tokens));
  metric(out, "tessera_cached_prompt_tokens_total", "counter", "Prompt tokens served by the prefix cache");
  append_f(out, "tessera_cached_prompt_tokens_total %llu\n", static_cast<unsigned long long>(e.num_cached_prompt_tokens));
  metric(out, "tessera_generation_tokens_total", "counter", "Generated tokens");
  append_f(out, "tessera_generation_tokens_total %llu\n", static_cast<unsigned long long>(e.num_generated_tokens));
  metric(out, "tessera_engine_steps_total", "counter", "Engine steps");
  append_f(out, "tessera_engine_steps_total %llu\n", static_cast<unsigned long long>(e.num_steps));
  metric(out, "tessera_failed_steps_total", "counter", "Engine steps whose execution failed");
  append_f(out, "tessera_failed_steps_total %llu\n", static_cast<unsigned long long>(e.num_failed_steps));
  metric(out, "tessera_tokenizer_restarts_total", "counter", "Tokenizer actors that died and were replaced");
  append_f(out, "tessera_tokenizer_restarts_total %llu\n", static_cast<unsigned long long>(s.num_tokenizer_restarts));
  // Constrained decoding: the masks are computed while the forward pass runs, so the wait stays ~0
  // unless the grammar workers fall behind (docs/structured_output.md).
  metric(out, "tessera_grammar_masks_total", "counter", "Grammar token masks computed (constrained sequences x steps)");
  append_f(out, "tessera_grammar_masks_total %llu\n", static_cast<unsigned long long>(e.num_token_masks));
  metric(out, "tessera_grammar_mask_wait_seconds_total", "counter",
         "Time steps waited for grammar masks after the forward pass (host sampling)");
  append_f(out, "tessera_grammar_mask_wait_seconds_total %.6f\n", e.mask_wait_seconds);
  // Speculative decoding (docs/speculative.md), named as vLLM's spec_decode metrics.
  metric(out, "tessera_spec_decode_num_drafts_total", "counter", "Drafts verified (one per sequence and speculative step)");
  append_f(out, "tessera_spec_decode_num_drafts_total %llu\n", static_cast<unsigned long long>(e.num_spec_verifications));
  metric(out, "tessera_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified by the target model");
  append_f(out, "tessera_spec_decode_num_draft_tokens_total %llu\n", static_cast<unsigned long long>(e.num_draft_tokens));
  metric(out, "tessera_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens the target model accepted");
  append_f(out, "tessera_spec_decode_num_accepted_tokens_total %llu\n",
           static_cast<unsigned long long>(e.num_accepted_draft_tokens));
  metric(out, "tessera_spec_decode_draft_acceptance_rate", "gauge", "Accepted draft tokens / draft tokens (0 before any)");
  append_f(out, "tessera_spec_decode_draft_acceptance_rate %.6f\n",
           e.num_draft_tokens > 0 ? double(e.num_accepted_draft_tokens) / double(e.num_draft_tokens) : 0.0);
  metric(out, "tessera_spec_decode_mean_accepted_length", "gauge",
         "Tokens committed per verified draft: (accepted + drafts) / drafts (0 before any)");
  append_f(out, "tessera_spec_decode_mean_accepted_length %.6f\n",
           e.num_spec_verifications > 0
               ? double(e.num_accepted_draft_tokens + e.num_spec_verifications) / double(e.num_spec_verifications)
               : 0.0);
  metric(out, "tessera_requests_submitted_total", "counter", "Requests accepted by the runtime");
  append_f(out, "tessera_requests_submitted_total %llu\n", static_cast<unsigned long long>(s.num_submitted));

  ttft_.write(out, "tessera_time_to_first_token_seconds", "Time to first token");
  itl_.write(out, "tessera_inter_token_latency_seconds", "Time between consecutive tokens of a choice");
  e2e_.write(out, "tessera_e2e_request_latency_seconds", "End-to-end request latency");
  return out;
}

}  // namespace tessera::server
