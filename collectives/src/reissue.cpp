#include "reissue.hpp"

#include "troupe/error.hpp"

namespace troupe::collectives::detail {

using K = CollectiveKind;

Work reissue(Communicator& host, const Collective& c, bool blocking) {
  const auto either = [blocking](auto&& wait, auto&& async) -> Work {
    if (!blocking) return async();
    wait();
    return Work();
  };
  switch (c.kind) {
    case K::allreduce:
      return either([&] { host.allreduce(c.input, c.output, c.op); },
                    [&] { return host.allreduce_async(c.input, c.output, c.op); });
    case K::broadcast:
      return either([&] { host.broadcast(c.input, c.output, c.root); },
                    [&] { return host.broadcast_async(c.input, c.output, c.root); });
    case K::reduce:
      return either([&] { host.reduce(c.input, c.output, c.root, c.op); },
                    [&] { return host.reduce_async(c.input, c.output, c.root, c.op); });
    case K::allgather:
      return either([&] { host.allgather(c.input, c.output); },
                    [&] { return host.allgather_async(c.input, c.output); });
    case K::reduce_scatter:
      return either([&] { host.reduce_scatter(c.input, c.output, c.op); },
                    [&] { return host.reduce_scatter_async(c.input, c.output, c.op); });
    case K::gather:
      return either([&] { host.gather(c.input, c.output, c.root); },
                    [&] { return host.gather_async(c.input, c.output, c.root); });
    case K::scatter:
      return either([&] { host.scatter(c.input, c.output, c.root); },
                    [&] { return host.scatter_async(c.input, c.output, c.root); });
    case K::barrier: return either([&] { host.barrier(); }, [&] { return host.barrier_async(); });
    case K::send:
      return either([&] { host.send(c.input, c.root, c.tag); },
                    [&] { return host.send_async(c.input, c.root, c.tag); });
    case K::recv:
      return either([&] { host.recv(c.output, c.root, c.tag); },
                    [&] { return host.recv_async(c.output, c.root, c.tag); });
  }
  TROUPE_THROW(Error, c.describe(), ": not a collective kind the staged backend knows");
}

}  // namespace troupe::collectives::detail
