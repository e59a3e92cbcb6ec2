// Naming member functions across processes.
//
// A member-function pointer is not something another process can use, so each actor
// type lists its callable methods once, in one line:
//
//   struct Counter {
//     int add(int x);
//     void reset();
//     static constexpr auto troupe_methods = troupe::methods<&Counter::add, &Counter::reset>;
//   };
//
// A call travels as the method's index in that list. Every rank runs the same binary,
// so the index means the same method everywhere; the names (for error messages) come
// from the compiler's own spelling of the pointer.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::actors {

template <auto... Methods>
struct MethodTable {
  static constexpr std::size_t size = sizeof...(Methods);
};

template <auto... Methods>
inline constexpr MethodTable<Methods...> methods{};

template <class T>
using method_table_t = std::remove_cv_t<decltype(T::troupe_methods)>;

// A concurrency group (as Ray's): up to `Size` calls of these methods run at once,
// beside the calls of the actor's other groups. Methods in no group form the default
// group of size 1. Declared beside troupe_methods:
//
//   static constexpr auto troupe_concurrency =
//       troupe::concurrency(troupe::group<1, &Worker::status>("control"));
//
// Within a group of size 1, calls run one at a time in arrival order per sender; in
// a larger group they may run together and in any order. Methods of different groups
// share the object: what they both touch needs a mutex or atomics (docs/ACTORS.md).
template <std::size_t Size, auto... Methods>
struct ConcurrencyGroup {
  static_assert(Size >= 1, "a concurrency group runs at least one call at a time");
  static_assert(sizeof...(Methods) >= 1, "a concurrency group names at least one method");
  using Table = MethodTable<Methods...>;
  static constexpr std::size_t size = Size;
  const char* name;
};

template <std::size_t Size, auto... Methods>
constexpr ConcurrencyGroup<Size, Methods...> group(const char* name) {
  return {name};
}

template <class... Groups>
constexpr std::tuple<Groups...> concurrency(Groups... groups) {
  return {groups...};
}

template <class M>
struct MemberTraits;
template <class C, class R, class... A>
struct MemberTraits<R (C::*)(A...)> {
  using Class = C;
  using Result = std::decay_t<R>;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <class C, class R, class... A>
struct MemberTraits<R (C::*)(A...) const> : MemberTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MemberTraits<R (C::*)(A...) noexcept> : MemberTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MemberTraits<R (C::*)(A...) const noexcept> : MemberTraits<R (C::*)(A...)> {};

namespace detail {

std::string demangle(const char* mangled);

// "Counter::add" from the compiler's text for this instantiation.
std::string member_name_from_signature(std::string_view pretty);

// "add" from "Counter::add": how error contexts name a method next to its actor.
std::string unqualified(std::string_view member);

template <auto M>
std::string member_name() {
  return member_name_from_signature(__PRETTY_FUNCTION__);
}

template <class T>
std::string type_name() {
  return demangle(typeid(T).name());
}

// A demangled name as a program writes it: "TrainWorker<DigitsRecipe>" for
// "troupe::train::TrainWorker<(anonymous namespace)::DigitsRecipe>" (namespaces and
// enclosing classes dropped, template arguments kept).
std::string readable_name(std::string_view demangled);

template <class T>
concept NamedActor = requires {
  { T::troupe_name } -> std::convertible_to<std::string_view>;
};

// How errors and logs name actor type T: its `static constexpr std::string_view
// troupe_name` if it has one, else readable_name of its type.
template <class T>
std::string actor_name() {
  if constexpr (NamedActor<T>)
    return std::string(std::string_view(T::troupe_name));
  else
    return readable_name(type_name<T>());
}

template <class T, auto... Ms>
std::vector<std::string> method_names(MethodTable<Ms...>) {
  return {member_name<Ms>()...};
}

inline constexpr std::uint32_t kNoMethod = ~std::uint32_t{0};

// Index of `m` in T's method table, or kNoMethod.
template <class T, class M>
std::uint32_t method_index(M m) {
  std::uint32_t found = kNoMethod, i = 0;
  auto visit = [&]<auto... Ms>(MethodTable<Ms...>) {
    auto one = [&](auto candidate) {
      if constexpr (std::is_same_v<decltype(candidate), M>)
        if (found == kNoMethod && candidate == m) found = i;
      ++i;
    };
    (one(Ms), ...);
  };
  visit(method_table_t<T>{});
  return found;
}

template <class T, class M>
std::uint32_t checked_method_index(M m) {
  static_assert(std::is_member_function_pointer_v<M>, "ask/tell take a pointer to a member function");
  static_assert(std::is_base_of_v<typename MemberTraits<M>::Class, T>, "the method belongs to another actor type");
  const auto index = method_index<T>(m);
  TROUPE_CHECK(index != kNoMethod, "ask/tell: the method is not listed in ", actor_name<T>(),
               "::troupe_methods; add it there (troupe::methods<&", actor_name<T>(), "::method, ...>)");
  return index;
}

}  // namespace detail
}  // namespace troupe::actors

namespace troupe {
using actors::concurrency;
using actors::group;
using actors::methods;
}  // namespace troupe
