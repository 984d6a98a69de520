// llama.cpp's GBNF as xgrammar's EBNF parser reads it. The two dialects are the same but for one
// thing llama.cpp allows and xgrammar does not: an empty alternative (`ws ::= | " " | "\n"`, as in
// llama.cpp's own grammars/json.gbnf; `( | "x")`; a rule whose body ends with `|`). Each becomes the
// empty string `""`, which means the same, so llama.cpp's grammars work unchanged.
#pragma once
#include <string>
#include <string_view>

namespace tessera::structured {

// `text` with every empty alternative filled with `""`; strings, character classes and comments
// are copied untouched. Text that is not a well-formed grammar is returned as it is scanned, for
// the grammar parser to report.
std::string fill_empty_alternatives(std::string_view text);

}  // namespace tessera::structured
