// A small, sandboxed interpreter for the Jinja2 subset that Hugging Face chat templates use.
//
// Chat templates come from model files, so they are untrusted programs: every render runs under a
// step budget, a recursion-depth bound (which also bounds macro recursion) and an output-size
// bound, and the language has no file access, imports or includes. Semantics follow Jinja2 3.1 as configured by
// transformers' apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, the
// loopcontrols extension, a json.dumps-based tojson filter and a raise_exception global):
// https://jinja.palletsprojects.com/en/3.1.x/templates/ and
// transformers/utils/chat_template_utils.py (_compile_jinja_template).
//
// Pipeline: lexer (source -> tokens, applying whitespace control) -> parser (tokens -> AST) ->
// renderer (AST + context -> string). Values are immutable except namespace() objects, which is
// what makes reference cycles impossible (a namespace may not be stored inside a namespace).
//
// This header is the interpreter's API; its parts, in engine/text/jinja/ and namespace detail:
//   lexer.*            source -> tokens              parser.*, ast.hpp   tokens -> syntax tree
//   renderer.*         runs the tree: scopes, loops  render_budget.*     the limits of one render
//   values.*           Python semantics of values    python_str.*        Python's str rules over UTF-8
//   filters.*          filters and tests             methods.*           str and dict methods, getattr
//   globals.*          range, namespace, dict, ...   call_args.*         arguments and their checks
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/base/error.hpp"

namespace tessera {

enum class chat_template_error_kind {
  syntax,       // the template does not parse
  unsupported,  // valid Jinja that this interpreter deliberately does not run ({% call %}, includes, ...)
  render,       // a runtime error: type error, undefined value used, unknown filter, ...
  raised,       // the template called raise_exception('...') (usually: a conversation it rejects)
  limit,        // a resource bound was hit (steps, depth, output size)
};

// Errors from parsing or rendering a chat template. It is an invalid_request because a render error
// is usually caused by the conversation a client sent (roles that do not alternate, ...).
class chat_template_error : public invalid_request {
 public:
  chat_template_error(chat_template_error_kind kind, const std::string& message)
      : invalid_request(message), kind_(kind) {}
  chat_template_error_kind kind() const noexcept { return kind_; }

 private:
  chat_template_error_kind kind_;
};

namespace jinja {

// Resource bounds for one render.
struct limits {
  uint64_t max_steps = 1'000'000;      // evaluation steps (nodes, loop iterations, elements, bytes/64 built)
  size_t max_depth = 256;              // evaluator recursion (macro calls included) and value nesting depth
  size_t max_output_bytes = 8u << 20;  // rendered text, and any single string value
};

struct value;
struct list_data;
struct dict_data;
struct macro_data;

enum class value_kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, ns, function };

// Callables that can be values: globals, loop.cycle, str/dict methods taken as values (`s.split`
// without a call; the value's `s` names the method and `list` holds the object), and the
// template's own {% macro %}s (the value's `macro` holds the definition).
enum class builtin_function : uint8_t {
  raise_exception,
  namespace_ctor,
  range,
  dict_ctor,
  strftime_now,
  loop_cycle,
  bound_method,
  macro
};

// A Jinja value. Strings, lists and dicts are shared and immutable; a namespace is shared and mutable.
struct value {
  value_kind kind = value_kind::undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  builtin_function fn = builtin_function::raise_exception;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const list_data> list;
  std::shared_ptr<const dict_data> dict;    // dict or namespace (a namespace's data is mutated in place)
  std::shared_ptr<const macro_data> macro;  // function: a {% macro %}

  static value undefined() { return {}; }
  static value none() {
    value v;
    v.kind = value_kind::none;
    return v;
  }
  static value boolean(bool x) {
    value v;
    v.kind = value_kind::boolean;
    v.b = x;
    return v;
  }
  static value integer(int64_t x) {
    value v;
    v.kind = value_kind::integer;
    v.i = x;
    return v;
  }
  static value floating(double x) {
    value v;
    v.kind = value_kind::floating;
    v.f = x;
    return v;
  }
  static value string(std::string x);
  static value function(builtin_function fn) {
    value v;
    v.kind = value_kind::function;
    v.fn = fn;
    return v;
  }
  // Containers record their nesting depth so that deep structures are refused when built, which
  // also bounds the recursion of printing, comparing and destroying them.
  static value make_list(std::vector<value> items, bool is_tuple = false);
  static value make_dict(std::vector<std::pair<value, value>> entries);

  bool is_undefined() const { return kind == value_kind::undefined; }
  const std::string& str() const { return *s; }
};

struct list_data {
  std::vector<value> items;
  bool is_tuple = false;
  size_t depth = 1;
  bool holds_namespace = false;
};

struct dict_data {
  std::vector<std::pair<value, value>> entries;  // insertion order, like Python dicts
  bool is_loop = false;                          // the `loop` object of a for loop (has cycle())
  size_t depth = 1;
  bool holds_namespace = false;
};

namespace detail {
struct template_node;
}  // namespace detail

// A {% macro %} defined while rendering. Jinja compiles a macro to a Python closure, so its body sees
// the variables of the scopes it was defined in as they are when it is called, and nothing of its
// caller's scopes: `scope_depth` is how many scopes of the render were open at the definition.
struct macro_data {
  std::string name;
  const detail::template_node* definition = nullptr;  // the program's macro node (outlives the render)
  size_t scope_depth = 0;
};

// Variables visible to the template, in addition to the built-in globals.
using context = std::vector<std::pair<std::string, value>>;

// A parsed template. Immutable and thread-safe: render() keeps all state on its own stack.
class program {
 public:
  // Throws chat_template_error (syntax or unsupported) naming the line.
  static std::shared_ptr<const program> parse(std::string_view source);

  // Throws chat_template_error (render, raised or limit). `now_unix_seconds` feeds strftime_now.
  std::string render(const context& variables, const limits& bounds, int64_t now_unix_seconds) const;

  ~program();
  program(const program&) = delete;
  program& operator=(const program&) = delete;

 private:
  program() = default;
  std::unique_ptr<detail::template_node> root_;
};

}  // namespace jinja
}  // namespace tessera
