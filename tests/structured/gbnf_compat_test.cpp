// fill_empty_alternatives (engine/structured/gbnf_compat.cpp): llama.cpp's empty alternatives become
// "" and nothing else of a grammar changes; whether the result means the same to the grammar engine
// is checked in grammar_backend_test (llama.cpp's json.gbnf, matched token by token).
#include <gtest/gtest.h>

#include <string>

#include "engine/structured/gbnf_compat.hpp"

namespace tessera::structured {
namespace {

TEST(gbnf_compat, empty_alternatives_become_the_empty_string) {
  EXPECT_EQ(fill_empty_alternatives(R"(ws ::= | " " | "\n")"), R"(ws ::= "" | " " | "\n")");
  EXPECT_EQ(fill_empty_alternatives(R"(a ::= ( | "x") "y")"), R"(a ::= ( "" | "x") "y")");
  EXPECT_EQ(fill_empty_alternatives(R"(a ::= "x" | )"), R"(a ::= "x" | "")");
  EXPECT_EQ(fill_empty_alternatives("a ::= \"x\" |\nb ::= \"y\""), "a ::= \"x\" |\n\"\" b ::= \"y\"");
  EXPECT_EQ(fill_empty_alternatives("a ::=\nb ::= c"), "a ::=\n\"\" b ::= c");
  EXPECT_EQ(fill_empty_alternatives(R"(a ::= ("x" | ))"), R"(a ::= ("x" | "" ))");
  EXPECT_EQ(fill_empty_alternatives(R"(a ::= "x" || "y")"), R"(a ::= "x" |"" | "y")");
}

TEST(gbnf_compat, strings_classes_comments_and_full_grammars_are_untouched) {
  for (const std::string& g : {
           std::string(R"(root ::= "a|(" [|()\]] "\"|" | b)"),
           std::string("# a comment with | and ::= and (\nroot ::= x+ # ( |\nx ::= [a-z] | \"::=\""),
           std::string("root ::= num (\" + \" num)*\nnum ::= [1-9] [0-9]{0,2}"),
           std::string("root   ::= object\nvalue  ::= object | array\n"),
       }) {
    EXPECT_EQ(fill_empty_alternatives(g), g) << g;
  }
  // Unterminated text is passed on as scanned (the grammar parser reports it).
  EXPECT_EQ(fill_empty_alternatives("root ::= \"abc"), "root ::= \"abc");
  EXPECT_EQ(fill_empty_alternatives(""), "");
}

}  // namespace
}  // namespace tessera::structured
