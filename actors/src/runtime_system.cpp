// The runtime's own protocol: spawning, the name registry on rank 0, and the
// collective start-up and shutdown steps.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "peer_liveness.hpp"
#include "scheduler.hpp"
#include "transport.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors {

namespace {
MPI_Comm as_comm(void* p) { return reinterpret_cast<MPI_Comm>(p); }

// Actors made by spawn_on_each share one id on every rank; the top bit keeps that
// id space apart from the per-rank ids of spawn().
constexpr std::uint64_t kGroupIdBit = std::uint64_t{1} << 63;
}  // namespace

template <class R>
R Runtime::system_call(int rank, detail::Header header, std::string payload, const std::string& what) {
  auto state = std::make_shared<detail::State<R>>(transport_.get(), what);
  send_with_reply(rank, header, std::move(payload), std::make_shared<detail::TypedReply<R>>(what, state));
  return Future<R>(state).get();
}

std::uint64_t Runtime::spawn_bytes(int rank, const std::string& key, const SpawnOptions& options,
                                   const std::string& args) {
  TROUPE_CHECK(options.max_restarts >= 0, "spawn: max_restarts must be >= 0, got ", options.max_restarts);
  if (rank == rank_) return spawn_local(key, options, args);
  std::string payload = new_message();
  detail::append_serialized(payload, key, options, args);
  detail::Header h;
  h.kind = detail::Kind::spawn;
  return system_call<std::uint64_t>(rank, h, std::move(payload), "spawn " + key + " on rank " + std::to_string(rank));
}

std::unique_ptr<detail::ActorCellBase> Runtime::build(const std::string& key, std::uint64_t id,
                                                      const SpawnOptions& options, const std::string& args) {
  auto& registry = detail::factory_registry();
  auto it = registry.find(key);
  if (it == registry.end())
    throw RemoteError({ErrorCode::spawn_failed, rank_, key, "constructor", "",
                       "this rank's binary has no factory for this type and argument list (is it the same binary?)"});
  const std::string& actor = it->second.actor;
  detail::RuntimeScope scope(this);
  try {
    return it->second.make(id, options, args);
  } catch (const detail::BadMessage& e) {
    throw RemoteError({ErrorCode::bad_message, rank_, actor, "constructor", "BadMessage", e.what()});
  } catch (...) {
    throw RemoteError(describe_current_exception(rank_, actor, "constructor"));
  }
}

std::uint64_t Runtime::spawn_local(const std::string& key, const SpawnOptions& options, const std::string& args) {
  const std::uint64_t id = next_actor_id_.fetch_add(1);
  std::shared_ptr<detail::ActorCellBase> cell = build(key, id, options, args);
  if (!options.name.empty()) register_name(options.name, rank_, id, cell->type());
  install_actor(std::move(cell));
  return id;
}

std::vector<std::string> Runtime::allgather_texts(const std::string& mine, const char* what) {
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  MPI_Request request;
  TROUPE_MPI_CHECK(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, as_comm(system_comm_), &request));
  wait_collective(&request, what);
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  TROUPE_MPI_CHECK(MPI_Iallgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                                   as_comm(system_comm_), &request));
  wait_collective(&request, what);
  std::vector<std::string> texts;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    texts.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
  return texts;
}

namespace {
// "what rank 0 said; ranks 1, 2: what they said", or the one text when every failed
// rank said the same.
std::string group_failures(const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first rank
  for (std::size_t r = 0; r < texts.size(); ++r) {
    if (texts[r].empty()) continue;
    auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == texts[r]; });
    if (same == groups.end()) {
      groups.push_back({texts[r], {static_cast<int>(r)}});
    } else {
      same->second.push_back(static_cast<int>(r));
    }
  }
  if (groups.size() == 1) return groups.front().first;
  std::string out;
  for (const auto& [text, ranks] : groups) {
    out += out.empty() ? "" : "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += ": " + text;
  }
  return out;
}
}  // namespace

std::uint64_t Runtime::spawn_group_local(const std::string& key, const std::string& args) {
  const std::uint64_t id = kGroupIdBit | next_group_id_++;
  int ok = 1;
  std::string failure;
  try {
    install_actor(build(key, id, SpawnOptions{}, args));
  } catch (const RemoteError& e) {
    ok = 0;
    failure = e.type().empty() ? e.info().message : e.type() + ": " + e.info().message;
  } catch (const std::exception& e) {
    ok = 0;
    failure = e.what();
  }
  // Every rank learns which ranks failed and why, so all throw the same error together
  // instead of some going on to ask actors that do not exist.
  std::vector<int> oks(static_cast<std::size_t>(size_));
  MPI_Request request;
  TROUPE_MPI_CHECK(MPI_Iallgather(&ok, 1, MPI_INT, oks.data(), 1, MPI_INT, as_comm(system_comm_), &request));
  wait_collective(&request, "spawn_on_each");
  std::vector<int> failed;
  for (int r = 0; r < size_; ++r)
    if (!oks[static_cast<std::size_t>(r)]) failed.push_back(r);
  if (failed.empty()) return id;
  {
    std::unique_lock lock(actors_mutex_);
    actors_.erase(id);
  }
  const auto texts = allgather_texts(ok ? std::string() : failure, "spawn_on_each");
  auto entry = detail::factory_registry().find(key);
  const std::string actor = entry == detail::factory_registry().end() ? key : entry->second.actor;
  throw CollectiveError({ErrorCode::spawn_failed, -1, actor, "constructor", "", group_failures(texts)},
                        std::move(failed));
}

void Runtime::register_name(const std::string& name, int rank, std::uint64_t id, const std::string& type) {
  if (rank_ == 0) {
    std::lock_guard lock(names_mutex_);
    auto [it, inserted] = names_.emplace(name, NameEntry{rank, id, type});
    if (!inserted)
      throw RemoteError(
          {ErrorCode::spawn_failed, 0, type, "register name", "",
           detail::concat("the name '", name, "' is taken by a ", it->second.type, " on rank ", it->second.rank)});
    return;
  }
  std::string payload = new_message();
  detail::append_serialized(payload, name, rank, id, type);
  detail::Header h;
  h.kind = detail::Kind::register_name;
  system_call<bool>(0, h, std::move(payload), "register name '" + name + "'");
}

Runtime::NameEntry Runtime::lookup_entry(const std::string& name) {
  if (rank_ == 0) {
    std::lock_guard lock(names_mutex_);
    auto it = names_.find(name);
    if (it == names_.end())
      throw RemoteError({ErrorCode::unknown_name, 0, "", "lookup", "", "no actor is registered as '" + name + "'"});
    return it->second;
  }
  std::string payload = new_message();
  detail::append_serialized(payload, name);
  detail::Header h;
  h.kind = detail::Kind::lookup;
  const auto entry =
      system_call<std::tuple<int, std::uint64_t, std::string>>(0, h, std::move(payload), "lookup '" + name + "'");
  return {std::get<0>(entry), std::get<1>(entry), std::get<2>(entry)};
}

void Runtime::handle_system(detail::Message& message) {
  const detail::Header h = [&] {
    detail::Header header;
    std::memcpy(&header, message.bytes.data(), sizeof header);
    return header;
  }();
  const int source = message.source;
  const std::string_view payload = std::string_view(message.bytes).substr(sizeof(detail::Header));
  // Runs `body`, replying with its serialized result or with the error it threw.
  auto answer = [this, source, h](auto body) {
    try {
      std::string reply = new_message();
      detail::append_serialized(reply, body());
      reply_value(source, h.request, std::move(reply));
    } catch (const RemoteError& e) {
      reply_error(source, h.request, e.info());
    } catch (const detail::BadMessage& e) {
      reply_error(source, h.request,
                  {ErrorCode::bad_message, rank_, "runtime", "system request", "BadMessage", e.what()});
    } catch (...) {
      reply_error(source, h.request, describe_current_exception(rank_, "runtime", "system request"));
    }
  };
  switch (h.kind) {
    case detail::Kind::spawn: {
      // A constructor may block (it may ask other actors), so it runs on the pool.
      queued_calls_.add();
      scheduler_->post_task([this, answer, bytes = std::move(message.bytes)] {
        detail::RuntimeScope scope(this);
        answer([&] {
          std::string key, args;
          SpawnOptions options;
          detail::parse_exactly(std::string_view(bytes).substr(sizeof(detail::Header)), "spawn request", key, options,
                                args);
          return spawn_local(key, options, args);
        });
        call_finished();
      });
      return;
    }
    case detail::Kind::lookup:
      return answer([&] {
        std::string name;
        detail::parse_exactly(payload, "lookup request", name);
        const NameEntry e = lookup_entry(name);
        return std::tuple<int, std::uint64_t, std::string>(e.rank, e.id, e.type);
      });
    case detail::Kind::register_name:
      return answer([&] {
        std::string name, type;
        int rank = 0;
        std::uint64_t id = 0;
        detail::parse_exactly(payload, "register request", name, rank, id, type);
        register_name(name, rank, id, type);
        return true;
      });
    case detail::Kind::kill:
      return answer([&] {
        kill_local(h.actor, source);
        return true;
      });
    case detail::Kind::list_actors: return answer([&] { return local_actors(); });
    default:
      std::fprintf(stderr, "troupe: rank %d dropped a message of kind %d from rank %d\n", rank_,
                   static_cast<int>(h.kind), source);
  }
}

// ---- collectives of the runtime itself ----

void Runtime::wait_collective(void* request, const char* what) {
  // Meanwhile the progress thread serves incoming messages (another rank may need an
  // answer from us before it can reach the same collective), tests the request and
  // signals this thread once it is done; this thread sleeps: a rank that waits here
  // for a peer still at work -- shutdown() while rank 0 trains -- must not keep a core
  // spinning, and on a machine with as many busy threads as cores a third spinner
  // turns microsecond round trips into milliseconds. A lost rank ends the wait.
  if (!transport_->wait_request(static_cast<MPI_Request*>(request), [this] { return liveness_->any_lost(); }))
    abort_for_lost_ranks(what);
}

void Runtime::call_finished() {
  // Shutdown's drain sleeps until the count reaches zero; the lock orders this
  // notification after its check.
  queued_calls_.remove();
  if (draining_.load() && queued_calls_.value() == 0) {
    { std::lock_guard lock(drain_mutex_); }
    drain_cv_.notify_all();
  }
}

void Runtime::on_rank_lost(int rank, const std::string& reason) {
  // After the drain every rank is done with every other: a peer may already have
  // exited, which is no loss.
  transport_->interrupt_waits();  // a collective waited for will not complete now
  if (quiescent_.load()) return;
  const std::string why = detail::concat("rank ", rank, " was lost: ", reason);
  std::fprintf(stderr, "troupe: rank %d: %s\n", rank_, why.c_str());
  std::vector<std::shared_ptr<detail::ReplyHandler>> orphans;
  {
    std::lock_guard lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.rank != rank) {
        ++it;
        continue;
      }
      orphans.push_back(std::move(it->second.reply));
      it = pending_.erase(it);
    }
  }
  for (auto& reply : orphans)
    reply->on_error(std::make_exception_ptr(RemoteError({ErrorCode::rank_lost, rank, "", reply->what(), "", why})));
}

void Runtime::abort_for_lost_ranks(const char* during) {
  std::string lost;
  for (int r = 0; r < size_; ++r)
    if (liveness_->lost(r)) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
  std::fprintf(stderr, "troupe: rank %d: %s cannot complete: rank(s) %s were lost; ending the whole job\n", rank_,
               during, lost.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void Runtime::drain() {
  // Termination detection: the job is quiet when, twice in a row, every rank's
  // queue is empty and the messages sent equal the messages received.
  const auto deadline = Clock::now() + options_.shutdown_drain_timeout;
  long long previous_sent = -1;
  for (;;) {
    // Calls still running (a checkpoint finishing its save) may take seconds. The
    // progress thread and the pool run them (and the progress thread runs ready work
    // when every pool thread waits); this thread sleeps until the last one ends.
    {
      std::unique_lock lock(drain_mutex_);
      draining_ = true;
      drain_cv_.wait_until(lock, deadline, [this] { return queued_calls_.value() == 0; });
    }
    long long local[4] = {static_cast<long long>(transport_->sent()), static_cast<long long>(transport_->received()),
                          queued_calls_.value(), Clock::now() >= deadline ? 1 : 0};
    long long global[4] = {};
    MPI_Request request;
    TROUPE_MPI_CHECK(MPI_Iallreduce(local, global, 4, MPI_LONG_LONG, MPI_SUM, as_comm(system_comm_), &request));
    wait_collective(&request, "shutdown drain");
    if (global[3] > 0) {
      if (rank_ == 0)
        std::fprintf(stderr, "troupe: shutdown: messages still in flight after %lld ms; failing what is left\n",
                     static_cast<long long>(options_.shutdown_drain_timeout.count()));
      return;
    }
    if (global[0] == global[1] && global[2] == 0) {
      if (global[0] == previous_sent) return;
      previous_sent = global[0];
    } else {
      previous_sent = -1;
    }
  }
}

void Runtime::fail_pending(ErrorCode code, const std::string& why) {
  std::unordered_map<std::uint64_t, Pending> pending;
  {
    std::lock_guard lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& [id, entry] : pending)
    entry.reply->on_error(std::make_exception_ptr(RemoteError({code, rank_, "", entry.reply->what(), "", why})));
}

void Runtime::shutdown() {
  if (shut_down_) return;
  {
    // A restart pausing in its backoff goes on at once: the drain below waits for it.
    std::lock_guard lock(backoff_mutex_);
    backoffs_ended_ = true;
  }
  backoff_cv_.notify_all();
  if (liveness_->any_lost()) abort_for_lost_ranks("shutdown");
  MPI_Request request;
  TROUPE_MPI_CHECK(MPI_Ibarrier(as_comm(system_comm_), &request));
  wait_collective(&request, "shutdown barrier");
  drain();
  quiescent_ = true;
  stop_status_writer();
  {
    std::lock_guard lock(pending_mutex_);
    shut_down_ = true;
  }
  transport_->stop();
  liveness_->stop();
  scheduler_->stop();
  fail_pending(ErrorCode::shutdown, "the runtime shut down before the answer came");
  {
    std::unique_lock lock(actors_mutex_);
    actors_.clear();
  }
  MPI_Comm actors = as_comm(actor_comm_), system = as_comm(system_comm_);
  MPI_Comm_free(&actors);
  MPI_Comm_free(&system);
  scheduler_.reset();
  transport_.reset();
  liveness_.reset();
  environment_.reset();
}

}  // namespace troupe::actors
