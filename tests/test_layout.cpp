// The library's layout: the loops over tensor elements live in cpu/ and cuda/ (DESIGN.md's layer table; see
// CONTRIBUTING.md, "Where code lives"). This file reads the headers themselves and fails when an element loop appears
// in ops/, autograd/, optim/ or amp/, which hold shape checks, dispatch, graph nodes and fused expressions only.
//
// An element loop is a `for` statement (its header and body, after comments and string literals are removed) that
// reads or writes a tensor's memory: it calls `.data()`, or it subscripts or offsets (`p[`, `p + `) a pointer the same
// header binds to a `.data()` (`T* p = t.data()`, `const T *a = x.data(), *b = y.data()`, `auto p = t.data()`) or
// declares as a raw pointer to elements (a kernel's parameter `const T* EMBER_RESTRICT x`; char pointers are strings).
// Loops over shapes, dims, tensors of a list or index entries that dispatch per slice to ops are not element loops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef EMBER_SOURCE_DIR
#error "test_layout.cpp reads the library's headers: define EMBER_SOURCE_DIR (tests/CMakeLists.txt does)"
#endif

namespace {

namespace fs = std::filesystem;

/// s with comments, string literals and character literals blanked (newlines kept, so line numbers stay).
std::string strip_comments_and_strings(const std::string& s) {
  std::string r = s;
  std::size_t i = 0;
  const std::size_t n = s.size();
  auto blank = [&](std::size_t a, std::size_t b) {
    for (std::size_t k = a; k < b && k < n; ++k)
      if (r[k] != '\n') r[k] = ' ';
  };
  while (i < n) {
    if (s.compare(i, 2, "//") == 0) {
      const std::size_t e = s.find('\n', i);
      blank(i, e == std::string::npos ? n : e);
      i = e == std::string::npos ? n : e;
    } else if (s.compare(i, 2, "/*") == 0) {
      const std::size_t e = s.find("*/", i + 2);
      const std::size_t end = e == std::string::npos ? n : e + 2;
      blank(i, end);
      i = end;
    } else if (s[i] == 'R' && i + 1 < n && s[i + 1] == '"') {  // raw string R"d( ... )d"
      const std::size_t open = s.find('(', i + 2);
      const std::string delim = ")" + s.substr(i + 2, open - i - 2) + "\"";
      const std::size_t e = s.find(delim, open);
      const std::size_t end = e == std::string::npos ? n : e + delim.size();
      blank(i, end);
      i = end;
    } else if (s[i] == '"' || (s[i] == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(s[i - 1]))))) {
      // a string or character literal (a quote after a hex digit is a digit separator, 1'000)
      const char q = s[i];
      std::size_t k = i + 1;
      while (k < n && s[k] != q) k += s[k] == '\\' ? 2 : 1;
      blank(i + 1, k);
      i = k + 1;
    } else {
      ++i;
    }
  }
  return r;
}

/// The index one past the bracket that closes the one at `open` (s[open] is '(', '{' or '['), or npos.
std::size_t match_close(const std::string& s, std::size_t open) {
  int depth = 0;
  for (std::size_t k = open; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '(' || c == '{' || c == '[') ++depth;
    if (c == ')' || c == '}' || c == ']') {
      if (--depth == 0) return k + 1;
    }
  }
  return std::string::npos;
}

/// The extent [begin, end) of the `for` statement whose keyword starts at `at`: header and body (a block, or one
/// statement up to its `;`; a braced block inside it counts as part of it).
std::pair<std::size_t, std::size_t> for_statement(const std::string& s, std::size_t at) {
  const std::size_t open = s.find('(', at);
  std::size_t k = match_close(s, open);
  if (k == std::string::npos) return {at, s.size()};
  while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
  if (k < s.size() && s[k] == '{') {
    const std::size_t e = match_close(s, k);
    return {at, e == std::string::npos ? s.size() : e};
  }
  int depth = 0;
  for (; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '(' || c == '{' || c == '[') ++depth;
    if (c == ')' || c == '}' || c == ']') --depth;
    if (c == ';' && depth == 0) return {at, k + 1};
  }
  return {at, s.size()};
}

/// The position of the ':' of a range-based for header ("(decl : range)"), or npos: a ':' at depth 1 that is not
/// part of '::' or of a conditional's '?:'.
std::size_t range_colon(const std::string& h) {
  int depth = 0, questions = 0;
  for (std::size_t k = 0; k < h.size(); ++k) {
    const char c = h[k];
    if (c == '(' || c == '{' || c == '[') ++depth;
    if (c == ')' || c == '}' || c == ']') --depth;
    if (c == ';' && depth == 1) return std::string::npos;
    if (c == '?') ++questions;
    if (c != ':' || depth != 1) continue;
    if ((k + 1 < h.size() && h[k + 1] == ':') || (k > 0 && h[k - 1] == ':')) continue;
    if (questions > 0) {
      --questions;
      continue;
    }
    return k;
  }
  return std::string::npos;
}
bool range_for(const std::string& header) { return range_colon(header) != std::string::npos; }

struct ElementLoop {
  int line;
  std::string text;  // the statement's first line
};

/// The extent of the code a loop at `at` can see declarations in: from the signature of the function around it (the
/// outermost block that is not a namespace, class, struct, union or enum body) to the end of the file.
std::vector<std::size_t> function_starts(const std::string& s) {
  // start[k]: for position k's enclosing function, where its signature begins (npos outside any function).
  std::vector<std::size_t> start(s.size(), std::string::npos);
  struct Block {
    std::size_t sig;
    bool scope;  // a namespace, class, struct, union or enum body: not a function
  };
  std::vector<Block> stack;
  static const std::regex scope_head(
      R"((?:\bnamespace\b[^;{}]*|\b(?:class|struct|union|enum)\b[^;{}()]*|\bextern\s*)$)");
  std::size_t last_stop = 0;  // one past the last ';', '{' or '}'
  std::size_t fn = std::string::npos;
  for (std::size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '{') {
      const std::string head = s.substr(last_stop, k - last_stop);
      const bool scope = std::regex_search(head, scope_head);
      stack.push_back({last_stop, scope});
      if (fn == std::string::npos && !scope) fn = last_stop;
    } else if (c == '}') {
      if (!stack.empty()) stack.pop_back();
      bool inside = false;
      for (const Block& b : stack) inside = inside || !b.scope;
      if (!inside) fn = std::string::npos;
    }
    start[k] = fn;
    if (c == ';' || c == '{' || c == '}') last_stop = k + 1;
  }
  return start;
}

/// The names a piece of code binds to elements: pointers from a tensor's `.data()` (`* name = <expr>.data()`, `auto
/// name = <expr>.data()`) and raw pointers declared as parameters or variables (`const T* EMBER_RESTRICT x`, `float*
/// y`; char pointers are strings, not elements).
std::set<std::string> element_pointers(const std::string& code) {
  static const std::regex binding(R"((?:[*&]|\bauto)\s*([A-Za-z_]\w*)\s*=\s*[\w.:\->\[\]() ]*?\.data\(\))");
  static const std::regex raw(
      R"(\b([A-Za-z_]\w*)\s*(?:<[^<>;(){}]*>)?\s*\*\s*(?:(?:EMBER_RESTRICT|const)\s+)*([A-Za-z_]\w*)\s*(?=[,)=;\[]))");
  std::set<std::string> pointers;
  for (auto it = std::sregex_iterator(code.begin(), code.end(), binding); it != std::sregex_iterator(); ++it)
    pointers.insert((*it)[1].str());
  for (auto it = std::sregex_iterator(code.begin(), code.end(), raw); it != std::sregex_iterator(); ++it)
    if ((*it)[1].str() != "char") pointers.insert((*it)[2].str());
  return pointers;
}

/// The element loops of one header's text (see the top of this file).
std::vector<ElementLoop> element_loops(const std::string& source) {
  const std::string s = strip_comments_and_strings(source);
  const std::vector<std::size_t> fn = function_starts(s);
  static const std::regex keyword(R"(\bfor\s*\()");
  std::vector<ElementLoop> r;
  std::size_t covered = 0;  // a loop inside a loop already reported is part of that one
  for (auto it = std::sregex_iterator(s.begin(), s.end(), keyword); it != std::sregex_iterator(); ++it) {
    const std::size_t at = std::size_t(it->position());
    if (at < covered) continue;
    const auto [b, e] = for_statement(s, at);
    const std::string stmt = s.substr(b, e - b);
    // The pointers the loop can see: declared in its function (signature included) up to the loop's end.
    const std::size_t from = fn[at] == std::string::npos ? b : fn[at];
    std::string alternatives;
    for (const std::string& p : element_pointers(s.substr(from, e - from)))
      alternatives += (alternatives.empty() ? "" : "|") + p;
    const std::regex use(alternatives.empty() ? std::string("\\.data\\(\\)")
                                              : "\\.data\\(\\)|\\b(?:" + alternatives + ")\\s*(?:\\[|\\+(?![+=]))");
    // A range-based for walks a container (tensors of a list, shapes, a vector), not a tensor's memory, unless its
    // range is itself a data pointer's span.
    const std::size_t open = s.find('(', at), close = match_close(s, open);
    const std::string header = s.substr(open, close - open);
    if (range_for(header) && !std::regex_search(header.substr(range_colon(header)), use)) continue;
    if (!std::regex_search(stmt, use)) continue;
    covered = e;
    const int line = 1 + int(std::count(s.begin(), s.begin() + std::ptrdiff_t(b), '\n'));
    const std::size_t eol = source.find('\n', b);
    r.push_back({line, source.substr(b, (eol == std::string::npos ? source.size() : eol) - b)});
  }
  return r;
}

/// Headers that may still hold element loops, with how many and why. Keep it short: an entry goes when its loops
/// move to cpu/ or become fused expressions (the test fails when a header has more or fewer loops than listed).
struct Allowed {
  const char* header;  // under include/ember/
  int loops;
  const char* reason;
};
constexpr Allowed kAllowed[] = {
    {"autograd/gradcheck.hpp", 1, "finite differences perturb one input element at a time: a test utility"},
};

/// The element loops of every header under the folders that must have none, by header (relative to include/ember).
std::map<std::string, std::vector<ElementLoop>> scan(const fs::path& root) {
  std::map<std::string, std::vector<ElementLoop>> found;
  for (const char* folder : {"ops", "autograd", "optim", "amp"}) {
    const fs::path dir = root / "include" / "ember" / folder;
    REQUIRE_MESSAGE(fs::is_directory(dir), "no folder ", dir.string());
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".cuh" && ext != ".h")) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      std::vector<ElementLoop> loops = element_loops(text.str());
      if (!loops.empty())
        found[fs::relative(entry.path(), root / "include" / "ember").generic_string()] = std::move(loops);
    }
  }
  return found;
}

}  // namespace

TEST_CASE("layout: the element-loop scanner finds loops over tensor memory and nothing else") {
  const std::string kernel = R"(
    template <class T> void f(const Tensor<T>& x, Tensor<T>& y, const Shape& s) {
      const T *xp = x.data(), *wp = nullptr;  // for (i = 0; i < n; ++i) xp[i] in a comment is not code
      T* yp = y.data();
      for (std::int64_t i = 0; i < n; ++i) yp[i] = xp[i];
      for (int d = 0; d < s.n; ++d) total *= s[d];
      for (const auto& t : list) check(t, wp);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < m; ++j) run(xp + i * m + j);
      for (std::int64_t i = 0; i < n; ++i) log("y.data()[i]");
      for (std::int64_t i = 0; i < n; ++i) {
        y.data()[i] = T(0);
      }
      for (int k = 0; k < 3; ++k) ops::assign(y.select(0, k), x, "copy");
    })";
  const std::vector<ElementLoop> loops = element_loops(kernel);
  REQUIRE(loops.size() == 3);
  CHECK(loops[0].line == 5);
  CHECK(loops[1].line == 8);
  CHECK(loops[2].line == 11);
}

TEST_CASE("layout: ops/, autograd/, optim/ and amp/ hold no element loops beyond the allow-list") {
  const fs::path root = EMBER_SOURCE_DIR;
  const std::map<std::string, std::vector<ElementLoop>> found = scan(root);
  for (const auto& entry : found) {
    const std::string& header = entry.first;  // (not a structured binding: INFO captures it in a lambda)
    const std::vector<ElementLoop>& loops = entry.second;
    const Allowed* a = nullptr;
    for (const Allowed& e : kAllowed)
      if (header == e.header) a = &e;
    std::string where;
    for (const ElementLoop& l : loops) where += "\n  " + header + ":" + std::to_string(l.line) + ": " + l.text;
    INFO("element loops in include/ember/", header, " (", loops.size(), "):", where,
         "\nmove them into a kernel of cpu/ (named like its CUDA twin; see CONTRIBUTING.md) or write them as a fused "
         "expression");
    CHECK((a != nullptr && int(loops.size()) <= a->loops));
  }
  for (const Allowed& e : kAllowed) {
    const auto it = found.find(e.header);
    const int n = it == found.end() ? 0 : int(it->second.size());
    INFO("the allow-list grants include/ember/", std::string(e.header), " ", e.loops, " element loops (",
         std::string(e.reason), ") but it has ", n, ": lower the count or remove the entry");
    CHECK(n == e.loops);
  }
}
