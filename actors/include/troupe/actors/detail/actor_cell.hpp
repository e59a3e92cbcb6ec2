// An actor as the runtime holds it: the user's object, its name and type, and the
// table that turns (method index, argument bytes) into a call. One message at a time
// reaches the object: every call is posted to the cell's strand.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/actors/detail/serialization.hpp"
#include "troupe/actors/methods.hpp"

namespace troupe::actors::detail {

using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;

class ActorCellBase {
 public:
  ActorCellBase(std::uint64_t id, std::string name, std::string type, std::vector<std::string> methods,
                boost::asio::io_context& io)
      : id_(id), name_(std::move(name)), type_(std::move(type)), method_names_(std::move(methods)),
        strand_(boost::asio::make_strand(io)) {}
  virtual ~ActorCellBase() = default;

  // Deserializes the arguments of method `index` from `args`, calls it, and appends
  // the serialized result to `result`. Throws BadMessage for bytes that don't parse.
  virtual void invoke(std::uint32_t index, std::string_view args, std::string& result) = 0;
  virtual void* object() = 0;

  std::uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& type() const { return type_; }
  // "Counter 'name'" or "Counter #3": how errors name this actor.
  std::string label() const { return type_ + (name_.empty() ? " #" + std::to_string(id_) : " '" + name_ + "'"); }
  std::string method_name(std::uint32_t index) const {
    return index < method_names_.size() ? method_names_[index] : "method #" + std::to_string(index);
  }
  std::size_t method_count() const { return method_names_.size(); }
  Strand& strand() { return strand_; }

 private:
  std::uint64_t id_;
  std::string name_, type_;
  std::vector<std::string> method_names_;
  Strand strand_;
};

template <class T, auto M>
void invoke_serialized(T& self, std::string_view args_bytes, std::string& result) {
  using Traits = MemberTraits<decltype(M)>;
  typename Traits::Args args;
  parse_exactly(args_bytes, "arguments", args);
  if constexpr (std::is_void_v<typename Traits::Result>) {
    std::apply([&](auto&... a) { (self.*M)(std::move(a)...); }, args);
  } else {
    append_serialized(result, std::apply([&](auto&... a) { return (self.*M)(std::move(a)...); }, args));
  }
}

template <class T>
class ActorCell final : public ActorCellBase {
 public:
  ActorCell(std::uint64_t id, std::string name, std::unique_ptr<T> object, boost::asio::io_context& io)
      : ActorCellBase(id, std::move(name), type_name<T>(), method_names<T>(method_table_t<T>{}), io),
        object_(std::move(object)) {}

  void invoke(std::uint32_t index, std::string_view args, std::string& result) override {
    if (index >= kInvokers.size())
      throw BadMessage(concat("method index ", index, " is not in ", type(), "'s table of ", kInvokers.size()));
    kInvokers[index](*object_, args, result);
  }
  void* object() override { return object_.get(); }

 private:
  using Invoker = void (*)(T&, std::string_view, std::string&);
  template <auto... Ms>
  static constexpr std::array<Invoker, sizeof...(Ms)> make_invokers(MethodTable<Ms...>) {
    return {&invoke_serialized<T, Ms>...};
  }
  static constexpr auto kInvokers = make_invokers(method_table_t<T>{});

  std::unique_ptr<T> object_;
};

}  // namespace troupe::actors::detail
