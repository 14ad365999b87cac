// ember — the rendezvous store: a small key-value server over TCP (rank 0 or the launcher serves it, as c10d's
// TCPStore) and its client. Ranks use it to meet (who is here, at which address), to exchange the ids the backends
// need (a shared-memory segment's name, an NCCL unique id) and to leave the reason of a failure for the others.
// Every operation has a deadline; a key that never appears is an error naming the key, not a hang.
//
// The server listens on one address (loopback unless told otherwise). With a token (the job's shared secret), a
// connection is served only once it proved it knows the token, and the client checks that the server knows it too
// (dist/detail/auth.hpp); without one, any client that speaks the protocol is served. The wire format and the
// server's bounds are described in dist/store_core.hpp.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/detail/auth.hpp"
#include "ember/dist/socket.hpp"
#include "ember/dist/store_core.hpp"

namespace ember::dist {

/// The options of dist::StoreServer, the server side of torch.distributed.TCPStore (its is_master=True end):
/// ```
/// dist::StoreServer server({.host = "0.0.0.0", .port = 29500, .token = secret});
/// ```
struct StoreServerOptions {
  /// Where to listen: a numeric address or a name of this host; "0.0.0.0" listens on every IPv4 interface, "::" on
  /// every interface of both families. PyTorch: host_name.
  std::string host = "127.0.0.1";
  /// The TCP port; 0 picks a free one (port() tells which).
  int port = 0;
  /// The job's shared secret; "" serves every client (open mode).
  std::string token{};
  /// What the server allows its clients (memory, connections, timeouts).
  StoreLimits limits{};
};

/// The server side of the store: listens and answers clients on a thread of its own until destroyed.
class StoreServer {
 public:
  /// Listens on 127.0.0.1:`port` without a token.
  explicit StoreServer(int port = 0) : StoreServer(StoreServerOptions{.port = port}) {}
  /// Listens as `o` says (host, port, token, limits).
  explicit StoreServer(StoreServerOptions o)
      : listener_(Socket::listen(o.host, o.port, "dist::StoreServer")), core_(std::move(o.token), o.limits) {
    EMBER_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, "dist::StoreServer: pipe: ", detail::errno_message(errno));
    publish();
    thread_ = std::thread([this] { run(); });
  }
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  ~StoreServer() {
    const char c = 0;
    [[maybe_unused]] ssize_t r = ::write(wake_[1], &c, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  /// The port it listens on (the one chosen when 0 was asked for).
  int port() const { return listener_.local_port(); }
  /// The numeric address it listens on ("127.0.0.1"; "::" or "0.0.0.0" for every interface).
  std::string address() const { return listener_.local_address(); }
  /// Whether only this host can reach it (it listens on a loopback address).
  bool loopback_only() const { return listener_.is_loopback(); }

  /// The server's counts, as of its last round (for tests and monitoring; see StoreCore).
  struct Stats {
    ///@{
    /// StoreCore's bytes_used, buffered_bytes, peak_buffered_bytes and buffered_bound.
    std::uint64_t bytes_used = 0, buffered_bytes = 0, peak_buffered_bytes = 0, buffered_bound = 0;
    ///@}
    ///@{
    /// StoreCore's connections and handshakes.
    std::size_t connections = 0, handshakes = 0;
    ///@}
  };
  /// The counts as of the server's last round.
  Stats stats() const {
    std::lock_guard<std::mutex> lk(stats_mu_);
    return stats_;
  }

 private:
  inline void run();
  void publish() {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_ = {core_.bytes_used(), core_.buffered_bytes(), core_.peak_buffered_bytes(), core_.buffered_bound(),
              core_.connections(), core_.handshakes()};
  }

  Socket listener_;
  StoreCore core_;
  std::unordered_map<StoreCore::Id, Socket> socks_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  mutable std::mutex stats_mu_;
  Stats stats_;
};

inline void StoreServer::run() {
  listener_.set_nonblocking(true);
  std::vector<pollfd> fds;
  std::vector<StoreCore::Id> ids;
  static constexpr std::size_t kChunk = std::size_t(1) << 16;
  std::unique_ptr<char[]> buf(new char[kChunk]);
  auto close_dropped = [&] {
    for (StoreCore::Id id : core_.take_dropped()) socks_.erase(id);
  };
  // Sends what the kernel takes of the connection's output; false when the connection failed.
  auto flush = [&](StoreCore::Id id, const Socket& s) {
    for (;;) {
      const std::string_view out = core_.output(id);
      if (out.empty()) return true;
      const ssize_t w = ::send(s.fd(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        core_.sent(id, std::size_t(w));
        continue;
      }
      return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
  };
  for (;;) {
    core_.tick(Clock::now());
    close_dropped();
    publish();
    fds.clear();
    ids.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (const auto& [id, s] : socks_) {
      // A connection that may not send more is still watched for hanging up.
      const short ev = short((core_.want_read(id) > 0 ? POLLIN : POLLRDHUP) | (core_.output(id).empty() ? 0 : POLLOUT));
      fds.push_back({s.fd(), ev, 0});
      ids.push_back(id);
    }
    const auto next = core_.next_deadline();
    const int wait_ms = next == StoreCore::TimePoint::max() ? -1 : std::max(1, ms_until(next, 1000));
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (int k = 0; k < 256; ++k) {  // a burst of connections does not hold up the served ones
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        Socket s(fd);
        s.set_nodelay();
        const StoreCore::Id id = core_.open(Clock::now());
        close_dropped();  // the oldest handshake, when too many wait
        if (flush(id, s)) socks_.emplace(id, std::move(s));
        else core_.close(id);
      }
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      const StoreCore::Id id = ids[i - 2];
      auto it = socks_.find(id);
      if (it == socks_.end()) continue;  // dropped meanwhile
      const int fd = it->second.fd();
      bool gone = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLRDHUP)) {
        std::size_t want = std::min(core_.want_read(id), kChunk);
        if (want == 0) {
          gone = (fds[i].revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0;
        } else {
          const ssize_t r = ::recv(fd, buf.get(), want, MSG_DONTWAIT);
          if (r > 0) core_.received(id, buf.get(), std::size_t(r), Clock::now());
          else gone = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        }
      }
      if (!gone && core_.alive(id)) gone = !flush(id, it->second);
      if (gone) {
        core_.close(id);
        socks_.erase(id);
      }
      close_dropped();
    }
    // Replies queued by this round for connections served earlier in it: sent now where the kernel takes them.
    for (auto& [id, s] : socks_)
      if (!core_.output(id).empty() && !flush(id, s)) core_.close(id), s.close();
    std::erase_if(socks_, [](const auto& kv) { return !kv.second.valid(); });
    close_dropped();
  }
}

/// A client of the store. Operations from several threads are serialised. A GET or WAIT that times out leaves the
/// connection mid-request; the next operation opens a new one.
class Store {
 public:
  /// Connects to host:port, retrying until `timeout` (the server may start after this process). With a `token`, the
  /// client proves it knows the token and requires the server to prove it too; without one, it expects a store in
  /// open mode.
  Store(std::string host, int port, std::chrono::milliseconds timeout = std::chrono::minutes(5), std::string token = {})
      : host_(std::move(host)), port_(port), timeout_(timeout), token_(std::move(token)) {
    if (!token_.empty()) detail::check_token(token_, "dist::Store: the token");
    std::lock_guard<std::mutex> lk(mu_);
    connect_locked(deadline_in(timeout_));
  }

  /// Sets `key` to `value` (TCPStore.set).
  void set(const std::string& key, const std::string& value) {
    std::string payload;
    detail::put_u64(payload, value.size());
    payload += value;
    request(detail::kSet, key, payload, "set", timeout_);
  }
  /// The value of `key`, waiting until some rank sets it (or the timeout passes: an error naming the key).
  std::string get(const std::string& key) { return get(key, timeout_); }
  /// get(key) with its own timeout.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    return request(detail::kGet, key, {}, "get", timeout).second;
  }
  /// Adds `delta` to the integer at `key` (0 when absent) and returns the sum.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::string payload;
    detail::put_u64(payload, std::uint64_t(delta));
    const auto answer = request(detail::kAdd, key, payload, "add", timeout_);
    const std::string& v = answer.second;
    long long sum = 0;
    EMBER_CHECK(ember::detail::parse_int(v, sum), "dist::Store::add(", ember::detail::quote_untrusted(key), ") at ",
                address(), ": the store answered ", ember::detail::quote_untrusted(v), ", not an integer");
    return sum;
  }
  /// Whether `key` exists, without waiting (TCPStore.check).
  bool check(const std::string& key) { return request(detail::kCheck, key, {}, "check", timeout_).first; }
  /// Deletes `key`; whether it existed (TCPStore.delete_key).
  bool remove(const std::string& key) { return request(detail::kDel, key, {}, "delete", timeout_).first; }
  /// Waits until every key exists.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  /// wait(keys) with its own timeout.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const Deadline d = deadline_in(timeout);
    for (const auto& k : keys)
      request(detail::kWait, k, {}, "wait", std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()));
  }
  /// "host:port".
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  /// This host's address as the store's server sees it (the interface that reaches it).
  std::string local_address() {
    std::lock_guard<std::mutex> lk(mu_);
    return s_.local_address();
  }
  /// The default timeout of every request.
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  // Connects and authenticates; a connection the server closes during the handshake (it was busy with others) is
  // tried again until the deadline.
  void connect_locked(Deadline d) {
    const std::string ctx = "dist::Store: connecting to the store at " + address();
    auto pause = std::chrono::milliseconds(5);
    for (;;) {
      s_ = Socket::connect(host_, port_, d, ctx);
      if (handshake_locked(d, ctx)) break;
      if (Clock::now() + pause >= d)
        detail::fail(ctx, "the store closed the connection during the handshake, each time until the timeout");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(250));
    }
    broken_ = false;
  }
  // false when the connection was lost before the server answered (worth another try); an error when the server
  // refused, failed its proof, or is no ember store.
  bool handshake_locked(Deadline d, const std::string& ctx) {
    char hello[detail::kServerHelloBytes];
    char head[detail::kReplyHead];
    std::string answer;
    unsigned char nonce_c[detail::kNonceBytes];
    detail::random_bytes(nonce_c, sizeof nonce_c);
    const auto* nonce_s = reinterpret_cast<const unsigned char*>(hello + 6);
    try {
      s_.recv_all(hello, sizeof hello, d, ctx);
      if (std::string_view(hello, 4) != detail::kServerMagic || hello[4] != char(detail::kStoreProtocol))
        detail::fail(ctx, "the peer does not answer as this version of ember's store (it sent " +
                              ember::detail::quote_untrusted(std::string_view(hello, sizeof hello)) + ")");
      const auto mode = std::uint8_t(hello[5]);
      if (mode == detail::kAuthToken && token_.empty())
        detail::fail(ctx, "the store requires the job's token: set EMBER_DIST_TOKEN to it on every rank (ember-run "
                          "sets it for the ranks it starts)");
      if (mode == detail::kAuthOpen && !token_.empty())
        detail::fail(ctx, "the store does not ask for a token, but this process has one (EMBER_DIST_TOKEN), so the "
                          "store cannot prove it is the job's: it was started without the token, or another program "
                          "listens on this port");
      EMBER_CHECK(mode == detail::kAuthOpen || mode == detail::kAuthToken, ctx, ": the store asks for an unknown "
                  "kind of authentication (", int(mode), ")");
      std::string msg(detail::kClientMagic);
      msg.append(reinterpret_cast<const char*>(nonce_c), sizeof nonce_c);
      detail::Digest proof{};
      if (!token_.empty()) proof = detail::client_proof(token_, nonce_s, nonce_c);
      msg.append(reinterpret_cast<const char*>(proof.data()), proof.size());
      s_.send_all(msg.data(), msg.size(), d, ctx);
      s_.recv_all(head, sizeof head, d, ctx);
      const std::uint64_t n = detail::get_le(head + 1, 8);
      EMBER_CHECK(n <= detail::kMaxKey, ctx, ": the store answered the handshake with ", n, " bytes (at most ",
                  detail::kMaxKey, ")");
      answer.resize(n);
      s_.recv_all(answer.data(), n, d, ctx);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("the peer closed the connection") == std::string::npos || Clock::now() >= d) throw;
      return false;
    }
    if (head[0] == char(detail::kRefused))
      detail::fail(ctx, "the store refused the connection: " + ember::detail::quote_untrusted(answer));
    EMBER_CHECK(head[0] == char(detail::kOk) && answer.size() == sizeof(detail::Digest), ctx,
                ": the store answered the handshake with status ", int(std::uint8_t(head[0])), " and ", answer.size(),
                " bytes (expected ok and a 32-byte proof)");
    if (!token_.empty()) {
      const detail::Digest want = detail::server_proof(token_, nonce_s, nonce_c);
      if (!detail::equal_constant_time(want.data(), answer.data(), want.size()))
        detail::fail(ctx, "the store could not prove it knows the job's token (EMBER_DIST_TOKEN): it is not this "
                          "job's store");
    }
    return true;
  }
  // (found, payload) for status ok/missing; an error for refused, timeouts and lost connections.
  std::pair<bool, std::string> request(std::uint8_t cmd, const std::string& key, const std::string& payload,
                                       const char* op, std::chrono::milliseconds timeout) {
    EMBER_CHECK(key.size() <= detail::kMaxKey, "dist::Store::", op, ": key of ", key.size(), " bytes (at most ",
                detail::kMaxKey, ")");
    const std::string ctx = std::string("dist::Store::") + op + "(" + ember::detail::quote_untrusted(key) +
                            ") at " + address();
    std::lock_guard<std::mutex> lk(mu_);
    const Deadline d = deadline_in(std::max(timeout, std::chrono::milliseconds(0)));
    if (broken_) connect_locked(d);
    std::string msg;
    msg += char(cmd);
    detail::put_u32(msg, std::uint32_t(key.size()));
    msg += key;
    msg += payload;
    broken_ = true;  // until the reply is read in full
    s_.send_all(msg.data(), msg.size(), d, ctx);
    char head[9];
    if (!s_.wait_readable(d)) {
      detail::fail(ctx, cmd == detail::kGet || cmd == detail::kWait
                            ? "timed out after " + duration_str(timeout) + " waiting for the key to be set"
                            : "timed out after " + duration_str(timeout) + " waiting for the store to answer");
    }
    s_.recv_all(head, sizeof head, d, ctx);
    const std::uint64_t n = detail::get_le(head + 1, 8);
    EMBER_CHECK(n <= detail::kMaxValue, ctx, ": the store answered with ", n, " bytes (at most ", detail::kMaxValue,
                ")");
    std::string out(n, '\0');
    s_.recv_all(out.data(), n, d, ctx);
    broken_ = false;
    if (head[0] == detail::kRefused)
      detail::fail(ctx, "the store refused the request: " + ember::detail::quote_untrusted(out));
    return {head[0] == detail::kOk, std::move(out)};
  }

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string token_;
  std::mutex mu_;
  Socket s_;
  bool broken_ = false;
};

}  // namespace ember::dist
