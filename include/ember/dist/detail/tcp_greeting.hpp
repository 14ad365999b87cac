// ember — the greeting on the tcp backend's ring connections, before any collective data flows. The rank that
// connects proves it knows the job's token and says which rank of which group it is; the rank that listens proves
// it knows the token too. Both send fresh nonces (dist/detail/auth.hpp), so no greeting can be replayed, and the
// proofs are labelled "ring", so none can be taken from the store's handshake or passed to it.
//
//   listener  -> connector  "EMRS" u8 version u8 mode (0 open, 1 token) nonce_l[32]
//   connector -> listener   "EMRC" identity[40] nonce_c[32] proof_c[32]
//                           identity = i32 rank, i32 world, group[32] (a digest of the addresses of the group's ranks)
//                           proof_c = labelled_proof(token, "ring", "client", nonce_l, nonce_c, identity)
//   listener  -> connector  "EMRA" proof_l[32]: accepted; proof_l = labelled_proof(token, "ring", "server", ...)
//                           "EMRX" u8 reason, 31 zero bytes: refused (then it closes the connection)
//
// The listener greets every connection that arrives, all at once (at most kRingMaxPending; the oldest makes room),
// each until it has sent its greeting or kRingGreetingTimeout has passed, and takes the first that is the previous
// rank of this group; it refuses and closes the others and keeps waiting for the real one until the rendezvous
// deadline. So a connection from elsewhere (another program, another job, a port scan) neither takes the previous
// rank's place nor makes the job fail, and one that stalls does not hold the others up. The connecting rank tries
// again when the listener closes its connection without refusing it (it was the oldest of too many, or too slow).
// In open mode (no token) the proofs are zeros and not checked; the rank and the group still are. Little-endian.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/detail/auth.hpp"
#include "ember/dist/detail/sha256.hpp"
#include "ember/dist/detail/store_wire.hpp"
#include "ember/dist/socket.hpp"

namespace ember::dist::detail {

inline constexpr std::string_view kRingListenerMagic = "EMRS", kRingClientMagic = "EMRC", kRingAcceptMagic = "EMRA",
                                  kRingRefuseMagic = "EMRX";
inline constexpr std::uint8_t kRingProtocol = 1;
inline constexpr std::size_t kRingIdentityBytes = 4 + 4 + 32;
inline constexpr std::size_t kRingHelloBytes = 4 + 1 + 1 + kNonceBytes;
inline constexpr std::size_t kRingGreetingBytes = 4 + kRingIdentityBytes + kNonceBytes + 32;
inline constexpr std::size_t kRingAnswerBytes = 4 + 32;
/// How long the listener waits for a connection's greeting, and how many connections it greets at once.
inline constexpr std::chrono::milliseconds kRingGreetingTimeout{5000};
inline constexpr std::size_t kRingMaxPending = 64;
enum RingRefusal : std::uint8_t { kRingNotEmber = 1, kRingBadProof = 2, kRingWrongPeer = 3 };

/// Who a ring connection comes from: its rank, the world and the group, as the greeting carries them.
inline std::string ring_identity(int rank, int world, const Digest& group) {
  std::string s;
  put_u32(s, std::uint32_t(rank));
  put_u32(s, std::uint32_t(world));
  s.append(reinterpret_cast<const char*>(group.data()), group.size());
  return s;
}

/// The group's identity: a digest of every rank's announced address in rank order, which the ranks of this group
/// (and no other) share.
inline Digest ring_group_digest(const std::vector<std::string>& addresses) {
  std::string msg = "ember-ring group";
  msg += '\0';
  for (const auto& a : addresses) {
    put_u64(msg, a.size());
    msg += a;
  }
  return sha256(msg);
}

/// A rank's two ring connections: to the next rank, from the previous one.
struct RingLinks {
  Socket out, in;
};

/// Connects to the next rank at next_host:next_port and accepts the previous rank's connection on `listener`, both
/// greeted as above, by `deadline`. An error names what failed: the next rank refused this one or could not prove the
/// token, or the previous one did not arrive (with the connections refused meanwhile).
class RingGreeting {
 public:
  RingGreeting(const Socket& listener, std::string next_host, int next_port, int rank, int world, const Digest& group,
               std::string_view token, Deadline deadline, std::string ctx)
      : listener_(listener), host_(std::move(next_host)), port_(next_port), rank_(rank), world_(world),
        next_((rank + 1) % world), prev_((rank + world - 1) % world), group_(group), token_(token), d_(deadline),
        ctx_(std::move(ctx)) {}

  RingLinks run() {
    listener_.set_nonblocking(true);
    connect_out();
    std::vector<pollfd> fds;
    while (!(out_done_ && in_.valid())) {
      const auto now = Clock::now();
      if (now >= d_) timed_out();
      if (!out_done_ && !out_.valid() && now >= reconnect_at_) {
        connect_out();
        continue;
      }
      std::erase_if(cands_, [&](const auto& c) {
        if (now < c->until) return false;
        refused("it sent no greeting within " + duration_str(kRingGreetingTimeout));
        return true;
      });
      fds.clear();
      Deadline wake = d_;
      const bool poll_out = !out_done_ && out_.valid();
      if (poll_out) fds.push_back({out_.fd(), POLLIN, 0});
      else if (!out_done_) wake = std::min(wake, reconnect_at_);
      const std::size_t first = fds.size();
      const std::size_t ncands = in_.valid() ? 0 : cands_.size();
      for (std::size_t i = 0; i < ncands; ++i) {
        fds.push_back({cands_[i]->s.fd(), POLLIN, 0});
        wake = std::min(wake, cands_[i]->until);
      }
      if (!in_.valid()) fds.push_back({listener_.fd(), POLLIN, 0});
      const int r = ::poll(fds.data(), nfds_t(fds.size()), std::max(1, ms_until(wake, 1000)));
      if (r < 0 && errno != EINTR) fail(ctx_, "poll: " + errno_message(errno));
      if (r <= 0) continue;
      if (poll_out && fds[0].revents) on_out();
      // Candidates first (their indices hold until accepting adds and evicts some), then new connections.
      for (std::size_t i = 0; i < ncands && !in_.valid(); ++i)
        if (fds[first + i].revents && on_candidate(*cands_[i])) cands_[i].reset();
      std::erase_if(cands_, [](const auto& c) { return !c || !c->s.valid(); });
      if (in_.valid()) cands_.clear();  // (refused by closing)
      else if (fds.back().revents & POLLIN) accept_all();
    }
    cands_.clear();
    return {std::move(out_), std::move(in_)};
  }

 private:
  struct Candidate {
    Socket s;
    Clock::time_point until;
    unsigned char nonce[kNonceBytes];
    char buf[kRingGreetingBytes];
    std::size_t got = 0;
  };
  enum OutState { kWaitHello, kWaitAnswer };

  std::string next_name() const {
    return "rank " + std::to_string(next_) + " at " + host_ + ":" + std::to_string(port_);
  }

  // ---- the connection to the next rank ----
  void connect_out() {
    try {
      out_ = Socket::connect(host_, port_, d_, ctx_ + ": connecting to " + next_name());
    } catch (const Error& e) {
      throw Error(e.what() + refusals());
    }
    out_.set_nonblocking(true);
    ostate_ = kWaitHello;
    ogot_ = 0;
  }
  // The listener closed the connection without refusing it: try again shortly (until the deadline).
  void lost_out(const std::string& why) {
    out_.close();
    last_out_ = why;
    reconnect_at_ = Clock::now() + pause_;
    pause_ = std::min(pause_ * 2, std::chrono::milliseconds(500));
  }
  void on_out() {
    const std::size_t need = ostate_ == kWaitHello ? kRingHelloBytes : kRingAnswerBytes;
    try {
      ogot_ += out_.recv_some(obuf_ + ogot_, need - ogot_, {});
    } catch (const Error& e) {
      lost_out(std::string(e.what()).substr(2));  // (the socket's message starts with ": ")
      return;
    }
    if (ogot_ < need) return;
    const std::string ctx = ctx_ + ": greeting " + next_name();
    if (ostate_ == kWaitHello) {
      EMBER_CHECK(std::string_view(obuf_, 4) == kRingListenerMagic && obuf_[4] == char(kRingProtocol), ctx,
                  ": it does not answer as the ring of this version of ember (it sent ",
                  ember::detail::quote_untrusted(std::string_view(obuf_, kRingHelloBytes)), ")");
      const auto mode = std::uint8_t(obuf_[5]);
      EMBER_CHECK(mode == (token_.empty() ? kAuthOpen : kAuthToken), ctx, ": ",
                  mode == kAuthToken ? "it asks for the job's token and this rank has none"
                                     : "it does not ask for the job's token and this rank has one",
                  " (every rank needs the same EMBER_DIST_TOKEN)");
      std::memcpy(nonce_l_, obuf_ + 6, kNonceBytes);
      random_bytes(nonce_c_, kNonceBytes);
      const std::string id = ring_identity(rank_, world_, group_);
      Digest proof{};
      if (!token_.empty()) proof = labelled_proof(token_, "ring", "client", nonce_l_, nonce_c_, id);
      std::string msg(kRingClientMagic);
      msg += id;
      msg.append(reinterpret_cast<const char*>(nonce_c_), kNonceBytes);
      msg.append(reinterpret_cast<const char*>(proof.data()), proof.size());
      try {
        out_.send_all(msg.data(), msg.size(), std::min(d_, Clock::now() + kRingGreetingTimeout), {});
      } catch (const Error& e) {
        lost_out(std::string(e.what()).substr(2));
        return;
      }
      ostate_ = kWaitAnswer;
      ogot_ = 0;
      return;
    }
    const std::string_view magic(obuf_, 4);
    if (magic == kRingRefuseMagic) {
      const auto why = std::uint8_t(obuf_[4]);
      fail(ctx, std::string("it refused this rank: ") +
                    (why == kRingBadProof    ? "this rank's proof of the job's token was wrong (every rank needs the "
                                               "same EMBER_DIST_TOKEN)"
                     : why == kRingWrongPeer ? "it expects another rank or group (do the ranks create their groups in "
                                               "the same order?)"
                     : why == kRingNotEmber  ? "it did not understand the greeting (another version of ember?)"
                                             : "reason " + std::to_string(int(why))));
    }
    EMBER_CHECK(magic == kRingAcceptMagic, ctx, ": it answered the greeting with ",
                ember::detail::quote_untrusted(std::string_view(obuf_, kRingAnswerBytes)));
    if (!token_.empty()) {
      const Digest want = labelled_proof(token_, "ring", "server", nonce_l_, nonce_c_,
                                         ring_identity(rank_, world_, group_));
      if (!equal_constant_time(want.data(), obuf_ + 4, want.size()))
        fail(ctx, "it could not prove it knows the job's token (EMBER_DIST_TOKEN): the program listening there is "
                  "not this job's rank " + std::to_string(next_));
    }
    out_done_ = true;
  }

  // ---- connections from the previous rank (and whoever else connects) ----
  void accept_all() {
    for (int k = 0; k < 256; ++k) {  // a burst of connections does not hold up the ones already greeted
      Socket s = listener_.try_accept();
      if (!s.valid()) return;
      auto c = std::make_unique<Candidate>();
      random_bytes(c->nonce, kNonceBytes);
      std::string hello(kRingListenerMagic);
      hello += char(kRingProtocol);
      hello += char(token_.empty() ? kAuthOpen : kAuthToken);
      hello.append(reinterpret_cast<const char*>(c->nonce), kNonceBytes);
      try {  // (a new connection's buffer takes these few bytes at once; one that does not is gone already)
        if (s.send_some(hello.data(), hello.size(), {}) != hello.size()) continue;
      } catch (const Error&) {
        continue;
      }
      c->s = std::move(s);
      c->until = Clock::now() + kRingGreetingTimeout;
      cands_.push_back(std::move(c));
      if (cands_.size() > kRingMaxPending) {
        cands_.erase(cands_.begin());
        refused("more than " + std::to_string(kRingMaxPending) + " connections waited at once");
      }
    }
  }
  // Reads what `c` sent; true when its greeting is complete (it was taken, or refused and closed).
  bool on_candidate(Candidate& c) {
    try {
      c.got += c.s.recv_some(c.buf + c.got, kRingGreetingBytes - c.got, {});
    } catch (const Error&) {
      refused("it closed the connection during the greeting");
      return true;
    }
    if (c.got >= 4 && std::string_view(c.buf, 4) != kRingClientMagic) {
      refuse(c, kRingNotEmber, "it does not speak ember's ring protocol (it sent " +
                                   ember::detail::quote_untrusted(std::string_view(c.buf, c.got)) + ")");
      return true;
    }
    if (c.got < kRingGreetingBytes) return false;
    const std::string_view id(c.buf + 4, kRingIdentityBytes);
    const auto* nonce_c = reinterpret_cast<const unsigned char*>(c.buf + 4 + kRingIdentityBytes);
    const char* proof = c.buf + 4 + kRingIdentityBytes + kNonceBytes;
    if (!token_.empty()) {
      const Digest want = labelled_proof(token_, "ring", "client", c.nonce, nonce_c, id);
      if (!equal_constant_time(want.data(), proof, want.size())) {
        refuse(c, kRingBadProof, "its proof of the job's token (EMBER_DIST_TOKEN) was wrong");
        return true;
      }
    }
    if (id != ring_identity(prev_, world_, group_)) {
      const auto r = std::int32_t(get_le(c.buf + 4, 4)), w = std::int32_t(get_le(c.buf + 8, 4));
      const bool same_group = std::memcmp(c.buf + 12, group_.data(), group_.size()) == 0;
      refuse(c, kRingWrongPeer, "it says it is rank " + std::to_string(r) + " of " + std::to_string(w) +
                                    (same_group ? "" : " of another group"));
      return true;
    }
    Digest answer{};
    if (!token_.empty()) answer = labelled_proof(token_, "ring", "server", c.nonce, nonce_c, id);
    std::string msg(kRingAcceptMagic);
    msg.append(reinterpret_cast<const char*>(answer.data()), answer.size());
    try {
      c.s.send_all(msg.data(), msg.size(), std::min(d_, Clock::now() + kRingGreetingTimeout), {});
    } catch (const Error&) {
      refused("it closed the connection during the greeting");
      return true;
    }
    in_ = std::move(c.s);
    return true;
  }
  void refuse(Candidate& c, RingRefusal why, const std::string& text) {
    char msg[kRingAnswerBytes] = {};
    std::memcpy(msg, kRingRefuseMagic.data(), 4);
    msg[4] = char(why);
    try {
      (void)c.s.send_some(msg, sizeof msg, {});  // best effort: the connection is closed either way
    } catch (const Error&) {
    }
    c.s.close();
    refused(text);
  }
  void refused(const std::string& text) {
    ++refused_;
    last_refused_ = text;
  }

  // What the listener refused while it waited for the previous rank, for the messages of a failure.
  std::string refusals() const {
    if (in_.valid() || refused_ == 0) return {};
    return "; this rank refused " + std::to_string(refused_) + " connection" + (refused_ == 1 ? "" : "s") +
           " that did not prove to be rank " + std::to_string(prev_) + " (the last: " + last_refused_ + ")";
  }
  [[noreturn]] void timed_out() {
    if (!out_done_)
      fail(ctx_, "timed out greeting " + next_name() +
                     (last_out_.empty() ? std::string() : " (it closed the connection: " + last_out_ + ")") +
                     refusals());
    fail(ctx_, "timed out waiting for rank " + std::to_string(prev_) + " to connect" + refusals());
  }

  const Socket& listener_;
  std::string host_;
  int port_, rank_, world_, next_, prev_;
  Digest group_;
  std::string_view token_;
  Deadline d_;
  std::string ctx_;

  Socket out_, in_;
  OutState ostate_ = kWaitHello;
  bool out_done_ = false;
  char obuf_[std::max(kRingHelloBytes, kRingAnswerBytes)] = {};
  std::size_t ogot_ = 0;
  unsigned char nonce_l_[kNonceBytes] = {}, nonce_c_[kNonceBytes] = {};
  Deadline reconnect_at_{};
  std::chrono::milliseconds pause_{20};
  std::string last_out_;

  std::vector<std::unique_ptr<Candidate>> cands_;
  std::size_t refused_ = 0;
  std::string last_refused_;
};

}  // namespace ember::dist::detail
