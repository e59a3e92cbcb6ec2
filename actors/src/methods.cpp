#include "troupe/actors/methods.hpp"

#include <cxxabi.h>

#include <cctype>
#include <cstdlib>
#include <memory>

namespace troupe::actors::detail {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(mangled);
}

namespace {
// Where the last "::" outside template arguments starts, or npos.
std::size_t last_qualifier(std::string_view name) {
  std::size_t split = std::string_view::npos;
  int depth = 0;
  for (std::size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (depth == 0 && name.substr(i, 2) == "::") split = i;
  }
  return split;
}
}  // namespace

std::string unqualified(std::string_view member) {
  const std::size_t split = last_qualifier(member);
  return std::string(split == std::string_view::npos ? member : member.substr(split + 2));
}

std::string member_name_from_signature(std::string_view pretty) {
  // GCC and Clang spell the parameter as "[with auto M = &Counter::add; ...]" or
  // "[M = &Counter::add]".
  const auto at = pretty.find("M = &");
  if (at == std::string_view::npos) return std::string(pretty);
  auto name = pretty.substr(at + 5);
  name = name.substr(0, name.find_first_of(";]"));
  // "Class::method", the class as readable_name writes it.
  const std::size_t split = last_qualifier(name);
  if (split == std::string_view::npos) return std::string(name);
  return readable_name(name.substr(0, split)) + std::string(name.substr(split));
}

std::string readable_name(std::string_view demangled) {
  // Drops each qualifier "x::" that precedes a name; "(anonymous namespace)::" too.
  // A qualifier is the identifier just before "::", or "(anonymous namespace)".
  constexpr std::string_view kAnonymous = "(anonymous namespace)::";
  std::string out;
  out.reserve(demangled.size());
  std::size_t i = 0;
  while (i < demangled.size()) {
    if (demangled.substr(i, kAnonymous.size()) == kAnonymous) {
      i += kAnonymous.size();
      continue;
    }
    if (demangled.substr(i, 2) == "::") {
      // Remove the name written just before, template arguments and all: it was a qualifier.
      std::size_t start = out.size();
      if (start > 0 && out[start - 1] == '>') {
        int depth = 0;
        do {
          --start;
          if (out[start] == '>') ++depth;
          if (out[start] == '<') --depth;
        } while (start > 0 && depth > 0);
      }
      while (start > 0 && (std::isalnum(static_cast<unsigned char>(out[start - 1])) || out[start - 1] == '_')) --start;
      out.erase(start);
      i += 2;
      continue;
    }
    out += demangled[i++];
  }
  return out;
}

}  // namespace troupe::actors::detail
