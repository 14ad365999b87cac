// ember — the rendezvous store's server logic without sockets: keys and values, the connections' handshakes,
// buffers and waits, as a state machine that takes the bytes a connection sent and gives the bytes to send back.
// StoreServer (dist/store.hpp) runs it over TCP; tests and the fuzzer drive it directly.
//
// The wire format is in dist/detail/store_wire.hpp, the handshake in dist/detail/auth.hpp, the server's answers to a
// greeting and to requests (StoreCore::hello and serve) in dist/detail/store_protocol.hpp and the bounds' values in
// dist/store_limits.hpp; this header includes them. Every peer is untrusted, and every resource has a bound that holds:
// - a connection that has not proven the token within `handshake_timeout` is dropped, as is the oldest such
//   connection when `max_handshakes` are pending; only proven connections count against `max_clients`, so
//   connections that never authenticate cannot lock the job's ranks out;
// - keys are at most 4 KiB, values at most 64 MiB, and the keys and values held at most `max_store_bytes`, counted
//   exactly (bytes_used() is the sum of the entries' key and value sizes);
// - each connection buffers at most `connection_buffer` bytes of requests and replies of its own; beyond, a large
//   value on its way in or out takes room from `shared_buffer`, shared by all connections. A connection whose
//   replies are not being read, or that waits for a key, is not read from; buffered_bytes() never exceeds
//   buffered_bound();
// - a connection that holds part of a request and completes none, or whose replies do not move, for
//   `request_timeout` is dropped;
// - a SET wakes the connections waiting for its key through a work queue (no recursion, whatever the chain).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/detail/auth.hpp"
#include "ember/dist/detail/store_wire.hpp"
#include "ember/dist/store_limits.hpp"

namespace ember::dist {

/// The store's server side as a state machine (see the top of this header). Not thread-safe: one thread drives it.
/// Every call leaves it settled: requests that can be answered are answered, connections it drops are listed by
/// take_dropped().
class StoreCore {
 public:
  using Id = std::uint64_t;                                 ///< A connection's identity.
  using TimePoint = std::chrono::steady_clock::time_point;  ///< When something happened (deadlines).
  using RandomFn = void (*)(void*, std::size_t);            ///< Fills n bytes with randomness (the challenges).

  /// An empty `token` is open mode: any client that speaks the protocol is served.
  explicit StoreCore(std::string token = {}, StoreLimits limits = {}, RandomFn random = detail::random_bytes)
      : token_(std::move(token)), limits_(limits), random_(random) {
    if (!token_.empty()) detail::check_token(token_, "dist::StoreCore: the token");
    EMBER_CHECK(limits_.max_clients >= 1 && limits_.max_handshakes >= 1 && limits_.connection_buffer >= 256,
                "dist::StoreCore: limits need at least one client, one handshake and 256 bytes per connection");
  }

  /// A new connection at `now`: its greeting is queued for output. Drops the oldest handshake when too many wait.
  inline Id open(TimePoint now);
  /// Bytes the connection may send now; 0: do not read from it (only watch for it hanging up).
  inline std::size_t want_read(Id id) const;
  /// n bytes the connection sent (at most want_read(id)).
  inline void received(Id id, const char* p, std::size_t n, TimePoint now);
  /// The bytes queued for the connection ("" when none, or when it is gone).
  std::string_view output(Id id) const {
    auto it = conns_.find(id);
    return it == conns_.end() ? std::string_view() : std::string_view(it->second.out).substr(it->second.out_off);
  }
  /// The first n bytes of output() went out.
  inline void sent(Id id, std::size_t n);
  /// The peer left (or its socket failed).
  void close(Id id) { drop(id, false), settle(); }
  /// Drops the connections past their deadlines.
  inline void tick(TimePoint now);
  /// When tick() may next drop something (max() when nothing is pending).
  inline TimePoint next_deadline() const;
  /// The connections dropped by the store since the last call (their sockets are to be closed).
  std::vector<Id> take_dropped() { return std::exchange(dropped_, {}); }
  /// Whether connection `id` is still open.
  bool alive(Id id) const { return conns_.count(id) != 0; }

  /// Sum of the entries' key and value sizes.
  std::uint64_t bytes_used() const { return bytes_; }
  /// Requests and replies held for all connections.
  std::uint64_t buffered_bytes() const { return buffered_; }
  /// The most buffered_bytes() has been.
  std::uint64_t peak_buffered_bytes() const { return peak_buffered_; }
  /// What buffered_bytes() cannot exceed: every connection's own share plus the shared one.
  std::uint64_t buffered_bound() const {
    return std::uint64_t(limits_.max_clients + limits_.max_handshakes) * limits_.connection_buffer +
           limits_.shared_buffer;
  }
  /// The open connections (authenticated or not).
  std::size_t connections() const { return conns_.size(); }
  /// The connections still in their handshake.
  std::size_t handshakes() const { return handshakes_; }
  /// The number of stored keys.
  std::size_t keys() const { return data_.size(); }
  /// The limits the store holds to.
  const StoreLimits& limits() const { return limits_; }
  /// Recounts everything from scratch: an ember::Error naming the first count that disagrees.
  inline void check_invariants() const;

 private:
  enum class Stage : std::uint8_t { Hello, Closing, Ready };
  struct Conn {
    Stage stage = Stage::Hello;
    std::string in, out;
    std::size_t out_off = 0;
    unsigned char nonce[detail::kNonceBytes] = {};
    TimePoint deadline{};  // of the handshake
    TimePoint since{};     // the last completed request, or the first byte of a pending one
    TimePoint out_since{};  // the last time output moved, or began to wait
    std::string waiting;   // the key a GET/WAIT waits for, when `waits`
    bool waits = false, starved = false, queued = false, dead = false;
    std::uint64_t held = 0, excess = 0;  // as last counted: in + pending out, and its part beyond the own share
    std::size_t pending_out() const { return out.size() - out_off; }
  };

  inline void serve(Id id, Conn& c);
  inline void hello(Id id, Conn& c);
  void refuse_and_close(Conn& c, std::string_view why) {
    reply(c, detail::kRefused, why);
    c.stage = Stage::Closing;
    c.in.clear();
  }
  void reply(Conn& c, std::uint8_t status, std::string_view payload) {
    if (c.pending_out() == 0) c.out_since = now_;
    c.out += char(status);
    detail::put_u64(c.out, payload.size());
    c.out += payload;
  }
  std::uint64_t excess_of(std::uint64_t held) const {
    return held > limits_.connection_buffer ? held - limits_.connection_buffer : 0;
  }
  // Whether the connection may hold `held` bytes (given its current share of the shared buffer).
  bool room_for(const Conn& c, std::uint64_t held) const {
    return shared_used_ - c.excess + excess_of(held) <= limits_.shared_buffer;
  }
  // Updates the counts after c's buffers changed; when room was freed, the starved connections try again.
  void recount(Conn& c) {
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
    }
    // A buffer that once held a large value gives its memory back.
    if (c.in.capacity() > 2 * limits_.connection_buffer && c.in.size() <= limits_.connection_buffer)
      c.in.shrink_to_fit();
    if (c.out.capacity() > 2 * limits_.connection_buffer && c.pending_out() <= limits_.connection_buffer) {
      c.out.erase(0, c.out_off);
      c.out_off = 0;
      c.out.shrink_to_fit();
    }
    const std::uint64_t held = c.in.size() + c.pending_out(), excess = excess_of(held);
    buffered_ = buffered_ - c.held + held;
    const bool freed = excess < c.excess;
    shared_used_ = shared_used_ - c.excess + excess;
    c.held = held;
    c.excess = excess;
    peak_buffered_ = std::max(peak_buffered_, buffered_);
    if (freed) wake_starved();
  }
  void enqueue(Id id, Conn& c) {
    if (!c.queued) c.queued = true, ready_.push_back(id);
  }
  void wake_starved() {
    for (Id id : starved_) {
      auto it = conns_.find(id);
      if (it == conns_.end() || !it->second.starved) continue;
      it->second.starved = false;
      enqueue(id, it->second);
    }
    starved_.clear();
  }
  void wake_waiters(const std::string& key) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    for (Id id : it->second) {
      auto c = conns_.find(id);
      if (c == conns_.end() || !c->second.waits) continue;
      c->second.waits = false;
      enqueue(id, c->second);
    }
    waiters_.erase(it);
  }
  inline void drop(Id id, bool tell);
  // Serves the connections queued by the last change, and those their requests woke, until none is left.
  void settle() {
    while (!ready_.empty()) {
      const Id id = ready_.front();
      ready_.pop_front();
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      it->second.queued = false;
      serve(id, it->second);
    }
  }

  std::string token_;
  StoreLimits limits_;
  RandomFn random_;
  std::map<std::string, std::string, std::less<>> data_;
  std::uint64_t bytes_ = 0;
  std::unordered_map<Id, Conn> conns_;
  Id next_id_ = 1;
  std::size_t handshakes_ = 0, ready_count_ = 0;
  std::deque<Id> hello_order_;  // connections in their handshake, oldest first (with stale entries)
  std::unordered_map<std::string, std::vector<Id>> waiters_;
  std::vector<Id> starved_;
  std::deque<Id> ready_;
  std::vector<Id> dropped_;
  std::uint64_t buffered_ = 0, shared_used_ = 0, peak_buffered_ = 0;
  TimePoint now_{}, next_scan_{};
};

inline StoreCore::Id StoreCore::open(TimePoint now) {
  now_ = now;
  while (handshakes_ >= limits_.max_handshakes && !hello_order_.empty()) {
    const Id oldest = hello_order_.front();
    hello_order_.pop_front();
    auto it = conns_.find(oldest);
    if (it != conns_.end() && it->second.stage != Stage::Ready) drop(oldest, true);
  }
  const Id id = next_id_++;
  Conn& c = conns_[id];
  c.deadline = now + limits_.handshake_timeout;
  c.since = c.out_since = now;
  random_(c.nonce, sizeof c.nonce);
  c.out.append(detail::kServerMagic);
  c.out += char(detail::kStoreProtocol);
  c.out += char(token_.empty() ? detail::kAuthOpen : detail::kAuthToken);
  c.out.append(reinterpret_cast<const char*>(c.nonce), sizeof c.nonce);
  ++handshakes_;
  hello_order_.push_back(id);
  recount(c);
  settle();
  return id;
}

inline std::size_t StoreCore::want_read(Id id) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return 0;
  const Conn& c = it->second;
  if (c.stage == Stage::Hello) return detail::kClientHelloBytes - c.in.size();
  if (c.stage == Stage::Closing || c.waits || c.starved || c.pending_out() >= limits_.connection_buffer) return 0;
  // Its own share, then what the shared buffer has left.
  const std::uint64_t own = c.held < limits_.connection_buffer ? limits_.connection_buffer - c.held : 0;
  const std::uint64_t shared = limits_.shared_buffer - shared_used_;
  return std::size_t(std::min<std::uint64_t>(own + shared, std::uint64_t(1) << 30));
}

inline void StoreCore::received(Id id, const char* p, std::size_t n, TimePoint now) {
  now_ = now;
  auto it = conns_.find(id);
  if (it == conns_.end() || n == 0) return;
  EMBER_CHECK(n <= want_read(id), "dist::StoreCore::received: ", n, " bytes, more than the ", want_read(id),
              " the connection may send now");
  Conn& c = it->second;
  if (c.in.empty()) c.since = now;
  c.in.append(p, n);
  if (c.stage == Stage::Hello) {
    if (c.in.size() == detail::kClientHelloBytes) hello(id, c);
    if (conns_.count(id)) recount(c);
  } else {
    serve(id, c);
  }
  settle();
}

inline void StoreCore::sent(Id id, std::size_t n) {
  auto it = conns_.find(id);
  if (it == conns_.end() || n == 0) return;
  Conn& c = it->second;
  const bool was_full = c.pending_out() >= limits_.connection_buffer;
  c.out_off += std::min(n, c.pending_out());
  c.out_since = now_;
  recount(c);
  if (c.stage == Stage::Closing && c.pending_out() == 0) drop(id, true);  // the refusal went out
  else if (was_full && c.pending_out() < limits_.connection_buffer) enqueue(id, c);
  settle();
}

inline void StoreCore::drop(Id id, bool tell) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (auto w = waiters_.find(c.waiting); c.waits && w != waiters_.end()) {
    std::erase(w->second, id);
    if (w->second.empty()) waiters_.erase(w);
  }
  if (c.stage == Stage::Ready) --ready_count_;
  else --handshakes_;
  buffered_ -= c.held;
  const bool freed = c.excess > 0;
  shared_used_ -= c.excess;
  conns_.erase(it);
  if (tell) dropped_.push_back(id);
  if (freed) wake_starved();
}

inline void StoreCore::tick(TimePoint now) {
  now_ = now;
  while (!hello_order_.empty()) {
    const Id id = hello_order_.front();
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second.stage != Stage::Ready && it->second.deadline > now) break;
    hello_order_.pop_front();
    if (it != conns_.end() && it->second.stage != Stage::Ready) drop(id, true);
  }
  if (now >= next_scan_) {
    next_scan_ = now + std::min<std::chrono::milliseconds>(std::chrono::seconds(1), limits_.request_timeout);
    std::vector<Id> late;
    for (const auto& [id, c] : conns_) {
      if (c.stage != Stage::Ready) continue;
      const bool stuck_in = !c.waits && !c.starved && !c.in.empty() && now - c.since >= limits_.request_timeout;
      const bool stuck_out = c.pending_out() > 0 && now - c.out_since >= limits_.request_timeout;
      if (stuck_in || stuck_out) late.push_back(id);
    }
    for (Id id : late) drop(id, true);
  }
  settle();
}

inline StoreCore::TimePoint StoreCore::next_deadline() const {
  TimePoint t = TimePoint::max();
  if (!hello_order_.empty()) {
    auto it = conns_.find(hello_order_.front());
    t = it != conns_.end() && it->second.stage != Stage::Ready ? it->second.deadline : now_;
  }
  if (ready_count_ > 0) t = std::min(t, next_scan_);
  return t;
}

inline void StoreCore::check_invariants() const {
  std::uint64_t bytes = 0;
  for (const auto& [k, v] : data_) bytes += k.size() + v.size();
  EMBER_CHECK(bytes == bytes_ && bytes <= limits_.max_store_bytes, "dist::StoreCore: counts ", bytes_,
              " bytes of keys and values, holds ", bytes, " (at most ", limits_.max_store_bytes, ")");
  std::uint64_t buffered = 0, shared = 0;
  std::size_t hello = 0, ready = 0;
  for (const auto& [id, c] : conns_) {
    const std::uint64_t held = c.in.size() + c.pending_out();
    EMBER_CHECK(held == c.held && excess_of(held) == c.excess, "dist::StoreCore: connection ", id, " holds ", held,
                " bytes, counted as ", c.held);
    buffered += held;
    shared += c.excess;
    (c.stage == Stage::Ready ? ready : hello) += 1;
    if (c.waits) {
      EMBER_CHECK(!data_.count(c.waiting), "dist::StoreCore: connection ", id, " still waits for a key that is set");
      auto w = waiters_.find(c.waiting);
      EMBER_CHECK(w != waiters_.end() && std::count(w->second.begin(), w->second.end(), id) == 1,
                  "dist::StoreCore: connection ", id, " waits but is not listed as waiting");
    }
  }
  EMBER_CHECK(buffered == buffered_ && shared == shared_used_ && shared <= limits_.shared_buffer &&
                  buffered <= buffered_bound(),
              "dist::StoreCore: buffers hold ", buffered, " bytes (", shared, " shared), counted as ", buffered_, " (",
              shared_used_, "), at most ", buffered_bound(), " (", limits_.shared_buffer, ")");
  EMBER_CHECK(hello == handshakes_ && ready == ready_count_ && hello <= limits_.max_handshakes &&
                  ready <= limits_.max_clients && ready_.empty(),
              "dist::StoreCore: ", hello, " handshakes and ", ready, " clients, counted as ", handshakes_, " and ",
              ready_count_, " (at most ", limits_.max_handshakes, " and ", limits_.max_clients, "), ", ready_.size(),
              " left unserved");
}

}  // namespace ember::dist

// The protocol (StoreCore::hello and StoreCore::serve), after the class it belongs to.
#include "ember/dist/detail/store_protocol.hpp"
