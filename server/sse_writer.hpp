// The bytes of one streamed generation (Server-Sent Events): the response head before the first event,
// each event as "data: <json>\n\n" in an HTTP/1.1 chunk (HTTP/1.0 clients get the events unchunked, the
// connection's end ending the stream), and after the final message the finish chunks, usage, an error
// event if the engine failed, "data: [DONE]" and the last chunk.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/openai_format.hpp"
#include "server/request_parser.hpp"

namespace tessera::server {

class sse_writer {
 public:
  // cors_origin: an allowed cross-origin request's Origin, echoed in the head (server/cors.hpp); "" none.
  sse_writer(std::string request_id, bool chunked, bool keep_alive, std::string cors_origin = "")
      : request_id_(std::move(request_id)),
        cors_origin_(std::move(cors_origin)),
        chunked_(chunked),
        keep_alive_(keep_alive) {}

  bool headers_sent() const { return headers_sent_; }

  // Appends one event carrying `json` (after the response head if it was not sent yet).
  void event(std::string_view json, std::string& out);
  // The same with an "event: NAME" line first (the Responses API's typed events).
  void named_event(std::string_view name, std::string_view json, std::string& out);
  // Ends a stream that has no "data: [DONE]" (the Responses API's): the last chunk.
  void close(std::string& out);
  // Appends the end of the stream for its final message: one finish chunk per choice (the last one
  // with the request's timings), an error event when the engine failed, the usage chunk when the
  // request asked for it, "data: [DONE]" and the last chunk.
  void finish(const generation_request& req, const response_meta& meta, const actors::stream_final& final,
              std::string& out, const std::vector<int32_t>* calls_per_choice = nullptr);

 private:
  void head(std::string& out);
  void frame(std::string_view data, std::string& out) const;

  std::string request_id_;  // X-Request-Id
  std::string cors_origin_;
  bool chunked_;
  bool keep_alive_;
  bool headers_sent_ = false;
};

}  // namespace tessera::server
