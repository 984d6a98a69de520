#include "server/sse_writer.hpp"

#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <cstdio>
#include <sstream>

#include "server/api_error.hpp"
#include "server/cors.hpp"
#include "server/stream_format.hpp"

namespace tessera::server {

namespace http = boost::beast::http;

void sse_writer::head(std::string& out) {
  if (headers_sent_) return;
  headers_sent_ = true;
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::server, "tessera");
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Request-Id", request_id_);
  if (!cors_origin_.empty()) add_cors_headers(res, cors_origin_);
  res.chunked(chunked_);
  res.keep_alive(keep_alive_);
  std::ostringstream os;
  os << res.base();
  out += os.str();
}

void sse_writer::frame(std::string_view data, std::string& out) const {
  if (!chunked_) {
    out.append(data);
    return;
  }
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  out.append(size);
  out.append(data);
  out.append("\r\n");
}

void sse_writer::event(std::string_view json, std::string& out) {
  head(out);
  std::string e = "data: ";
  e.append(json);
  e.append("\n\n");
  frame(e, out);
}

void sse_writer::named_event(std::string_view name, std::string_view json, std::string& out) {
  head(out);
  std::string e = "event: ";
  e.append(name);
  e.append("\ndata: ");
  e.append(json);
  e.append("\n\n");
  frame(e, out);
}

void sse_writer::close(std::string& out) {
  head(out);
  if (chunked_) out += "0\r\n\r\n";
}

void sse_writer::finish(const generation_request& req, const response_meta& meta, const actors::stream_final& f,
                        std::string& out, const std::vector<int32_t>* calls_per_choice) {
  auto made_calls = [&](int32_t index) {
    return calls_per_choice && index >= 0 && static_cast<size_t>(index) < calls_per_choice->size() &&
           (*calls_per_choice)[static_cast<size_t>(index)] > 0;
  };
  head(out);
  const boost::json::object timings = timings_json(f);
  if (f.choices.empty()) event(finish_chunk(req, meta, 0, f.reason, &timings), out);
  for (size_t k = 0; k < f.choices.size(); ++k) {
    const bool last = k + 1 == f.choices.size();
    event(finish_chunk(req, meta, f.choices[k].index, f.choices[k].reason, last ? &timings : nullptr,
                       made_calls(f.choices[k].index)),
          out);
  }
  if (f.reason == finish_reason::error) {
    event(error_body(api_error(500, f.error.empty() ? "request failed" : f.error, "", "engine_error")), out);
  }
  if (req.include_usage) event(usage_chunk(req, meta, f), out);
  frame("data: [DONE]\n\n", out);
  if (chunked_) out += "0\r\n\r\n";
}

}  // namespace tessera::server
