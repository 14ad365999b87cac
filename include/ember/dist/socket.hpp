// ember — TCP sockets for the collective layer: listening, connecting with retries until a deadline, and moving bytes
// with deadlines or without blocking. A failure is an ember::Error that starts with what the caller was doing (the
// `ctx` argument: "all_reduce: sending to rank 1"), then what went wrong ("the peer closed the connection").
// POSIX only.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include "ember/config.hpp"

namespace ember::dist {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// Milliseconds left until `d` (0 when it has passed), capped at `cap_ms` (for poll's int timeout).
inline int ms_until(Deadline d, int cap_ms = 1 << 30) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, cap_ms));
}
/// A deadline `timeout` from now that does not overflow for huge timeouts.
inline Deadline deadline_in(std::chrono::milliseconds timeout) {
  const auto cap = std::chrono::hours(24 * 365);
  return Clock::now() + std::min<std::chrono::milliseconds>(timeout, cap);
}
/// "2.5 s", "300 ms": a duration as messages print it.
inline std::string duration_str(std::chrono::milliseconds d) {
  const long long ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

namespace detail {
inline std::string errno_message(int e) { return std::error_code(e, std::generic_category()).message(); }
[[noreturn, gnu::cold]] inline void fail(const std::string& ctx, const std::string& why) {
  throw Error(ctx + ": " + why);
}
}  // namespace detail

/// An owned socket descriptor (move-only).
class Socket {
 public:
  Socket() = default;
  /// Takes ownership of descriptor fd.
  explicit Socket(int fd) : fd_(fd) {}
  /// Takes o's descriptor, leaving o invalid.
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  /// Closes this socket's descriptor and takes o's.
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  /// The descriptor (-1 when invalid).
  int fd() const { return fd_; }
  /// Whether it holds a descriptor.
  bool valid() const { return fd_ >= 0; }
  /// Closes the descriptor (nothing when invalid).
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  /// Stops both directions now (peers see the end of the stream) without giving up the descriptor.
  void shutdown() const {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }

  /// A socket listening on every interface (IPv6 and IPv4 where the host has both) at `port`; 0 picks a free port.
  inline static Socket listen(int port, const std::string& ctx, int backlog = 128);
  /// A socket listening on `host` (a numeric address or a name of this host, the first of its addresses that can be
  /// bound) at `port`. "" and "::" listen on every interface of both families, "0.0.0.0" on every IPv4 one.
  inline static Socket listen(const std::string& host, int port, const std::string& ctx, int backlog = 128);
  /// A connection to host:port, retried (the listener may not be up yet) until `deadline`.
  inline static Socket connect(const std::string& host, int port, Deadline deadline,
                                            const std::string& ctx);
  /// The next connection on a listening socket, waiting until `deadline`.
  inline Socket accept(Deadline deadline, const std::string& ctx) const;
  /// A connection waiting on a non-blocking listening socket, itself non-blocking; an invalid Socket when none is.
  inline Socket try_accept() const;

  /// The port this socket is bound to.
  inline int local_port() const;
  /// The numeric address of this end of a connected socket ("10.0.0.3", "::1"), the one its peer reaches it by; of
  /// a listening socket, the address it listens on ("::" for every interface).
  inline std::string local_address() const;
  /// Whether this end is bound to a loopback address (127.0.0.0/8, ::1), which only this host reaches.
  inline bool is_loopback() const;

  /// Switches O_NONBLOCK on or off.
  void set_nonblocking(bool on) const {
    const int fl = ::fcntl(fd_, F_GETFL, 0);
    ::fcntl(fd_, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
  }
  /// Turns off Nagle's algorithm (TCP_NODELAY): small messages go out at once.
  void set_nodelay() const {
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  /// Sends what the kernel takes now (the socket must be non-blocking): the number of bytes, possibly 0.
  inline std::size_t send_some(const void* p, std::size_t n, const std::string& ctx) const;
  /// Receives what has arrived (non-blocking socket): the number of bytes, possibly 0; the end of the stream is an
  /// error ("the peer closed the connection").
  inline std::size_t recv_some(void* p, std::size_t n, const std::string& ctx) const;
  /// All n bytes, waiting (poll) until `deadline`; works on blocking and non-blocking sockets.
  inline void send_all(const void* p, std::size_t n, Deadline deadline, const std::string& ctx) const;
  /// Receives exactly n bytes, waiting (poll) until `deadline`; the end of the stream first is an error.
  inline void recv_all(void* p, std::size_t n, Deadline deadline, const std::string& ctx) const;
  /// Waits until the socket is readable (or has an error pending): false when `deadline` passes first.
  bool wait_readable(Deadline deadline) const { return wait(POLLIN, deadline); }
  /// Waits until one of `events` (POLLIN, POLLOUT) is ready, or an error is pending: false when `deadline` passes.
  bool wait(short events, Deadline deadline) const {
    for (;;) {
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, ms_until(deadline));
      if (r > 0) return true;
      if (r == 0) return false;
      if (errno != EINTR) return true;  // let the following call report the error
    }
  }

 private:
  int fd_ = -1;
};

inline Socket Socket::listen(int port, const std::string& ctx, int backlog) {
  EMBER_CHECK(port >= 0 && port <= 65535, ctx, ": invalid port ", port, " (expected 0..65535)");
  // Dual-stack IPv6 first; IPv4 where the host has no IPv6.
  for (int family : {AF_INET6, AF_INET}) {
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) continue;
    const int one = 1, zero = 0;
    ::setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (family == AF_INET6) {
      ::setsockopt(s.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(std::uint16_t(port));
      rc = ::bind(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(std::uint16_t(port));
      rc = ::bind(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0) {
      const int e = errno;
      if (family == AF_INET6 && (e == EAFNOSUPPORT || e == EADDRNOTAVAIL)) continue;
      detail::fail(ctx, "cannot listen on port " + std::to_string(port) + ": " + detail::errno_message(e) +
                            (e == EADDRINUSE ? " (another program, or an earlier run, holds it; choose another "
                                               "MASTER_PORT)"
                                             : ""));
    }
    if (::listen(s.fd_, backlog) != 0) detail::fail(ctx, "listen: " + detail::errno_message(errno));
    return s;
  }
  detail::fail(ctx, "cannot create a TCP socket: " + detail::errno_message(errno));
}

inline Socket Socket::listen(const std::string& host, int port, const std::string& ctx, int backlog) {
  if (host.empty() || host == "::") return listen(port, ctx, backlog);
  EMBER_CHECK(port >= 0 && port <= 65535, ctx, ": invalid port ", port, " (expected 0..65535)");
  const std::string where = ember::detail::quote_untrusted(host) + " port " + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) detail::fail(ctx, "cannot listen on " + where + ": cannot resolve it: " + ::gai_strerror(gai));
  int last = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) ::setsockopt(s.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(s.fd_, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd_, backlog) != 0) {
      last = errno;
      continue;
    }
    ::freeaddrinfo(res);
    return s;
  }
  if (res) ::freeaddrinfo(res);
  detail::fail(ctx, "cannot listen on " + where + ": " + detail::errno_message(last) +
                        (last == EADDRNOTAVAIL ? " (it is not an address of this host)"
                         : last == EADDRINUSE  ? " (another program, or an earlier run, holds the port; choose "
                                                 "another MASTER_PORT)"
                                               : ""));
}

inline Socket Socket::connect(const std::string& host, int port, Deadline deadline,
                                           const std::string& ctx) {
  EMBER_CHECK(port > 0 && port <= 65535, ctx, ": invalid port ", port, " (expected 1..65535)");
  const std::string where = host + ":" + std::to_string(port);
  std::string last = "no attempt";
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve the host name: ") + ::gai_strerror(gai);
      if (gai != EAI_AGAIN) detail::fail(ctx, "connecting to " + where + ": " + last);
    }
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!s.valid()) {
        last = detail::errno_message(errno);
        continue;
      }
      s.set_nonblocking(true);
      int rc = ::connect(s.fd_, ai->ai_addr, ai->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        if (!s.wait(POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(5)))) {
          last = "the connection attempt timed out";
          continue;
        }
        socklen_t len = sizeof err;
        ::getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0) {
        ::freeaddrinfo(res);
        s.set_nonblocking(false);
        s.set_nodelay();
        return s;
      }
      last = detail::errno_message(err);
    }
    if (res) ::freeaddrinfo(res);
    if (Clock::now() + pause >= deadline)
      detail::fail(ctx, "could not connect to " + where + " before the timeout (last error: " + last + ")");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

inline Socket Socket::accept(Deadline deadline, const std::string& ctx) const {
  for (;;) {
    if (!wait(POLLIN, deadline)) detail::fail(ctx, "timed out waiting for a peer to connect");
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket s(fd);
      s.set_nodelay();
      return s;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      detail::fail(ctx, "accept: " + detail::errno_message(errno));
  }
}

inline Socket Socket::try_accept() const {
  for (;;) {
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Socket s(fd);
      s.set_nodelay();
      return s;
    }
    if (errno != EINTR && errno != ECONNABORTED) return Socket();
  }
}

inline int Socket::local_port() const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

inline std::string Socket::local_address() const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  char buf[INET6_ADDRSTRLEN] = {};
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "127.0.0.1";
  if (a.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {  // "::ffff:10.0.0.3" -> "10.0.0.3"
      in_addr v4;
      std::memcpy(&v4, a6->sin6_addr.s6_addr + 12, 4);
      ::inet_ntop(AF_INET, &v4, buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    }
  } else {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
  }
  return buf;
}

inline bool Socket::is_loopback() const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& x = reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&x) || (IN6_IS_ADDR_V4MAPPED(&x) && x.s6_addr[12] == 127);
}

inline std::size_t Socket::send_some(const void* p, std::size_t n, const std::string& ctx) const {
  for (;;) {
    const ssize_t r = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) return std::size_t(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == EPIPE || errno == ECONNRESET)
      detail::fail(ctx, "the peer closed the connection (" + detail::errno_message(errno) + ")");
    detail::fail(ctx, "send: " + detail::errno_message(errno));
  }
}

inline std::size_t Socket::recv_some(void* p, std::size_t n, const std::string& ctx) const {
  if (n == 0) return 0;
  for (;;) {
    const ssize_t r = ::recv(fd_, p, n, MSG_DONTWAIT);
    if (r > 0) return std::size_t(r);
    if (r == 0) detail::fail(ctx, "the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == ECONNRESET) detail::fail(ctx, "the peer closed the connection (connection reset)");
    detail::fail(ctx, "recv: " + detail::errno_message(errno));
  }
}

inline void Socket::send_all(const void* p, std::size_t n, Deadline deadline,
                                          const std::string& ctx) const {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const std::size_t k = send_some(c, n, ctx);
    c += k;
    n -= k;
    if (n > 0 && k == 0 && !wait(POLLOUT, deadline)) detail::fail(ctx, "timed out sending");
  }
}

inline void Socket::recv_all(void* p, std::size_t n, Deadline deadline, const std::string& ctx) const {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const std::size_t k = recv_some(c, n, ctx);
    c += k;
    n -= k;
    if (n > 0 && k == 0 && !wait(POLLIN, deadline)) detail::fail(ctx, "timed out waiting for data");
  }
}

}  // namespace ember::dist
