#include "server/stream_format.hpp"

namespace tessera::server {

namespace json = boost::json;

bool stream_progress::take_delta(const actors::stream_delta& d, server_metrics& metrics) {
  const request_output& o = d.output;
  if (o.index < 0 || static_cast<size_t>(o.index) >= last_token_at_.size()) return false;
  if (o.token_ids.empty()) return true;
  num_tokens_ += static_cast<int64_t>(o.token_ids.size());
  if (!any_token_) {
    any_token_ = true;
    metrics.observe_ttft(d.seconds_since_submit);
  }
  double& prev = last_token_at_[static_cast<size_t>(o.index)];
  if (prev >= 0) metrics.observe_itl((d.seconds_since_submit - prev) / double(o.token_ids.size()));
  prev = d.seconds_since_submit;
  return true;
}

bool stream_progress::first_of_choice(int32_t index) {
  if (index < 0 || static_cast<size_t>(index) >= started_.size() || started_[static_cast<size_t>(index)]) return false;
  started_[static_cast<size_t>(index)] = true;
  return true;
}

bool stream_progress::first_of_stream() {
  if (any_started_) return false;
  any_started_ = true;
  return true;
}

void record_final(const actors::stream_final& f, server_metrics& metrics) {
  metrics.record_finish(f.reason);
  const request_phases p = phases_of(f);
  metrics.observe_finished({.e2e_seconds = f.seconds_total,
                            .queue_seconds = p.queue_seconds,
                            .prefill_seconds = p.prefill_seconds,
                            .decode_seconds = p.decode_seconds,
                            .prompt_tokens = f.num_prompt_tokens,
                            .generation_tokens = f.num_generated_tokens});
}

namespace {

// What a delta carries on either transport: its text and, when asked for, its tokens' logprobs.
json::string delta_text(const request_output& o) { return json::string(sanitize_utf8(o.text)); }

json::value delta_logprobs(api_kind kind, const request_output& o, const tokenizer* tok) {
  return logprobs_json(kind, o.logprobs, tok, 0);
}

}  // namespace

std::string delta_chunk(const generation_request& req, const response_meta& meta, const request_output& o,
                        bool first_of_choice, const tokenizer* tok, size_t* text_offset) {
  json::object body = response_envelope(req, meta, true);
  json::object choice{{"index", o.index}};
  if (req.kind == api_kind::chat) {
    json::object delta;
    if (first_of_choice) delta["role"] = "assistant";
    delta["content"] = delta_text(o);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = delta_text(o);
  }
  if (!req.want_logprobs) {
    choice["logprobs"] = nullptr;
  } else if (req.kind == api_kind::chat) {
    choice["logprobs"] = delta_logprobs(req.kind, o, tok);
  } else {
    // Completions: with echo the choice's first chunk leads with the prompt's entries (its text with the
    // prompt), and text_offset runs on over the whole choice.
    size_t local = 0;
    size_t& offset = text_offset ? *text_offset : local;
    choice["logprobs"] =
        completion_logprobs_json(req.echo_logprobs ? std::span(o.prompt_logprobs) : std::span<const prompt_logprob>(),
                                 o.logprobs, req.top_logprobs, tok, offset);
  }
  choice["finish_reason"] = nullptr;
  body["choices"] = json::array{std::move(choice)};
  if (req.include_usage) body["usage"] = nullptr;
  return json::serialize(body);
}

std::vector<std::string> parsed_delta_chunks(const generation_request& req, const response_meta& meta, int32_t index,
                                             const chat_piece& piece, bool first_of_choice, int32_t first_call_index,
                                             const std::vector<token_logprob>* logprobs, const tokenizer* tok) {
  std::vector<std::string> chunks;
  auto chunk = [&](json::object delta, json::value lp) {
    json::object body = response_envelope(req, meta, true);
    body["choices"] = json::array{json::object{
        {"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}};
    if (req.include_usage) body["usage"] = nullptr;
    chunks.push_back(json::serialize(body));
  };
  const bool with_logprobs = req.want_logprobs && logprobs && !logprobs->empty();
  if (!piece.reasoning.empty() || !piece.content.empty() || with_logprobs || (first_of_choice && piece.calls.empty())) {
    json::object delta;
    if (first_of_choice) delta["role"] = "assistant";
    if (!piece.reasoning.empty()) delta["reasoning_content"] = sanitize_utf8(piece.reasoning);
    if (!piece.content.empty() || piece.reasoning.empty()) delta["content"] = sanitize_utf8(piece.content);
    chunk(std::move(delta), with_logprobs ? logprobs_json(api_kind::chat, *logprobs, tok, 0) : json::value(nullptr));
    first_of_choice = false;
  }
  for (size_t k = 0; k < piece.calls.size(); ++k) {
    const parsed_tool_call& c = piece.calls[k];
    const int64_t call_index = first_call_index + static_cast<int64_t>(k);
    json::object header{{"role", "assistant"}, {"content", nullptr}};
    if (!first_of_choice) header = json::object{};
    header["tool_calls"] =
        json::array{json::object{{"index", call_index},
                                 {"id", c.id},
                                 {"type", "function"},
                                 {"function", json::object{{"name", sanitize_utf8(c.name)}, {"arguments", ""}}}}};
    chunk(std::move(header), nullptr);
    first_of_choice = false;
    json::object fragment{{"index", call_index}, {"function", json::object{{"arguments", sanitize_utf8(c.arguments)}}}};
    chunk(json::object{{"tool_calls", json::array{std::move(fragment)}}}, nullptr);
  }
  return chunks;
}

std::string finish_chunk(const generation_request& req, const response_meta& meta, int32_t index, finish_reason reason,
                         const json::object* timings, bool made_calls) {
  json::object body = response_envelope(req, meta, true);
  json::object choice{{"index", index}};
  if (req.kind == api_kind::chat)
    choice["delta"] = json::object{};
  else
    choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = choice_finish_json(reason, made_calls);
  body["choices"] = json::array{std::move(choice)};
  if (req.include_usage) body["usage"] = nullptr;
  if (timings) body["timings"] = *timings;
  return json::serialize(body);
}

std::string usage_chunk(const generation_request& req, const response_meta& meta, const actors::stream_final& final) {
  json::object body = response_envelope(req, meta, true);
  body["choices"] = json::array{};
  body["usage"] = usage_json(final);
  return json::serialize(body);
}

std::string ws_started_message(std::string_view id, std::string_view request_id) {
  return json::serialize(json::object{{"type", "started"}, {"id", id}, {"request_id", request_id}});
}

std::string ws_delta_message(std::string_view id, const actors::stream_delta& d, bool with_logprobs,
                             bool with_engine_id, const tokenizer* tok, const chat_piece* piece,
                             int32_t first_call_index) {
  const request_output& o = d.output;
  json::array ids;
  for (token_id t : o.token_ids) ids.push_back(t);
  json::object m{{"type", "delta"},
                 {"id", id},
                 {"index", o.index},
                 {"token_ids", std::move(ids)},
                 {"text", piece ? json::string(sanitize_utf8(piece->content)) : delta_text(o)},
                 {"t", d.seconds_since_submit}};
  if (piece && !piece->reasoning.empty()) m["reasoning_content"] = sanitize_utf8(piece->reasoning);
  if (piece && !piece->calls.empty()) m["tool_calls"] = tool_calls_json(piece->calls, first_call_index);
  // The chat shape whatever the endpoint: one schema for every /v1/ws client.
  if (with_logprobs) m["logprobs"] = delta_logprobs(api_kind::chat, o, tok);
  if (with_engine_id) m["engine_request_id"] = o.id.value();
  return json::serialize(m);
}

std::string ws_final_message(std::string_view id, const actors::stream_final& f,
                             const std::vector<int32_t>* calls_per_choice) {
  json::array choices;
  for (const auto& c : f.choices) {
    const bool made_calls = calls_per_choice && c.index >= 0 &&
                            static_cast<size_t>(c.index) < calls_per_choice->size() &&
                            (*calls_per_choice)[static_cast<size_t>(c.index)] > 0;
    choices.push_back(json::object{{"index", c.index},
                                   {"finish_reason", choice_finish_json(c.reason, made_calls)},
                                   {"num_generated_tokens", c.num_generated_tokens}});
  }
  json::object m{{"type", "final"},
                 {"id", id},
                 {"finish_reason", finish_reason_json(f.reason)},
                 {"choices", std::move(choices)},
                 {"usage", usage_json(f)},
                 {"timings", timings_json(f)}};
  if (f.request) m["engine_request_id"] = f.request.value();
  if (f.reason == finish_reason::error) m["error"] = f.error;
  return json::serialize(m);
}

std::string ws_error_message(const api_error& e, std::string_view id) {
  json::value body = json::parse(error_body(e));
  json::object out{{"type", "error"}, {"status", e.status}, {"error", body.at("error")}};
  if (!id.empty()) out["id"] = id;
  return json::serialize(out);
}

}  // namespace tessera::server
