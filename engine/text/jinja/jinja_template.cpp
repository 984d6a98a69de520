// The interpreter's entry points; its parts are named in jinja_template.hpp.
#include "engine/text/jinja/jinja_template.hpp"

#include "engine/text/jinja/ast.hpp"
#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/lexer.hpp"
#include "engine/text/jinja/parser.hpp"
#include "engine/text/jinja/renderer.hpp"

namespace tessera::jinja {

program::~program() = default;

std::shared_ptr<const program> program::parse(std::string_view source) {
  // Real chat templates are a few KiB; a multi-MiB "template" is an attack on load time.
  constexpr size_t max_source_bytes = 4u << 20;
  if (source.size() > max_source_bytes)
    detail::fail(chat_template_error_kind::limit, "chat template is too large (" + std::to_string(source.size()) +
                                                      " bytes, limit " + std::to_string(max_source_bytes) + ")");
  std::shared_ptr<program> prog(new program());
  prog->root_ = detail::parse_template(detail::tokenize(source));
  return prog;
}

std::string program::render(const context& variables, const limits& bounds, int64_t now_unix_seconds) const {
  return detail::render(*root_, variables, bounds, now_unix_seconds);
}

}  // namespace tessera::jinja
