// ember — the rendezvous store: a small key-value server over TCP (rank 0 or the launcher serves it, as c10d's
// TCPStore) and its client. Ranks use it to meet (who is here, at which address), to exchange the ids the backends
// need (a shared-memory segment's name, an NCCL unique id) and to leave the reason of a failure for the others.
// Every operation has a deadline; a key that never appears is an error naming the key, not a hang.
//
// Wire format (little-endian): a request is u8 command, u32 key length, key, then for SET a u64 value length and the
// value, for ADD an i64; a reply is u8 status (0 ok, 1 missing, 2 refused), u64 length, payload. The server treats
// its input as untrusted: keys are at most 4 KiB, values at most 64 MiB, the whole store at most 1 GiB, and a client
// that breaks a limit is disconnected.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/socket.hpp"

namespace ember::dist {

namespace detail {
enum StoreCmd : std::uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kDel = 5, kWait = 6 };
enum StoreStatus : std::uint8_t { kOk = 0, kMissing = 1, kRefused = 2 };
inline constexpr std::size_t kMaxKey = 4096;
inline constexpr std::uint64_t kMaxValue = std::uint64_t(64) << 20;
inline constexpr std::uint64_t kMaxStoreBytes = std::uint64_t(1) << 30;
inline constexpr std::size_t kMaxStoreClients = 4096;

inline void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s += char((v >> (8 * i)) & 0xff);
}
inline void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s += char((v >> (8 * i)) & 0xff);
}
inline std::uint64_t get_le(const char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
}  // namespace detail

/// The server side of the store: listens on `port` (0 picks a free one; port() tells which) and answers clients on
/// a thread of its own until destroyed.
class StoreServer {
 public:
  explicit StoreServer(int port = 0) : listener_(Socket::listen(port, "dist::StoreServer")) {
    EMBER_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, "dist::StoreServer: pipe: ", detail::errno_message(errno));
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
  int port() const { return listener_.local_port(); }

 private:
  struct Client {
    Socket s;
    std::string in, out;
    std::size_t out_off = 0;
    bool blocked = false;  // a GET/WAIT waits for the key `waiting`
    std::string waiting;
    std::uint8_t waiting_cmd = 0;
    bool dead = false;
  };
  inline void run();
  inline void serve(Client& c);
  inline void reply(Client& c, std::uint8_t status, const std::string& payload);
  inline void wake_waiters(const std::string& key);

  Socket listener_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::map<std::string, std::string> data_;
  std::uint64_t bytes_ = 0;
  std::deque<Client> clients_;
};

inline void StoreServer::reply(Client& c, std::uint8_t status, const std::string& payload) {
  c.out += char(status);
  detail::put_u64(c.out, payload.size());
  c.out += payload;
}

inline void StoreServer::wake_waiters(const std::string& key) {
  for (Client& c : clients_) {
    if (c.dead || !c.blocked || c.waiting != key) continue;
    reply(c, detail::kOk, c.waiting_cmd == detail::kGet ? data_[key] : std::string());
    c.blocked = false;
    c.waiting.clear();
    serve(c);  // requests it sent after the one that waited
  }
}

// Parses and answers complete requests in c.in, stopping at one that must wait for a key.
inline void StoreServer::serve(Client& c) {
  std::size_t pos = 0;
  while (!c.blocked && !c.dead) {
    const std::size_t avail = c.in.size() - pos;
    const char* p = c.in.data() + pos;
    if (avail < 5) break;
    const auto cmd = std::uint8_t(p[0]);
    const std::uint64_t klen = detail::get_le(p + 1, 4);
    if (cmd < detail::kSet || cmd > detail::kWait || klen > detail::kMaxKey) {
      c.dead = true;
      break;
    }
    std::size_t need = 5 + klen;
    std::uint64_t vlen = 0;
    if (cmd == detail::kSet) {
      if (avail < need + 8) break;
      vlen = detail::get_le(p + need, 8);
      if (vlen > detail::kMaxValue) {
        c.dead = true;
        break;
      }
      need += 8 + vlen;
    } else if (cmd == detail::kAdd) {
      need += 8;
    }
    if (avail < need) break;
    std::string key(p + 5, klen);
    pos += need;
    switch (cmd) {
      case detail::kSet: {
        std::string value(p + 5 + klen + 8, vlen);
        auto it = data_.find(key);
        const std::uint64_t old = it == data_.end() ? 0 : key.size() + it->second.size();
        if (bytes_ - old + key.size() + vlen > detail::kMaxStoreBytes) {
          reply(c, detail::kRefused, "the store is full");
          break;
        }
        bytes_ = bytes_ - old + key.size() + vlen;
        data_[key] = std::move(value);
        reply(c, detail::kOk, {});
        wake_waiters(key);
        break;
      }
      case detail::kAdd: {
        const auto delta = std::int64_t(detail::get_le(p + 5 + klen, 8));
        std::string& v = data_[key];
        long long cur = 0;
        if (!v.empty() && !ember::detail::parse_int(v, cur)) {
          reply(c, detail::kRefused, "the value is not an integer");
          break;
        }
        const std::uint64_t old = v.size();
        v = std::to_string(static_cast<long long>(static_cast<std::uint64_t>(cur) + static_cast<std::uint64_t>(delta)));
        bytes_ = bytes_ - old + v.size() + (old == 0 ? key.size() : 0);
        reply(c, detail::kOk, v);
        wake_waiters(key);
        break;
      }
      case detail::kCheck: reply(c, data_.count(key) ? detail::kOk : detail::kMissing, {}); break;
      case detail::kDel: {
        auto it = data_.find(key);
        if (it == data_.end()) {
          reply(c, detail::kMissing, {});
        } else {
          bytes_ -= key.size() + it->second.size();
          data_.erase(it);
          reply(c, detail::kOk, {});
        }
        break;
      }
      case detail::kGet:
      case detail::kWait: {
        auto it = data_.find(key);
        if (it != data_.end()) {
          reply(c, detail::kOk, cmd == detail::kGet ? it->second : std::string());
        } else {
          c.blocked = true;
          c.waiting = std::move(key);
          c.waiting_cmd = cmd;
        }
        break;
      }
    }
  }
  c.in.erase(0, pos);
  if (c.in.size() > detail::kMaxValue + detail::kMaxKey + 64) c.dead = true;  // (cannot happen: parsed as it comes)
}

inline void StoreServer::run() {
  listener_.set_nonblocking(true);
  std::vector<pollfd> fds;
  char buf[1 << 16];
  for (;;) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (Client& c : clients_)
      fds.push_back({c.s.fd(), short(POLLIN | (c.out.size() > c.out_off ? POLLOUT : 0)), 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        if (clients_.size() >= detail::kMaxStoreClients) {
          ::close(fd);
          continue;
        }
        clients_.emplace_back();
        clients_.back().s = Socket(fd);
        clients_.back().s.set_nodelay();
      }
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      Client& c = clients_[i - 2];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          const ssize_t r = ::recv(c.s.fd(), buf, sizeof buf, MSG_DONTWAIT);
          if (r > 0) {
            c.in.append(buf, std::size_t(r));
            if (r < ssize_t(sizeof buf)) break;
          } else {
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.dead = true;
            break;
          }
        }
        if (!c.dead) serve(c);
      }
      if (!c.dead && c.out.size() > c.out_off) {
        const ssize_t w = ::send(c.s.fd(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) c.out_off += std::size_t(w);
        else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.dead = true;
        if (c.out_off == c.out.size()) {
          c.out.clear();
          c.out_off = 0;
        }
      }
    }
    // Replies queued for other clients by this round's SETs go out on the next round (POLLOUT).
    std::erase_if(clients_, [](const Client& c) { return c.dead; });
  }
}

/// A client of the store. Operations from several threads are serialised. A GET or WAIT that times out leaves the
/// connection mid-request; the next operation opens a new one.
class Store {
 public:
  /// Connects to host:port, retrying until `timeout` (the server may start after this process).
  Store(std::string host, int port, std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : host_(std::move(host)), port_(port), timeout_(timeout) {
    std::lock_guard<std::mutex> lk(mu_);
    connect_locked(deadline_in(timeout_));
  }

  void set(const std::string& key, const std::string& value) {
    std::string payload;
    detail::put_u64(payload, value.size());
    payload += value;
    request(detail::kSet, key, payload, "set", timeout_);
  }
  /// The value of `key`, waiting until some rank sets it (or the timeout passes: an error naming the key).
  std::string get(const std::string& key) { return get(key, timeout_); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    return request(detail::kGet, key, {}, "get", timeout).second;
  }
  /// Adds `delta` to the integer at `key` (0 when absent) and returns the sum.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::string payload;
    detail::put_u64(payload, std::uint64_t(delta));
    const std::string v = request(detail::kAdd, key, payload, "add", timeout_).second;
    long long sum = 0;
    EMBER_CHECK(ember::detail::parse_int(v, sum), "dist::Store::add(", ember::detail::quote_untrusted(key), ") at ",
                address(), ": the store answered ", ember::detail::quote_untrusted(v), ", not an integer");
    return sum;
  }
  bool check(const std::string& key) { return request(detail::kCheck, key, {}, "check", timeout_).first; }
  bool remove(const std::string& key) { return request(detail::kDel, key, {}, "delete", timeout_).first; }
  /// Waits until every key exists.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
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
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void connect_locked(Deadline d) {
    s_ = Socket::connect(host_, port_, d, "dist::Store: connecting to the store at " + address());
    broken_ = false;
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
    if (head[0] == detail::kRefused) detail::fail(ctx, "the store refused the request: " + out);
    return {head[0] == detail::kOk, std::move(out)};
  }

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  Socket s_;
  bool broken_ = false;
};

}  // namespace ember::dist
