// The one small tree of exceptions every troupe module may throw, and the
// checks that build their messages.
//
// A message says what failed, with the values, and where:
//   "matmul: inner dimensions differ, a is [4, 3], b is [5, 2] (tensor/src/matmul.cpp:41)"
// Modules add their own few types (MpiError, CheckpointError, ...) derived from Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {

// Base of everything troupe throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something unusable: wrong shape, dtype, device, name, flag.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wait ran past the timeout it was given.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A file or stream held something that cannot be read as what it claims to be.
class FormatError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// Strips the build-directory prefix so messages show "tensor/src/ops.cpp:12".
inline const char* short_path(const char* file) {
  std::string_view path(file);
  for (const char* root : {"/tensor/", "/nn/", "/mpi/", "/actors/", "/collectives/", "/checkpoint/", "/supervisor/",
                           "/train/", "/examples/", "/tools/", "/bench/"}) {
    auto at = path.rfind(root);
    if (at != std::string_view::npos) return file + at + 1;
  }
  return file;
}

template <class E, class... Parts>
[[noreturn]] void fail(const char* file, int line, Parts&&... parts) {
  throw E(concat(std::forward<Parts>(parts)..., " (", short_path(file), ":", line, ")"));
}

}  // namespace detail
}  // namespace troupe

// Throws InvalidArgument with the streamed message parts when cond is false.
// A macro only so that the message is built on failure and stamped with file:line.
#define TROUPE_CHECK(cond, ...)                                                                      \
  do {                                                                                               \
    if (!(cond)) ::troupe::detail::fail<::troupe::InvalidArgument>(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Like TROUPE_CHECK for a == b, and the message prints both values.
#define TROUPE_CHECK_EQ(a, b, ...)                                                                                    \
  do {                                                                                                                \
    const auto& troupe_a_ = (a);                                                                                      \
    const auto& troupe_b_ = (b);                                                                                      \
    if (!(troupe_a_ == troupe_b_))                                                                                    \
      ::troupe::detail::fail<::troupe::InvalidArgument>(__FILE__, __LINE__, __VA_ARGS__, ", got ", troupe_a_, " vs ", \
                                                        troupe_b_);                                                   \
  } while (0)

// Throws the given exception type with file:line, for errors that are not argument checks.
#define TROUPE_THROW(Type, ...) ::troupe::detail::fail<Type>(__FILE__, __LINE__, __VA_ARGS__)
