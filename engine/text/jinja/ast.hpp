// The syntax tree the parser builds and the renderer walks. Its height is bounded by the parser, which
// bounds every recursion over it (name resolution, evaluation, destruction).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/text/jinja/jinja_template.hpp"

namespace tessera::jinja::detail {

enum class expr_kind {
  literal,
  name,
  list,
  tuple,
  dict,
  getattr,
  getitem,
  slice,
  call,
  filter,
  test,
  not_op,
  neg,
  pos,
  binary,
  compare,
  and_op,
  or_op,
  cond,
  concat,
};

struct expr {
  expr_kind kind = expr_kind::literal;
  int line = 1;
  value literal;
  std::string name;                         // variable, attribute, filter, test, binary operator
  std::vector<std::unique_ptr<expr>> kids;  // operands; for calls/filters/tests: [callee/subject, args...]
  std::vector<std::string> keywords;        // call/filter/test: keyword name per argument ("" = positional)
  std::vector<std::string> compare_ops;     // compare: one operator between each pair of operands
  bool negated = false;                     // test: "is not"
  size_t depth = 1;                         // height of this subtree (bounded by the parser)
};
using expr_ptr = std::unique_ptr<expr>;

enum class node_kind {
  sequence,
  text,
  output,
  if_chain,
  for_loop,
  set_value,
  set_block,
  break_loop,
  continue_loop,
  macro_def,
};

struct template_node {
  node_kind kind = node_kind::sequence;
  int line = 1;
  std::string text;                  // text; macro: its name
  std::vector<std::string> targets;  // for/set: variable names; macro: parameter names
  std::string attribute;             // set ns.attribute = ...
  std::vector<expr_ptr> exprs;       // if: conditions; for: [iterable, filter or null]; set: [value]; macro: a default
                                     // per parameter, or null
  std::vector<std::vector<std::unique_ptr<template_node>>> bodies;
  bool uses_loop = false;  // for: the body mentions `loop`
  // macro: the body mentions `varargs`, `kwargs` or `caller`, so the macro accepts extra positional
  // arguments, extra keyword arguments or a `caller` keyword (jinja2/parser.py, parse_macro).
  bool catches_varargs = false;
  bool catches_kwargs = false;
  bool catches_caller = false;
};
using node_ptr = std::unique_ptr<template_node>;
using node_list = std::vector<node_ptr>;

}  // namespace tessera::jinja::detail
