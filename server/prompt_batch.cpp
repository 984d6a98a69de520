#include "server/prompt_batch.hpp"

#include <algorithm>

namespace tessera::server {

namespace {

int severity(finish_reason r) { return r == finish_reason::error ? 2 : r == finish_reason::abort ? 1 : 0; }

}  // namespace

actors::stream_final merged_final(const std::vector<actors::stream_final>& finals, int32_t n) {
  actors::stream_final out;
  if (finals.empty()) return out;
  out.ticket = finals.front().ticket;
  out.request = finals.front().request;
  out.reason = finals.front().reason;
  double first_token = -1;
  for (size_t p = 0; p < finals.size(); ++p) {
    const actors::stream_final& f = finals[p];
    if (severity(f.reason) > severity(out.reason) || (p == 0 && f.reason == finish_reason::error)) {
      out.reason = f.reason;
      if (f.reason == finish_reason::error) {
        out.error = finals.size() > 1 ? "prompt[" + std::to_string(p) + "]: " + f.error : f.error;
        out.error_param = f.error_param;
        out.runtime_fault = f.runtime_fault;
      }
    }
    for (actors::choice_result c : f.choices) {
      c.index = batch_choice_index(p, n, c.index);
      out.choices.push_back(std::move(c));
    }
    out.num_prompt_tokens += f.num_prompt_tokens;
    out.num_cached_prompt_tokens += f.num_cached_prompt_tokens;
    out.num_generated_tokens += f.num_generated_tokens;
    out.num_draft_tokens += f.num_draft_tokens;
    out.num_accepted_draft_tokens += f.num_accepted_draft_tokens;
    if (f.seconds_to_first_token >= 0 && (first_token < 0 || f.seconds_to_first_token < first_token))
      first_token = f.seconds_to_first_token;
    out.seconds_total = std::max(out.seconds_total, f.seconds_total);
  }
  out.seconds_to_first_token = first_token;
  return out;
}

std::string echo_text(const actors::prompt_input& prompt, const tokenizer* tok) {
  switch (prompt.type) {
    case actors::prompt_input::kind::text: return prompt.text;
    case actors::prompt_input::kind::token_ids: return tok ? tok->decode(prompt.ids) : std::string();
    case actors::prompt_input::kind::chat: break;
  }
  return {};
}

}  // namespace tessera::server
