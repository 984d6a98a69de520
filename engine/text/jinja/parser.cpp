#include "engine/text/jinja/parser.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/filters.hpp"

namespace tessera::jinja::detail {

namespace {

constexpr size_t max_parse_depth = 256;

class parser {
 public:
  explicit parser(std::vector<token> tokens) : toks_(std::move(tokens)) {}

  node_ptr parse_template() {
    auto root = std::make_unique<template_node>();
    root->kind = node_kind::sequence;
    std::string end;
    root->bodies.push_back(parse_body({}, &end));
    resolve(*root, false);
    return root;
  }

 private:
  struct depth_guard {
    explicit depth_guard(parser& p) : p_(p) {
      if (++p_.depth_ > max_parse_depth) syntax_error(p_.cur().line, "template nesting is too deep");
    }
    ~depth_guard() { --p_.depth_; }
    parser& p_;
  };

  const token& cur() const { return toks_[pos_]; }
  const token& peek(size_t ahead = 1) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == tok::name && cur().text == n; }
  static std::string describe(const token& t) {
    switch (t.type) {
      case tok::eof: return "end of template";
      case tok::var_end: return "'}}'";
      case tok::block_end: return "'%}'";
      case tok::string: return "string literal";
      case tok::integer:
      case tok::floating: return "number " + t.text;
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    syntax_error(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(std::string("'") + op + "'");
    advance();
  }
  void expect_block_end() {
    if (cur().type != tok::block_end) unexpected("'%}'");
    advance();
  }
  // Tags that open a body accept a Python-style colon before "%}" (jinja2/parser.py, parse_statements).
  void expect_body_start() {
    if (is_op(":")) advance();
    expect_block_end();
  }
  std::string expect_name() {
    if (cur().type != tok::name) unexpected("a name");
    std::string n = cur().text;
    advance();
    return n;
  }

  // Parses nodes until `{% <one of end_tags>`; consumes that tag name (not the rest of its tag) and
  // reports which one. With no end tags, parses to the end of the template.
  node_list parse_body(std::initializer_list<const char*> end_tags, std::string* which) {
    depth_guard guard(*this);
    node_list nodes;
    while (true) {
      const token& t = cur();
      if (t.type == tok::eof) {
        if (end_tags.size() == 0) return nodes;
        std::string list;
        for (const char* e : end_tags) list += (list.empty() ? "" : " or ") + std::string("'") + e + "'";
        syntax_error(t.line, "unexpected end of template, expected " + list);
      }
      if (t.type == tok::text) {
        auto n = std::make_unique<template_node>();
        n->kind = node_kind::text;
        n->line = t.line;
        n->text = t.text;
        nodes.push_back(std::move(n));
        advance();
      } else if (t.type == tok::var_begin) {
        auto n = std::make_unique<template_node>();
        n->kind = node_kind::output;
        n->line = t.line;
        advance();
        n->exprs.push_back(parse_tuple(true, false));
        if (cur().type != tok::var_end) unexpected("'}}'");
        advance();
        nodes.push_back(std::move(n));
      } else if (t.type == tok::block_begin) {
        advance();
        if (cur().type != tok::name) unexpected("a tag name");
        const std::string tag = cur().text;
        for (const char* e : end_tags) {
          if (tag == e) {
            advance();
            *which = tag;
            return nodes;
          }
        }
        nodes.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  node_ptr parse_statement() {
    const int line = cur().line;
    const std::string tag = cur().text;
    advance();
    auto n = std::make_unique<template_node>();
    n->line = line;
    if (tag == "if") {
      n->kind = node_kind::if_chain;
      n->exprs.push_back(parse_tuple(false, false));
      expect_body_start();
      while (true) {
        std::string which;
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, &which));
        if (which == "elif") {
          n->exprs.push_back(parse_tuple(false, false));
          expect_body_start();
        } else if (which == "else") {
          expect_body_start();
          std::string end;
          n->bodies.push_back(parse_body({"endif"}, &end));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      n->kind = node_kind::for_loop;
      const bool parens = is_op("(");
      if (parens) advance();
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        advance();
        if (cur().type != tok::name) break;
        n->targets.push_back(expect_name());
      }
      if (parens) expect_op(")");
      if (!is_name("in")) unexpected("'in'");
      advance();
      n->exprs.push_back(parse_tuple(false, false));
      if (is_name("if")) {
        advance();
        n->exprs.push_back(parse_expression(true));
      } else {
        n->exprs.push_back(nullptr);
      }
      if (is_name("recursive")) fail_unsupported("a recursive for loop", line);
      expect_body_start();
      ++loop_depth_;
      std::string which;
      n->bodies.push_back(parse_body({"else", "endfor"}, &which));
      --loop_depth_;
      if (which == "else") {
        expect_body_start();
        std::string end;
        n->bodies.push_back(parse_body({"endfor"}, &end));
      }
      expect_block_end();
      n->uses_loop = mentions_loop(n->bodies[0]) || (n->exprs[1] && mentions_loop(*n->exprs[1]));
    } else if (tag == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        advance();
        n->attribute = expect_name();
      } else {
        while (is_op(",")) {
          advance();
          n->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        advance();
        n->kind = node_kind::set_value;
        n->exprs.push_back(parse_tuple(true, false));
        expect_block_end();
      } else {
        if (is_op("|")) fail_unsupported("a filtered block set", line);
        if (n->targets.size() != 1) unexpected("'='");
        n->kind = node_kind::set_block;
        expect_body_start();
        std::string end;
        n->bodies.push_back(parse_body({"endset"}, &end));
        expect_block_end();
      }
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(line, "'" + tag + "' outside of a loop");
      n->kind = tag == "break" ? node_kind::break_loop : node_kind::continue_loop;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' {% generation %} marks assistant text for masks; it renders its body unchanged.
      n->kind = node_kind::sequence;
      expect_body_start();
      std::string end;
      n->bodies.push_back(parse_body({"endgeneration"}, &end));
      expect_block_end();
    } else if (tag == "macro") {
      parse_macro(*n);
    } else if (tag == "call" || tag == "filter" || tag == "import" || tag == "from" || tag == "include" ||
               tag == "extends" || tag == "block" || tag == "raw" || tag == "with" || tag == "autoescape" ||
               tag == "do") {
      fail_unsupported("'{% " + tag + " %}'", line);
    } else {
      syntax_error(line, "unknown tag '" + tag + "'");
    }
    return n;
  }

  // `{% macro name(a, b=default, ...) %}body{% endmacro %}`, as jinja2/parser.py parses it: no
  // trailing comma, no parameter without a default after one with a default.
  void parse_macro(template_node& n) {
    n.kind = node_kind::macro_def;
    n.text = parse_assignable_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n.targets.empty()) expect_op(",");
      const int line = cur().line;
      std::string param = parse_assignable_name();
      // Python refuses it when it compiles the macro's function.
      if (std::find(n.targets.begin(), n.targets.end(), param) != n.targets.end())
        syntax_error(line, "duplicate argument '" + param + "' in macro definition");
      n.targets.push_back(std::move(param));
      if (is_op("=")) {
        advance();
        n.exprs.push_back(parse_expression(true));
      } else {
        if (!n.exprs.empty() && n.exprs.back()) syntax_error(line, "non-default argument follows default argument");
        n.exprs.push_back(nullptr);
      }
    }
    advance();  // )
    expect_body_start();
    // A macro's body is a function of its own: `break` there needs a loop inside the macro.
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    n.bodies.push_back(parse_body({"endmacro"}, &end));
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    n.catches_varargs = mentions_name(n.bodies[0], "varargs");
    n.catches_kwargs = mentions_name(n.bodies[0], "kwargs");
    n.catches_caller = mentions_name(n.bodies[0], "caller");
  }
  // A name that can be assigned to: Jinja's literals true/false/none are names it refuses here.
  std::string parse_assignable_name() {
    static const char* const literals[] = {"true", "false", "none", "True", "False", "None"};
    if (cur().type == tok::name &&
        std::any_of(std::begin(literals), std::end(literals), [&](const char* l) { return cur().text == l; }))
      syntax_error(cur().line, "can't assign to '" + cur().text + "'");
    return expect_name();
  }

  // Jinja resolves filter and test names when it compiles a template, except inside "soft" frames
  // (the test and branches of an {% if %}, and inline `a if b else c` expressions), where an unknown
  // name only fails if it is evaluated (jinja2/compiler.py, _filter_test_common). Loop and block-set
  // bodies are inner frames and therefore strict again.
  static void resolve(const expr& e, bool soft) {
    const bool inner_soft = soft || e.kind == expr_kind::cond;
    if (!inner_soft && e.kind == expr_kind::filter && !is_known_filter(e.name)) {
      if (is_standard_jinja_filter(e.name)) fail_unsupported("the filter '" + e.name + "'", e.line);
      syntax_error(e.line, "no filter named '" + e.name + "'");
    }
    if (!inner_soft && e.kind == expr_kind::test && !is_known_test(e.name)) {
      if (is_standard_jinja_test(e.name)) fail_unsupported("the test '" + e.name + "'", e.line);
      syntax_error(e.line, "no test named '" + e.name + "'");
    }
    for (const auto& k : e.kids)
      if (k) resolve(*k, inner_soft);
  }
  static void resolve(const template_node& n, bool soft) {
    switch (n.kind) {
      case node_kind::if_chain:
        for (const auto& e : n.exprs) resolve(*e, true);
        for (const auto& b : n.bodies)
          for (const auto& c : b) resolve(*c, true);
        return;
      case node_kind::for_loop:
        resolve(*n.exprs[0], soft);
        if (n.exprs[1]) resolve(*n.exprs[1], false);
        for (const auto& b : n.bodies)
          for (const auto& c : b) resolve(*c, false);
        return;
      case node_kind::set_block:
        for (const auto& c : n.bodies[0]) resolve(*c, false);
        return;
      case node_kind::macro_def:  // a function of its own: a strict frame, like a loop body
        for (const auto& e : n.exprs)
          if (e) resolve(*e, false);
        for (const auto& c : n.bodies[0]) resolve(*c, false);
        return;
      default:
        for (const auto& e : n.exprs)
          if (e) resolve(*e, soft);
        for (const auto& b : n.bodies)
          for (const auto& c : b) resolve(*c, soft);
    }
  }

  static bool mentions_name(const expr& e, const char* name) {
    if (e.kind == expr_kind::name && e.name == name) return true;
    return std::any_of(e.kids.begin(), e.kids.end(), [&](const expr_ptr& k) { return k && mentions_name(*k, name); });
  }
  static bool mentions_name(const node_list& body, const char* name) {
    for (const auto& n : body) {
      for (const auto& e : n->exprs)
        if (e && mentions_name(*e, name)) return true;
      for (const auto& b : n->bodies)
        if (mentions_name(b, name)) return true;
    }
    return false;
  }
  static bool mentions_loop(const expr& e) { return mentions_name(e, "loop"); }
  static bool mentions_loop(const node_list& body) { return mentions_name(body, "loop"); }

  // Left-associative chains (a + b + ..., x|f|g..., x.a.b...) are built by loops, not recursion,
  // so their height is checked here; it bounds every later recursion over the tree (resolution,
  // evaluation, destruction).
  void add_kid(expr& e, expr_ptr kid) {
    if (kid) {
      e.depth = std::max(e.depth, kid->depth + 1);
      if (e.depth > max_parse_depth) syntax_error(e.line, "expression is nested too deeply");
    }
    e.kids.push_back(std::move(kid));
  }

  expr_ptr make(expr_kind kind, int line) {
    auto e = std::make_unique<expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool is_tuple_end() const {
    return cur().type == tok::var_end || cur().type == tok::block_end || is_op(")") || cur().type == tok::eof;
  }

  expr_ptr parse_tuple(bool with_condexpr, bool explicit_parens) {
    const int line = cur().line;
    std::vector<expr_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end()) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make(expr_kind::tuple, line);
    for (auto& item : items) add_kid(*e, std::move(item));
    return e;
  }

  expr_ptr parse_expression(bool with_condexpr) {
    depth_guard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  expr_ptr parse_condexpr() {
    expr_ptr body = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto e = make(expr_kind::cond, line);
      expr_ptr test = parse_or();
      expr_ptr otherwise;
      if (is_name("else")) {
        advance();
        depth_guard guard(*this);
        otherwise = parse_condexpr();
      }
      add_kid(*e, std::move(test));
      add_kid(*e, std::move(body));
      add_kid(*e, std::move(otherwise));  // may be null: renders as undefined
      body = std::move(e);
    }
    return body;
  }

  // `a or b or c`, left-associative: ((a or b) or c); likewise `and`, one level tighter.
  expr_ptr parse_or() { return parse_keyword_chain("or", expr_kind::or_op, &parser::parse_and); }
  expr_ptr parse_and() { return parse_keyword_chain("and", expr_kind::and_op, &parser::parse_not); }
  expr_ptr parse_keyword_chain(const char* keyword, expr_kind kind, expr_ptr (parser::*operand)()) {
    expr_ptr left = (this->*operand)();
    while (is_name(keyword)) {
      auto e = make(kind, cur().line);
      advance();
      add_kid(*e, std::move(left));
      add_kid(*e, (this->*operand)());
      left = std::move(e);
    }
    return left;
  }
  expr_ptr parse_not() {
    if (is_name("not")) {
      depth_guard guard(*this);
      auto e = make(expr_kind::not_op, cur().line);
      advance();
      add_kid(*e, parse_not());
      return e;
    }
    return parse_compare();
  }
  expr_ptr parse_compare() {
    const int line = cur().line;
    expr_ptr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<expr_ptr> operands;
    while (true) {
      std::string op;
      if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == tok::name && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(expr_kind::compare, line);
    add_kid(*e, std::move(first));
    for (auto& o : operands) add_kid(*e, std::move(o));
    e->compare_ops = std::move(ops);
    return e;
  }
  expr_ptr binary(const std::string& op, expr_ptr left, expr_ptr right, int line) {
    auto e = make(expr_kind::binary, line);
    e->name = op;
    add_kid(*e, std::move(left));
    add_kid(*e, std::move(right));
    return e;
  }
  expr_ptr parse_math1() {
    expr_ptr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }
  expr_ptr parse_concat() {
    const int line = cur().line;
    expr_ptr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(expr_kind::concat, line);
    add_kid(*e, std::move(first));
    while (is_op("~")) {
      advance();
      add_kid(*e, parse_math2());
    }
    return e;
  }
  expr_ptr parse_math2() {
    expr_ptr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }
  expr_ptr parse_pow() {
    expr_ptr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }
  expr_ptr parse_unary(bool with_filter) {
    depth_guard guard(*this);
    expr_ptr node;
    if (is_op("-") || is_op("+")) {
      auto e = make(is_op("-") ? expr_kind::neg : expr_kind::pos, cur().line);
      advance();
      add_kid(*e, parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }
  expr_ptr parse_primary() {
    const token& t = cur();
    const int line = t.line;
    if (t.type == tok::name) {
      const std::string n = t.text;
      advance();
      auto e = make(expr_kind::literal, line);
      if (n == "true" || n == "True")
        e->literal = value::boolean(true);
      else if (n == "false" || n == "False")
        e->literal = value::boolean(false);
      else if (n == "none" || n == "None")
        e->literal = value::none();
      else {
        e->kind = expr_kind::name;
        e->name = n;
      }
      return e;
    }
    if (t.type == tok::string) {
      std::string s;
      while (cur().type == tok::string) {  // adjacent literals concatenate, as in Python
        s += cur().text;
        advance();
      }
      auto e = make(expr_kind::literal, line);
      e->literal = value::string(std::move(s));
      return e;
    }
    if (t.type == tok::integer || t.type == tok::floating) {
      auto e = make(expr_kind::literal, line);
      e->literal = t.type == tok::integer ? value::integer(t.i) : value::floating(t.f);
      advance();
      return e;
    }
    if (is_op("(")) {
      advance();
      expr_ptr inner = parse_tuple(true, true);
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      advance();
      auto e = make(expr_kind::list, line);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        add_kid(*e, parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      advance();
      auto e = make(expr_kind::dict, line);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        add_kid(*e, parse_expression(true));
        expect_op(":");
        add_kid(*e, parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    unexpected("an expression");
  }
  expr_ptr parse_postfix(expr_ptr node) {
    while (true) {
      if (is_op(".")) {
        const int line = cur().line;
        advance();
        if (cur().type == tok::name) {
          auto e = make(expr_kind::getattr, line);
          e->name = cur().text;
          advance();
          add_kid(*e, std::move(node));
          node = std::move(e);
        } else if (cur().type == tok::integer) {
          auto e = make(expr_kind::getitem, line);
          add_kid(*e, std::move(node));
          auto idx = make(expr_kind::literal, line);
          idx->literal = value::integer(cur().i);
          add_kid(*e, std::move(idx));
          advance();
          node = std::move(e);
        } else {
          unexpected("an attribute name");
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), expr_kind::call, "");
      } else {
        return node;
      }
    }
  }
  expr_ptr parse_subscript(expr_ptr node) {
    const int line = cur().line;
    advance();  // [
    std::vector<expr_ptr> parts;
    bool is_slice = false;
    if (is_op("]")) {  // x[] subscripts with the empty tuple
      parts.push_back(make(expr_kind::tuple, line));
    } else if (is_op(":")) {
      parts.push_back(nullptr);
    } else {
      parts.push_back(parse_expression(true));
      if (is_op(",")) {  // x[a, b] subscripts with the tuple (a, b)
        auto key = make(expr_kind::tuple, line);
        add_kid(*key, std::move(parts[0]));
        while (is_op(",")) {
          advance();
          add_kid(*key, parse_expression(true));
        }
        parts[0] = std::move(key);
      }
    }
    if (is_op(":")) {
      is_slice = true;
      advance();
      parts.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
      if (is_op(":")) {
        advance();
        parts.push_back(is_op("]") ? nullptr : parse_expression(true));
      } else {
        parts.push_back(nullptr);
      }
    }
    expect_op("]");
    auto e = make(is_slice ? expr_kind::slice : expr_kind::getitem, line);
    add_kid(*e, std::move(node));
    for (auto& p : parts) add_kid(*e, std::move(p));
    return e;
  }
  // Parses "(args)" into e->kids[1..] / e->keywords; kids[0] is the callee or filtered value.
  expr_ptr parse_call(expr_ptr subject, expr_kind kind, std::string name) {
    auto e = make(kind, cur().line);
    e->name = std::move(name);
    add_kid(*e, std::move(subject));
    if (is_op("(")) {
      advance();
      bool first = true;
      while (!is_op(")")) {
        if (!first) expect_op(",");
        first = false;
        if (is_op(")")) break;
        if (is_op("*") || is_op("**")) fail_unsupported("*args/**kwargs in a call", cur().line);
        if (cur().type == tok::name && peek().type == tok::op && peek().text == "=") {
          e->keywords.push_back(cur().text);
          advance();
          advance();
        } else {
          if (std::any_of(e->keywords.begin(), e->keywords.end(), [](const std::string& k) { return !k.empty(); }))
            syntax_error(cur().line, "positional argument follows keyword argument");
          e->keywords.emplace_back();
        }
        add_kid(*e, parse_expression(true));
      }
      expect_op(")");
    }
    return e;
  }
  expr_ptr parse_filter_expr(expr_ptr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        const int line = cur().line;
        std::string name = expect_name();
        while (is_op(".")) {
          advance();
          name += "." + expect_name();
        }
        node = parse_call(std::move(node), expr_kind::filter, name);
        node->line = line;
      } else if (is_name("is")) {
        advance();
        bool negated = false;
        if (is_name("not")) {
          negated = true;
          advance();
        }
        const int line = cur().line;
        std::string name = expect_name();
        while (is_op(".")) {
          advance();
          name += "." + expect_name();
        }
        if (is_op("(")) {
          node = parse_call(std::move(node), expr_kind::test, name);
          node->line = line;
        } else {
          auto e = make(expr_kind::test, line);
          e->name = name;
          add_kid(*e, std::move(node));
          const token& t = cur();
          const bool arg_follows = (t.type == tok::name && t.text != "else" && t.text != "or" && t.text != "and") ||
                                   t.type == tok::string || t.type == tok::integer || t.type == tok::floating ||
                                   is_op("(") || is_op("[") || is_op("{");
          if (arg_follows) {
            add_kid(*e, parse_postfix(parse_primary()));
            e->keywords.emplace_back();
          }
          node = std::move(e);
        }
        node->negated = negated;
      } else if (is_op("(")) {
        node = parse_call(std::move(node), expr_kind::call, "");
      } else {
        return node;
      }
    }
  }

  std::vector<token> toks_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

node_ptr parse_template(std::vector<token> tokens) { return parser(std::move(tokens)).parse_template(); }

}  // namespace tessera::jinja::detail
