// The OpenAI request-body parser (server/request_parser.hpp): the first input byte picks the parser,
// the rest is the body.
//
//   byte % 6 == 0: parse_generation_request(completion)   1: parse_generation_request(chat)
//                2: parse_tokenize_request                 3: parse_detokenize_request
//                4: parse_responses_request (/v1/responses, server/responses_request.hpp)
//                5: parse_embedding_request (/v1/embeddings)
//
// Oracles besides the sanitizers: only api_error escapes (its JSON envelope is then serialized), every
// token id that comes back is inside the vocabulary, and an accepted request's sampling parameters
// pass validate() against the same limits.
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "server/api_error.hpp"
#include "server/request_parser.hpp"
#include "server/responses_request.hpp"

namespace {

using namespace tessera;
using namespace tessera::server;

constexpr int32_t k_vocab = 49152;  // the default model's
constexpr int32_t k_hidden = 576;

void check_ids(const std::vector<token_id>& ids, const char* what) {
  for (token_id id : ids)
    fuzz::check(id >= 0 && id < k_vocab, std::string(what) + " holds an id outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body = fuzz::as_text(data + 1, size - 1);
  const request_limits limits;
  try {
    switch (data[0] % 6) {
      case 0:
      case 1: {
        const api_kind kind = data[0] % 6 == 0 ? api_kind::completion : api_kind::chat;
        const generation_request req = parse_generation_request(body, kind, k_vocab, limits);
        check_ids(req.prompt.ids, "prompt");
        check_ids(req.params.stop_token_ids, "stop_token_ids");
        for (const auto& [id, bias] : req.params.logit_bias) {
          fuzz::check(id >= 0 && id < k_vocab, "logit_bias holds an id outside the vocabulary");
          (void)bias;
        }
        fuzz::check(req.params.max_tokens >= 1 && req.params.max_tokens <= limits.max_tokens,
                    "max_tokens out of range");
        fuzz::check(kind == api_kind::chat ? req.prompt.type == actors::prompt_input::kind::chat
                                           : req.prompt.type != actors::prompt_input::kind::chat,
                    "prompt kind does not match the endpoint");
        req.params.validate(k_vocab, limits.sampling);  // an invalid_request here escapes: a finding
        break;
      }
      case 2: {
        const tokenize_request req = parse_tokenize_request(body);
        fuzz::check(req.is_chat == !req.messages.empty(), "a chat tokenize request without messages");
        break;
      }
      case 3: check_ids(parse_detokenize_request(body, k_vocab, limits), "tokens"); break;
      case 5: {
        // An accepted one is an embedding of one or more prompts, each inside the vocabulary, that
        // generates nothing.
        const generation_request req = parse_embedding_request(body, k_vocab, k_hidden, limits);
        fuzz::check(req.kind == api_kind::embedding && req.params.max_tokens == 1,
                    "an embedding request that generates");
        check_ids(req.prompt.ids, "input");
        for (const auto& more : req.more_prompts) check_ids(more.ids, "input");
        break;
      }
      default: {
        // An accepted one is a chat request over messages, its parameters valid as chat's.
        const responses_request req = parse_responses_request(body, k_vocab, limits);
        fuzz::check(req.chat.kind == api_kind::chat && req.chat.prompt.type == actors::prompt_input::kind::chat &&
                        !req.chat.prompt.messages.empty(),
                    "a responses request that is not a chat over messages");
        req.chat.params.validate(k_vocab, limits.sampling);
        break;
      }
    }
  } catch (const api_error& e) {
    fuzz::check(e.status >= 400 && e.status < 600, "api_error with a status that is not an error");
    (void)error_body(e);
  }
  return 0;
}
