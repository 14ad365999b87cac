// ember — the TCP backend, for ranks on any hosts: the same ring as the shm backend over two connections per rank
// (to the next rank, from the previous one), non-blocking, driven by the group's progress thread with poll(). Chunks
// are sent while earlier ones are still being reduced, so the network, the kernel's buffers and the reduction
// overlap. A peer that closes its connections (it failed, it aborted, its process died) makes this rank fail at once,
// quoting the reason the peer left in the store when it left one. Each rank listens on the address it announces (not
// on every interface) and takes the previous rank's connection only once it has proven the job's token and its rank
// (dist/detail/tcp_greeting.hpp).
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/detail/auth.hpp"
#include "ember/dist/detail/ring.hpp"
#include "ember/dist/detail/tcp_greeting.hpp"
#include "ember/dist/socket.hpp"

namespace ember::dist {

namespace detail {

/// Received bytes not yet used: [b, e) of buf. It outlives each collective (a read may take the first bytes of the
/// next one, which the previous rank may already have sent).
struct TcpStage {
  std::vector<char> buf = std::vector<char>(std::size_t(2) << 20);
  std::size_t b = 0, e = 0;
};

/// The ring engine's channel over two sockets; received bytes that are reduced pass through the staging buffer.
class TcpChannel {
 public:
  static constexpr bool kWritesInPlace = false;  // (sockets copy anyway)
  TcpChannel(const Socket& out, const Socket& in, TcpStage& stage, int next, int prev, Bootstrap* boot,
             CallContext ctx)
      : out_(out), in_(in), st_(stage), next_(next), prev_(prev), boot_(boot), ctx_(ctx) {}

  int token() const { return 0; }

  std::size_t send_some(const char* p, std::size_t n) {
    try {
      return out_.send_some(p, n, {});
    } catch (const Error& e) {
      peer_failed(e, ": sending to rank " + std::to_string(next_));
    }
  }
  std::size_t recv_into(char* dst, std::size_t n) {
    std::size_t got = std::min(n, st_.e - st_.b);
    std::memcpy(dst, st_.buf.data() + st_.b, got);
    st_.b += got;
    if (got < n) got += recv(dst + got, n - got);
    return got;
  }
  std::pair<const char*, std::size_t> recv_view() {
    const std::size_t cap = st_.buf.size();
    if (st_.b == st_.e) {
      st_.b = st_.e = 0;
    } else if (st_.b > 0 && cap - st_.e < 64) {  // a partial element at the end: move what is left to the front
      std::memmove(st_.buf.data(), st_.buf.data() + st_.b, st_.e - st_.b);
      st_.e -= st_.b;
      st_.b = 0;
    }
    if (st_.e < cap) st_.e += recv(st_.buf.data() + st_.e, cap - st_.e);
    return {st_.buf.data() + st_.b, st_.e - st_.b};
  }
  std::size_t available() const { return st_.e - st_.b; }
  void consume(std::size_t n) { st_.b += n; }

  void wait(int, bool want_send, bool want_recv, Deadline deadline, const RingProgress& prog) {
    pollfd fds[2];
    int n = 0;
    if (want_send) fds[n++] = {out_.fd(), POLLOUT, 0};
    if (want_recv) fds[n++] = {in_.fd(), POLLIN, 0};
    if (n == 0) {  // (cannot happen: there is always something to send or to receive)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      return;
    }
    for (;;) {
      const int r = ::poll(fds, nfds_t(n), ms_until(deadline, 100));
      if (r > 0 || (r < 0 && errno != EINTR)) return;  // ready, or an error the next call reports
      if (Clock::now() >= deadline)
        detail::fail(ctx_.str(), "timed out waiting for rank " + std::to_string(prev_) + " or rank " +
                               std::to_string(next_) + " (" + prog.str() + ")");
    }
  }

 private:
  std::size_t recv(char* dst, std::size_t n) {
    try {
      return in_.recv_some(dst, n, {});
    } catch (const Error& e) {
      peer_failed(e, ": receiving from rank " + std::to_string(prev_));
    }
  }
  // (The socket's message starts with ": ", its context being empty.)
  [[noreturn]] void peer_failed(const Error& e, const std::string& where) {
    std::string why = boot_ ? boot_->read_abort() : std::string();
    throw Error(ctx_.str() + where + e.what() +
                (why.empty() ? " (it failed, aborted the group or exited)" : " (" + why + ")"));
  }

  const Socket& out_;
  const Socket& in_;
  TcpStage& st_;
  int next_, prev_;
  Bootstrap* boot_;
  CallContext ctx_;
};

}  // namespace detail

/// The TCP backend. `boot` must outlive it (the process group owns both). It listens on `local_address`, the address
/// it announces to the other ranks (the one this host reaches the store from: loopback when every rank is on this
/// host), and greets its ring connections with the job's `token` (dist/detail/tcp_greeting.hpp; "" for none).
class TcpCollectives final : public detail::RingCollectives<TcpCollectives> {
 public:
  /// Rank `rank` of `world`: connects the ring (to the next rank, from the previous one), both ends greeted.
  TcpCollectives(int rank, int world, std::shared_ptr<Bootstrap> boot, std::string local_address,
                 std::chrono::milliseconds timeout, const std::string& token)
      : RingCollectives(rank, world, timeout), boot_(std::move(boot)) {
    const std::string ctx = "dist: setting up the tcp backend (rank " + std::to_string(rank) + " of " +
                            std::to_string(world) + ")";
    if (!token.empty()) detail::check_token(token, ctx + ": the token");
    const Deadline d = deadline_in(timeout);
    Socket listener = Socket::listen(local_address, 0, ctx);
    listen_address_ = listener.local_address();
    const auto addrs =
        boot_->all_gather(local_address + " " + std::to_string(listener.local_port()), "tcp addresses", d);
    const int next = (rank + 1) % world;
    const std::string& a = addrs[std::size_t(next)];
    const auto sp = a.rfind(' ');
    long long port = -1;
    EMBER_CHECK(sp != std::string::npos && sp > 0 &&
                    ember::detail::parse_int(std::string_view(a).substr(sp + 1), port) && port > 0 && port < 65536,
                ctx, ": rank ", next, " announced an invalid address ", ember::detail::quote_untrusted(a));
    // Both connections at once: each rank connects to the next one while it greets whoever connects to it, and takes
    // the previous rank's connection once it has proven who it is.
    auto links = detail::RingGreeting(listener, a.substr(0, sp), int(port), rank, world,
                                      detail::ring_group_digest(addrs), token, d, ctx)
                     .run();
    out_ = std::move(links.out);
    in_ = std::move(links.in);
    out_.set_nonblocking(true);
    in_.set_nonblocking(true);
  }
  ~TcpCollectives() override { stop(); }
  /// The backend's name, as ProcessGroup::backend() reports it.
  const char* name() const override { return "tcp"; }
  /// The numeric address the ring's listener was bound to ("127.0.0.1" in a job on one host).
  const std::string& listen_address() const { return listen_address_; }
  /// The ring's link for one call (the ring algorithms send and receive through it).
  detail::TcpChannel channel(detail::CallContext ctx) {
    return detail::TcpChannel(out_, in_, stage_, (rank_ + 1) % world_, (rank_ + world_ - 1) % world_, boot_.get(),
                              ctx);
  }

 protected:
  /// Posts why this rank gave up (through the bootstrap) and shuts the ring's connections down.
  void abort_peers(const std::string& why) noexcept override {
    boot_->post_abort(why);  // first, so a peer that sees the connection close can read why
    out_.shutdown();
    in_.shutdown();
  }

 private:
  std::shared_ptr<Bootstrap> boot_;
  std::string listen_address_;
  Socket out_, in_;
  detail::TcpStage stage_;
};

}  // namespace ember::dist
