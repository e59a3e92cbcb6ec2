#include "troupe/actors/methods.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace troupe::actors::detail {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(mangled);
}

std::string member_name_from_signature(std::string_view pretty) {
  // GCC and Clang spell the parameter as "[with auto M = &Counter::add; ...]" or
  // "[M = &Counter::add]".
  const auto at = pretty.find("M = &");
  if (at == std::string_view::npos) return std::string(pretty);
  auto name = pretty.substr(at + 5);
  name = name.substr(0, name.find_first_of(";]"));
  return std::string(name);
}

}  // namespace troupe::actors::detail
