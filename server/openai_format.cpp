#include "server/openai_format.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace tessera::server {

namespace json = boost::json;

json::value finish_reason_json(finish_reason reason) {
  if (reason == finish_reason::none) return nullptr;
  return json::string(to_string(reason));
}

json::value choice_finish_json(finish_reason reason, bool made_calls) {
  if (made_calls && reason == finish_reason::stop) return json::string("tool_calls");
  return finish_reason_json(reason);
}

json::array tool_calls_json(const std::vector<parsed_tool_call>& calls, int32_t first_index) {
  json::array out;
  for (size_t k = 0; k < calls.size(); ++k) {
    json::object c;
    if (first_index >= 0) c["index"] = first_index + static_cast<int64_t>(k);
    c["id"] = calls[k].id;
    c["type"] = "function";
    c["function"] =
        json::object{{"name", sanitize_utf8(calls[k].name)}, {"arguments", sanitize_utf8(calls[k].arguments)}};
    out.push_back(std::move(c));
  }
  return out;
}

request_phases phases_of(const actors::stream_final& f) {
  request_phases p;
  if (!f.choices.empty()) {
    const auto& tl = f.choices.front().timeline;
    auto at = [&](lifecycle_stage stage) {
      auto it = std::find_if(tl.begin(), tl.end(), [&](const lifecycle_entry& e) { return e.stage == stage; });
      return it == tl.end() ? std::optional<engine_clock::time_point>() : std::optional(it->at);
    };
    const auto queued = at(lifecycle_stage::queued), scheduled = at(lifecycle_stage::scheduled),
               first = at(lifecycle_stage::first_token);
    if (queued && scheduled) p.queue_seconds = std::chrono::duration<double>(*scheduled - *queued).count();
    if (scheduled && first) p.prefill_seconds = std::chrono::duration<double>(*first - *scheduled).count();
    for (const auto& c : f.choices) {
      for (const auto& e : c.timeline) {
        if (e.stage == lifecycle_stage::preempted_recompute || e.stage == lifecycle_stage::swapped_out)
          ++p.num_preemptions;
        if (e.stage == lifecycle_stage::swapped_out) ++p.num_swaps;
      }
    }
  }
  if (f.seconds_to_first_token >= 0) p.decode_seconds = f.seconds_total - f.seconds_to_first_token;
  return p;
}

json::object timings_json(const actors::stream_final& f) {
  json::object t;
  const request_phases p = phases_of(f);
  const double decode_seconds = std::max(p.decode_seconds, 0.0);
  const int32_t per_choice = f.choices.empty() ? f.num_generated_tokens : f.choices.front().num_generated_tokens;
  t["queue_seconds"] = p.queue_seconds;
  t["prefill_seconds"] = p.prefill_seconds;
  t["first_token_seconds"] = f.seconds_to_first_token;
  t["total_seconds"] = f.seconds_total;
  t["decode_tokens_per_second"] = per_choice > 1 && decode_seconds > 0 ? (per_choice - 1) / decode_seconds : 0.0;
  t["num_preemptions"] = p.num_preemptions;
  t["num_swaps"] = p.num_swaps;
  t["num_cached_prompt_tokens"] = f.num_cached_prompt_tokens;
  t["num_draft_tokens"] = f.num_draft_tokens;
  t["num_accepted_draft_tokens"] = f.num_accepted_draft_tokens;
  return t;
}

std::string refusal_code(std::string_view param) {
  if (param == "max_tokens") return "context_length_exceeded";
  if (param == "truncate_prompt_tokens") return "invalid_value";
  return "invalid_structured_output";
}

json::object usage_json(const actors::stream_final& f) {
  json::object u{{"prompt_tokens", f.num_prompt_tokens},
                 {"completion_tokens", f.num_generated_tokens},
                 {"total_tokens", f.num_prompt_tokens + f.num_generated_tokens},
                 {"prompt_tokens_details", json::object{{"cached_tokens", f.num_cached_prompt_tokens}}}};
  // Speculative decoding (docs/speculative.md): draft tokens the target verified and accepted for this
  // request, all choices; absent when none was verified (off, or the request did not speculate).
  if (f.num_draft_tokens > 0)
    u["speculative"] = json::object{{"proposed", f.num_draft_tokens}, {"accepted", f.num_accepted_draft_tokens}};
  return u;
}

namespace {

std::string piece(const tokenizer* tok, token_id id) {
  if (!tok || id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) return "token_id:" + std::to_string(id);
  const token_id one[1] = {id};
  return tok->decode(one);
}

json::array bytes_json(const std::string& raw) {
  json::array b;
  for (unsigned char c : raw) b.push_back(c);
  return b;
}

json::value logprob_value(float lp) { return std::isfinite(lp) ? json::value(lp) : json::value(-9999.0); }

}  // namespace

json::value logprobs_json(api_kind kind, const std::vector<token_logprob>& lps, const tokenizer* tok,
                          size_t text_offset) {
  if (kind != api_kind::chat) return completion_logprobs_json({}, lps, -1, tok, text_offset);
  json::array content;
  for (const auto& lp : lps) {
    const std::string raw = piece(tok, lp.token);
    json::array top;
    for (const auto& [id, l] : lp.top) {
      const std::string r = piece(tok, id);
      top.push_back(json::object{{"token", sanitize_utf8(r)}, {"logprob", logprob_value(l)}, {"bytes", bytes_json(r)}});
    }
    content.push_back(json::object{{"token", sanitize_utf8(raw)},
                                   {"logprob", logprob_value(lp.logprob)},
                                   {"bytes", bytes_json(raw)},
                                   {"top_logprobs", std::move(top)}});
  }
  return json::object{{"content", std::move(content)}};
}

json::value completion_logprobs_json(std::span<const prompt_logprob> prompt, const std::vector<token_logprob>& lps,
                                     int32_t top_k, const tokenizer* tok, size_t& text_offset) {
  json::array tokens, token_logprobs, top_logprobs, offsets;
  // One entry: the token's text, its logprob and its top alternatives plus itself (OpenAI: "up to
  // logprobs + 1" of them), or nulls (the prompt's first token).
  auto add = [&](token_id token, const float* logprob, std::span<const std::pair<token_id, float>> top) {
    const std::string text = sanitize_utf8(piece(tok, token));
    tokens.push_back(json::string(text));
    if (logprob) {
      token_logprobs.push_back(logprob_value(*logprob));
      json::object alternatives;
      for (const auto& [id, l] : top) alternatives[sanitize_utf8(piece(tok, id))] = logprob_value(l);
      if (!alternatives.contains(text)) alternatives[text] = logprob_value(*logprob);
      top_logprobs.push_back(std::move(alternatives));
    } else {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
    }
    offsets.push_back(text_offset);
    text_offset += text.size();
  };
  for (const prompt_logprob& p : prompt) {
    const auto n = std::min(p.top.size(), static_cast<size_t>(std::max(top_k, 0)));
    add(p.token, p.has_logprob() ? &p.logprob : nullptr, std::span(p.top).first(n));
  }
  for (const auto& lp : lps) add(lp.token, &lp.logprob, lp.top);
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top_logprobs)},
                      {"text_offset", std::move(offsets)}};
}

json::value prompt_logprobs_json(std::span<const prompt_logprob> prompt, int32_t top_k, const tokenizer* tok) {
  json::array out;
  for (const prompt_logprob& p : prompt) {
    if (!p.has_logprob()) {
      out.push_back(nullptr);
      continue;
    }
    // The prompt token first with its rank, then the top tokens ranked 1, 2, ... (one entry per id).
    json::object position;
    auto entry = [&](token_id id, float logprob, int32_t rank) {
      const std::string key = std::to_string(id);
      if (position.contains(key)) return;
      position[key] = json::object{
          {"logprob", logprob_value(logprob)}, {"rank", rank}, {"decoded_token", sanitize_utf8(piece(tok, id))}};
    };
    entry(p.token, p.logprob, p.rank);
    const auto n = std::min(p.top.size(), static_cast<size_t>(std::max(top_k, 0)));
    for (size_t k = 0; k < n; ++k) entry(p.top[k].first, p.top[k].second, static_cast<int32_t>(k + 1));
    out.push_back(std::move(position));
  }
  return out;
}

json::object response_envelope(const generation_request& req, const response_meta& meta, bool chunk) {
  const char* object =
      req.kind == api_kind::chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json::object{{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

std::string full_response(const generation_request& req, const response_meta& meta,
                          const std::vector<choice_accumulator>& choices, const actors::stream_final& final,
                          const tokenizer* tok) {
  json::object body = response_envelope(req, meta, false);
  json::array out;
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    finish_reason reason = final.reason == finish_reason::abort ? finish_reason::abort : finish_reason::none;
    for (const auto& r : final.choices) {
      if (r.index == static_cast<int32_t>(i)) reason = r.reason;
    }
    json::object choice{{"index", i}};
    if (req.kind == api_kind::chat && c.parsed) {
      // OpenAI's shape: content null when the turn is only calls; tool_calls only when there are calls.
      json::object message{{"role", "assistant"}};
      message["content"] =
          c.calls.empty() || !c.content.empty() ? json::value(sanitize_utf8(c.content)) : json::value(nullptr);
      message["reasoning_content"] =
          c.reasoning.empty() ? json::value(nullptr) : json::value(sanitize_utf8(c.reasoning));
      if (!c.calls.empty()) message["tool_calls"] = tool_calls_json(c.calls);
      choice["message"] = std::move(message);
    } else if (req.kind == api_kind::chat) {
      choice["message"] = json::object{{"role", "assistant"}, {"content", sanitize_utf8(c.text)}};
    } else {
      choice["text"] = sanitize_utf8(c.text);
    }
    if (!req.want_logprobs) {
      choice["logprobs"] = nullptr;
    } else if (req.kind == api_kind::chat) {
      choice["logprobs"] = logprobs_json(req.kind, c.logprobs, tok, 0);
    } else {
      // Echo: the prompt's tokens first (the text begins with the prompt too).
      size_t offset = 0;
      choice["logprobs"] =
          completion_logprobs_json(req.echo_logprobs ? std::span(c.prompt_logprobs) : std::span<const prompt_logprob>(),
                                   c.logprobs, req.top_logprobs, tok, offset);
    }
    choice["finish_reason"] = choice_finish_json(reason, !c.calls.empty());
    // vLLM's prompt_logprobs: per choice in completions, once per response in chat (below).
    if (req.prompt_logprobs >= 0 && req.kind != api_kind::chat)
      choice["prompt_logprobs"] = prompt_logprobs_json(c.prompt_logprobs, req.prompt_logprobs, tok);
    out.push_back(std::move(choice));
  }
  if (req.prompt_logprobs >= 0 && req.kind == api_kind::chat) {
    body["prompt_logprobs"] = prompt_logprobs_json(
        choices.empty() ? std::span<const prompt_logprob>() : std::span(choices.front().prompt_logprobs),
        req.prompt_logprobs, tok);
  }
  body["choices"] = std::move(out);
  body["usage"] = usage_json(final);
  body["timings"] = timings_json(final);
  return json::serialize(body);
}

namespace {

// The vector as the openai SDK decodes encoding_format "base64": its float32 values' little-endian
// bytes (numpy.frombuffer(base64.b64decode(s), dtype="float32")), standard alphabet, padded.
std::string base64_float32(const std::vector<float>& v) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  bytes.reserve(v.size() * 4);
  for (float f : v) {
    const auto u = std::bit_cast<uint32_t>(f);
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t j = 0; j < 3; ++j) chunk = (chunk << 8) | (j < n ? static_cast<unsigned char>(bytes[i + j]) : 0u);
    for (size_t j = 0; j < 4; ++j) out += j <= n ? alphabet[(chunk >> (18 - 6 * j)) & 0x3f] : '=';
  }
  return out;
}

}  // namespace

std::string embeddings_response(const generation_request& req, const response_meta& meta,
                                const actors::stream_final& final) {
  std::vector<const actors::choice_result*> ordered;
  for (const auto& c : final.choices) ordered.push_back(&c);
  std::sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) { return a->index < b->index; });
  json::array data;
  for (const actors::choice_result* c : ordered) {
    json::object item{{"object", "embedding"}, {"index", c->index}};
    if (req.embedding_base64) {
      item["embedding"] = base64_float32(c->embedding);
    } else {
      json::array values;
      values.reserve(c->embedding.size());
      for (float x : c->embedding) values.push_back(static_cast<double>(x));
      item["embedding"] = std::move(values);
    }
    data.push_back(std::move(item));
  }
  json::object body{
      {"id", meta.id}, {"object", "list"}, {"created", meta.created}, {"model", meta.model}, {"data", std::move(data)}};
  body["usage"] = json::object{{"prompt_tokens", final.num_prompt_tokens}, {"total_tokens", final.num_prompt_tokens}};
  return json::serialize(body);
}

}  // namespace tessera::server
