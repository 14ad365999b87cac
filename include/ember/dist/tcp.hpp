// ember — the TCP backend, for ranks on any hosts: the same ring as the shm backend over two connections per rank
// (to the next rank, from the previous one), non-blocking, driven by the group's progress thread with poll(). Chunks
// are sent while earlier ones are still being reduced, so the network, the kernel's buffers and the reduction
// overlap. A peer that closes its connections (it failed, it aborted, its process died) makes this rank fail at once,
// quoting the reason the peer left in the store when it left one.
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
#include "ember/dist/detail/ring.hpp"
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

/// The first bytes on each ring connection: who is calling.
struct TcpHello {
  std::uint32_t magic = 0x4c4c4548;  // "HELL"
  std::int32_t rank = 0, world = 0;
  std::uint32_t group = 0;
};

}  // namespace detail

/// The TCP backend. `boot` must outlive it (the process group owns both).
class TcpCollectives final : public detail::RingCollectives<TcpCollectives> {
 public:
  TcpCollectives(int rank, int world, std::shared_ptr<Bootstrap> boot, std::string local_address,
                 std::chrono::milliseconds timeout)
      : RingCollectives(rank, world, timeout), boot_(std::move(boot)) {
    const std::string ctx = "dist: setting up the tcp backend (rank " + std::to_string(rank) + " of " +
                            std::to_string(world) + ")";
    const Deadline d = deadline_in(timeout);
    Socket listener = Socket::listen(0, ctx);
    const auto addrs =
        boot_->all_gather(local_address + " " + std::to_string(listener.local_port()), "tcp addresses", d);
    const std::uint32_t group = std::uint32_t(std::hash<std::string>{}(addrs[0]));
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    // Connect to the next rank's listener (its backlog holds the connection until it accepts), then accept the
    // previous rank's connection.
    const std::string& a = addrs[std::size_t(next)];
    const auto sp = a.rfind(' ');
    long long port = -1;
    EMBER_CHECK(sp != std::string::npos && sp > 0 &&
                    ember::detail::parse_int(std::string_view(a).substr(sp + 1), port) && port > 0 && port < 65536,
                ctx, ": rank ", next, " announced an invalid address ", ember::detail::quote_untrusted(a));
    out_ = Socket::connect(a.substr(0, sp), int(port), d, ctx + ": connecting to rank " + std::to_string(next));
    detail::TcpHello hello;
    hello.rank = rank;
    hello.world = world;
    hello.group = group;
    out_.send_all(&hello, sizeof hello, d, ctx + ": greeting rank " + std::to_string(next));
    in_ = listener.accept(d, ctx + ": waiting for rank " + std::to_string(prev) + " to connect");
    detail::TcpHello theirs;
    in_.recv_all(&theirs, sizeof theirs, d, ctx + ": reading rank " + std::to_string(prev) + "'s greeting");
    EMBER_CHECK(theirs.magic == hello.magic && theirs.rank == prev && theirs.world == world && theirs.group == group,
                ctx, ": the connection that arrived is not from rank ", prev, " of this group (it says rank ",
                theirs.rank, " of ", theirs.world, ")");
    out_.set_nonblocking(true);
    in_.set_nonblocking(true);

  }
  ~TcpCollectives() override { stop(); }
  const char* name() const override { return "tcp"; }
  detail::TcpChannel channel(detail::CallContext ctx) {
    return detail::TcpChannel(out_, in_, stage_, (rank_ + 1) % world_, (rank_ + world_ - 1) % world_, boot_.get(),
                              ctx);
  }

 protected:
  void abort_peers(const std::string& why) noexcept override {
    boot_->post_abort(why);  // first, so a peer that sees the connection close can read why
    out_.shutdown();
    in_.shutdown();
  }

 private:
  std::shared_ptr<Bootstrap> boot_;
  Socket out_, in_;
  detail::TcpStage stage_;
};

}  // namespace ember::dist
