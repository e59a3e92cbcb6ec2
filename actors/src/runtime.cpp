#include "troupe/actors/runtime.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>

#include "doorbell.hpp"
#include "object_store.hpp"
#include "peer_liveness.hpp"
#include "scheduler.hpp"
#include "transport.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors {

namespace {

// For the terminate handler, which can take no arguments.
std::atomic<int> g_rank_for_abort{-1};

[[noreturn]] void abort_job() {
  std::string what = "no exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "a non-std::exception";
    }
  }
  std::fprintf(stderr, "troupe: rank %d is terminating (uncaught exception: %s); aborting the whole job\n",
               g_rank_for_abort.load(), what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

// TROUPE_LIVENESS_TIMEOUT_MS, which troupe-run's --liveness-timeout exports to every
// rank, overrides RuntimeOptions::liveness_timeout: the launcher knows how slow a
// node may be before it is dead, the program does not.
std::chrono::milliseconds liveness_timeout_from_env(std::chrono::milliseconds fallback) {
  const char* text = std::getenv("TROUPE_LIVENESS_TIMEOUT_MS");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long ms = std::strtoll(text, &end, 10);
  TROUPE_CHECK(errno == 0 && *end == '\0' && ms > 0 && ms <= 24LL * 3600 * 1000,
               "environment variable TROUPE_LIVENESS_TIMEOUT_MS is '", text,
               "', not a number of milliseconds in 1..86400000");
  return std::chrono::milliseconds(ms);
}

detail::Header header_of(const std::string& bytes) {
  detail::Header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  return h;
}

std::string_view payload_of(const std::string& bytes) { return std::string_view(bytes).substr(sizeof(detail::Header)); }

}  // namespace

namespace detail {
// Factories for every actor type spawn() was instantiated with, keyed by type and
// constructor argument types. Filled before main by SpawnKey's static members; a
// function-local static so that it exists whatever the initialisation order.
std::map<std::string, FactoryEntry>& factory_registry() {
  static std::map<std::string, FactoryEntry> registry;
  return registry;
}

std::vector<Bytes>*& outgoing_attachments() {
  thread_local std::vector<Bytes>* attachments = nullptr;
  return attachments;
}

const std::vector<Bytes>*& incoming_attachments() {
  thread_local const std::vector<Bytes>* attachments = nullptr;
  return attachments;
}

Runtime*& current_runtime() {
  thread_local Runtime* runtime = nullptr;
  return runtime;
}

std::string register_factory(std::string key, std::string actor, Factory factory) {
  factory_registry().emplace(key, FactoryEntry{std::move(factory), std::move(actor)});
  return key;
}
}  // namespace detail

std::string Runtime::new_message() { return std::string(sizeof(detail::Header), '\0'); }

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options)
    : options_(options), object_ledger_(std::make_shared<detail::ObjectLedger>(this)) {
  TROUPE_CHECK(options_.threads >= 0, "Runtime: threads must be >= 0, got ", options_.threads);
  options_.liveness_timeout = liveness_timeout_from_env(options_.liveness_timeout);
  environment_ = std::make_unique<mpi::Environment>(&argc, &argv);
  rank_ = environment_->rank();
  size_ = environment_->size();
  if (const char* folder = std::getenv("TROUPE_OBJECT_SPILL_FOLDER"); folder != nullptr && *folder != '\0')
    options_.object_spill_folder = folder;
  objects_ = std::make_unique<detail::ObjectStore>(
      rank_, detail::ObjectStoreOptions{options_.object_store_limit, options_.object_spill_folder});
  g_rank_for_abort = rank_;
  std::set_terminate(abort_job);
  MPI_Comm actors = MPI_COMM_NULL, system = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &actors));
  TROUPE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &system));
  // A malformed message (an attachment longer than announced, say) must come back as
  // an error code the transport reports, not abort this rank.
  TROUPE_MPI_CHECK(MPI_Comm_set_errhandler(actors, MPI_ERRORS_RETURN));
  actor_comm_ = reinterpret_cast<void*>(actors);
  system_comm_ = reinterpret_cast<void*>(system);
  scheduler_ = std::make_unique<detail::Scheduler>(
      options_.threads,
      [this](detail::Lane& lane, std::unique_ptr<detail::Call> call) { execute(lane, std::move(call)); },
      [this] { transport_->wake(); }, [this] { return transport_->receive(); });
  liveness_ =
      std::make_unique<detail::PeerLiveness>(actors, rank_, size_, options_.heartbeat_period, options_.liveness_timeout,
                                             [this](int r, const std::string& why) { on_rank_lost(r, why); });
  if (const char* bells = std::getenv("TROUPE_DOORBELLS"); bells == nullptr || std::string_view(bells) != "off")
    doorbells_ = std::make_unique<detail::Doorbells>(actors);
  transport_ = std::make_unique<detail::Transport>(
      actors, [this](detail::Message m) { handle(std::move(m)); }, *scheduler_, liveness_.get(), options_.threads == 0,
      options_.attachment_timeout, doorbells_.get());
  if (transport_->has_doorbells())
    scheduler_->set_bell_wait([this](Clock::duration period, const std::function<bool()>& ready) {
      transport_->wait_for_message(period, ready);
    });
  scheduler_->start();
  transport_->start();
  liveness_->start();
  start_status_writer();
}

Runtime::~Runtime() {
  if (std::uncaught_exceptions() > 0 && !shut_down_) {
    // Another rank may be waiting for this one in a collective; leaving quietly
    // would hang the job. Take it down, saying which rank failed.
    std::fprintf(stderr, "troupe: rank %d is unwinding an exception past its Runtime; aborting the whole job\n", rank_);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: rank %d: shutdown failed: %s\n", rank_, e.what());
  }
  object_ledger_->detach();  // references that outlive this runtime give nothing back
}

detail::Progress* Runtime::progress() const { return transport_.get(); }

void Runtime::set_liveness_hook(std::function<void()> hook, std::chrono::milliseconds period) {
  liveness_->set_hook(std::move(hook), period);
}

std::uint64_t Runtime::liveness_messages_sent() const { return liveness_ ? liveness_->messages_sent() : 0; }

std::chrono::nanoseconds Runtime::liveness_cpu_time() const {
  return liveness_ ? liveness_->cpu_time() : std::chrono::nanoseconds(0);
}

std::shared_ptr<detail::ActorCellBase> Runtime::local_actor(std::uint64_t id) const {
  std::shared_lock lock(actors_mutex_);
  auto it = actors_.find(id);
  return it == actors_.end() ? nullptr : it->second;
}

void Runtime::install_actor(std::shared_ptr<detail::ActorCellBase> cell) {
  std::unique_lock lock(actors_mutex_);
  actors_.emplace(cell->id(), std::move(cell));
}

void Runtime::report_failed_tell(int source, const ErrorInfo& info) const {
  if (info.code == ErrorCode::overloaded) {  // a flood refused is not a flood of lines: 1st, 2nd, 4th...
    const std::uint64_t n = refused_tells_.fetch_add(1, std::memory_order_relaxed) + 1;
    if ((n & (n - 1)) != 0) return;
    std::fprintf(stderr, "troupe: rank %d: tell from rank %d refused (%llu so far): %s\n", rank_, source,
                 static_cast<unsigned long long>(n), RemoteError(info).what());
    return;
  }
  std::fprintf(stderr, "troupe: rank %d: tell from rank %d failed: %s\n", rank_, source, RemoteError(info).what());
}

std::uint64_t Runtime::refused_tells() const { return refused_tells_.load(std::memory_order_relaxed); }

// ---- sending ----

std::uint64_t Runtime::send_request(int rank, std::uint64_t actor, std::uint32_t method, std::string payload,
                                    std::shared_ptr<detail::ReplyHandler> reply, std::vector<Bytes> attachments,
                                    std::optional<Clock::time_point> deadline, bool keep_result) {
  detail::Header h;
  h.kind = keep_result ? detail::Kind::request_ref : detail::Kind::request;
  h.method = method;
  h.actor = actor;
  if (deadline) {  // already past: 1 ns, so that the callee refuses it as expired
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - Clock::now()).count();
    h.budget_ns = left > 0 ? static_cast<std::uint64_t>(left) : 1;
  }
  return send_with_reply(rank, h, std::move(payload), std::move(reply), std::move(attachments));
}

std::uint64_t Runtime::send_with_reply(int rank, detail::Header header, std::string payload,
                                       std::shared_ptr<detail::ReplyHandler> reply, std::vector<Bytes> attachments) {
  TROUPE_CHECK(rank >= 0 && rank < size_, reply->what(), ": rank ", rank, " is outside the world of ", size_, " ranks");
  if (liveness_->lost(rank)) {
    reply->on_error(std::make_exception_ptr(
        RemoteError({ErrorCode::rank_lost, rank, "", reply->what(), "", "the rank was lost earlier"})));
    return 0;
  }
  header.request = next_request_id_.fetch_add(1);
  write_header(payload, header);
  {
    std::lock_guard lock(pending_mutex_);
    TROUPE_CHECK(!shut_down_, "ask after the runtime shut down: ", reply->what());
    pending_.emplace(header.request, Pending{rank, reply});
  }
  if (rank == rank_ && !attachments.empty()) {  // to ourselves: hand the attachments over directly
    handle({rank_, std::move(payload), std::move(attachments)});
    return header.request;
  }
  try {
    transport_->send(rank, payload, attachments);
  } catch (...) {
    take_pending(header.request);
    throw;
  }
  return header.request;
}

void Runtime::send_raw(int rank, const std::string& bytes) {
  TROUPE_CHECK(rank >= 0 && rank < size_, "send_raw: rank ", rank, " is outside the world of ", size_, " ranks");
  std::string copy = bytes;
  transport_->send(rank, copy);
}

void Runtime::send_tell(int rank, std::uint64_t actor, std::uint32_t method, std::string payload,
                        std::vector<Bytes> attachments) {
  TROUPE_CHECK(rank >= 0 && rank < size_, "tell: rank ", rank, " is outside the world of ", size_, " ranks");
  detail::Header h;
  h.kind = detail::Kind::tell;
  h.method = method;
  h.actor = actor;
  write_header(payload, h);
  if (liveness_->lost(rank))
    throw RemoteError({ErrorCode::rank_lost, rank, "", "tell", "", "the rank was lost earlier"});
  if (rank == rank_) {  // deliver through the same path as a remote tell, keeping order per sender
    handle({rank_, std::move(payload), std::move(attachments)});
    return;
  }
  transport_->send(rank, payload, attachments);
}

void Runtime::reply_value(int rank, std::uint64_t request, std::string bytes, const std::vector<Bytes>& attachments) {
  detail::Header h;
  h.kind = detail::Kind::reply_value;
  h.request = request;
  write_header(bytes, h);
  if (rank == rank_ && !attachments.empty()) {
    handle({rank_, std::move(bytes), attachments});
    return;
  }
  transport_->send(rank, bytes, attachments);
}

void Runtime::reply_later(int rank, std::uint64_t request, std::shared_ptr<detail::DeferredAnswer> later,
                          std::string actor, std::string method, bool keep_result) {
  // The method returned a Future: its call is over (the actor takes its next call) and
  // the reply goes out from whichever thread resolves that future.
  later->on_ready([this, rank, request, later, actor = std::move(actor), method = std::move(method), keep_result] {
    if (quiescent_.load()) return;  // shut down: the asker's future has failed already
    std::string bytes = new_message();
    std::vector<Bytes> out;
    try {
      detail::AttachmentScope scope(detail::outgoing_attachments(), &out);
      later->append(bytes);
      if (keep_result) return reply_kept(rank, request, std::move(bytes), std::move(out));
    } catch (...) {
      return reply_error(rank, request, describe_current_exception(rank_, actor, method));
    }
    reply_value(rank, request, std::move(bytes), out);
  });
}

void Runtime::reply_error(int rank, std::uint64_t request, const ErrorInfo& info) {
  std::string bytes = new_message();
  detail::append_serialized(bytes, info);
  detail::Header h;
  h.kind = detail::Kind::reply_error;
  h.request = request;
  write_header(bytes, h);
  transport_->send(rank, bytes);
}

std::shared_ptr<detail::ReplyHandler> Runtime::take_pending(std::uint64_t request) {
  std::lock_guard lock(pending_mutex_);
  auto it = pending_.find(request);
  if (it == pending_.end()) return nullptr;
  auto handler = std::move(it->second.reply);
  pending_.erase(it);
  return handler;
}

// ---- receiving: called by the transport in arrival order ----

void Runtime::handle(detail::Message message) {
  detail::RuntimeScope scope(this);
  detail::AttachmentScope attachments(detail::incoming_attachments(), &message.attachments);
  detail::Header h;
  const std::string problem = detail::read_header(message.bytes, h);
  if (!problem.empty()) {
    // Without a trustworthy header there is nobody to answer; say what arrived.
    std::fprintf(stderr, "troupe: rank %d dropped a malformed message from rank %d: %s\n", rank_, message.source,
                 problem.c_str());
    return;
  }
  switch (h.kind) {
    case detail::Kind::heartbeat: return;  // the transport has noted that the sender lives
    case detail::Kind::request: return handle_request(message, true);
    case detail::Kind::tell: return handle_request(message, false);
    case detail::Kind::cancel: return handle_cancel(message.source, h.actor, h.request);
    case detail::Kind::request_ref: return handle_request(message, true, true);
    case detail::Kind::fetch_object: return handle_fetch(message.source, h.request, h.actor);
    case detail::Kind::free_object: return free_object(rank_, h.actor);
    case detail::Kind::release_object: return release_object(rank_, h.actor, h.request);
    case detail::Kind::reply_value:
    case detail::Kind::reply_error: {
      auto handler = take_pending(h.request);
      if (!handler) return;  // the asker stopped waiting (its future was dropped); nothing to do
      if (h.kind == detail::Kind::reply_value) {
        handler->on_value(payload_of(message.bytes));
        return;
      }
      ErrorInfo info;
      try {
        detail::parse_exactly(payload_of(message.bytes), "error reply", info);
      } catch (const detail::BadMessage& e) {
        info = {ErrorCode::bad_message, message.source, "", handler->what(), "BadMessage", e.what()};
      }
      handler->on_error(remote_error(std::move(info)));
      return;
    }
    default: return handle_system(message);
  }
}

void Runtime::handle_request(detail::Message& message, bool wants_reply, bool keep_result) {
  const detail::Header h = header_of(message.bytes);
  const int source = message.source;
  auto fail = [&](ErrorCode code, std::string actor, std::string method, std::string text) {
    ErrorInfo info{code, rank_, std::move(actor), std::move(method), "", std::move(text)};
    if (wants_reply) return reply_error(source, h.request, info);
    report_failed_tell(source, info);
  };
  auto cell = local_actor(h.actor);
  if (!cell)
    return fail(ErrorCode::unknown_actor, "#" + std::to_string(h.actor), "method #" + std::to_string(h.method),
                "no such actor on this rank (never spawned, or stopped)");
  if (h.method >= cell->method_count())
    return fail(ErrorCode::unknown_method, cell->label(), "method #" + std::to_string(h.method),
                detail::concat(cell->type(), " has ", cell->method_count(), " methods"));
  auto call = detail::make_call(
      h.method,
      [this, cell = cell.get(), source, h, wants_reply, keep_result, held = std::move(message)] {
        std::string result = wants_reply ? new_message() : std::string();  // a tell's is discarded
        std::vector<Bytes> out;
        std::shared_ptr<detail::DeferredAnswer> later;
        {
          detail::AttachmentScope in(detail::incoming_attachments(), &held.attachments);
          detail::AttachmentScope scope(detail::outgoing_attachments(), &out);
          later = cell->invoke(h.method, payload_of(held.bytes), result);
        }
        if (!wants_reply) return;
        if (later)
          reply_later(source, h.request, std::move(later), cell->label(), cell->method_name(h.method), keep_result);
        else if (keep_result)
          reply_kept(source, h.request, std::move(result), std::move(out));
        else
          reply_value(source, h.request, std::move(result), out);
      },
      [this, source, h, wants_reply](const ErrorInfo& info) {
        try {
          if (wants_reply)
            reply_error(source, h.request, info);
          else
            report_failed_tell(source, info);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "troupe: rank %d: could not send an error reply to rank %d: %s\n", rank_, source,
                       e.what());
        }
      });
  if (wants_reply) call->set_request(source, h.request);
  if (h.budget_ns != 0)  // counted from arrival: the ranks' clocks do not agree
    call->set_deadline(Clock::now().time_since_epoch().count() +
                       std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(h.budget_ns)).count());
  post_call(cell, std::move(call));
}

}  // namespace troupe::actors
