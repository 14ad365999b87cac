// ember — the shared-memory backend, for ranks on one host. One POSIX shared-memory segment per group holds, for
// each rank, an inbox: a single-producer single-consumer byte ring written by the previous rank and read by this one,
// with lock-free head/tail counters. The ring engine (detail/ring.hpp) runs over it: a rank copies chunks into the
// next rank's inbox and reduces chunks straight out of its own, so copying, reducing and signalling overlap.
// Waiting spins briefly and then sleeps on a futex in the segment, which the other side rings; a waiting rank also
// watches the group's abort flag and whether its peers' processes are still alive, so a rank that dies or gives up
// makes the others fail within moments, not at the timeout. Linux only.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/storage.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/detail/ring.hpp"

namespace ember::dist {

namespace detail {

inline constexpr std::uint64_t kShmMagic = 0x31474553524d4245ull;  // "EBMRSEG1"
inline constexpr int kMaxShmRanks = 256;

template <class T>
std::atomic_ref<T> aref(T& x) {
  return std::atomic_ref<T>(x);
}

struct ShmControl {
  std::uint64_t magic;
  std::uint32_t world;
  std::uint32_t aborted;        // 0, or 1 + the rank that aborted
  std::uint64_t capacity;       // bytes per inbox
  std::uint32_t msg_ready;
  std::uint32_t pad;
  char abort_msg[1024];
  std::int32_t pid[kMaxShmRanks];
};
struct alignas(64) ShmBell {
  std::uint32_t bell;      // bumped whenever something this rank may wait for happens (futex word)
  std::uint32_t sleeping;  // > 0 while this rank sleeps on the futex
};
struct ShmInbox {
  alignas(64) std::uint64_t head;  // bytes written by the previous rank
  alignas(64) std::uint64_t tail;  // bytes consumed by this rank
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline std::size_t round64(std::size_t n) { return (n + 63) / 64 * 64; }

/// Whether process `pid` has exited (or is a zombie): a rank that dies mid-collective.
inline bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return false;
  const auto p = s.rfind(')');
  return p != std::string::npos && p + 2 < s.size() && (s[p + 2] == 'Z' || s[p + 2] == 'X');
}

/// The mapped segment of a group.
class ShmSegment {
 public:
  ShmSegment(int world, std::size_t capacity) : world_(world), cap_(capacity) {
    off_bells_ = round64(sizeof(ShmControl));
    off_inbox_ = off_bells_ + sizeof(ShmBell) * std::size_t(world);
    off_data_ = round64(off_inbox_ + sizeof(ShmInbox) * std::size_t(world));
    size_ = off_data_ + cap_ * std::size_t(world);
  }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment() {
    if (base_) ::munmap(base_, size_);
    if (!unlinked_ && !name_.empty()) ::shm_unlink(name_.c_str());
  }

  /// Rank 0: creates a fresh segment with a unique name.
  void create(const std::string& ctx) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16; ++attempt) {
      std::ostringstream n;
      n << "/ember-" << ::getpid() << "-" << std::hex << rd() << rd();
      const int fd = ::shm_open(n.str().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0 && errno == EEXIST) continue;
      if (fd < 0) detail::fail(ctx, "shm_open(" + n.str() + "): " + errno_message(errno));
      name_ = n.str();
      if (::ftruncate(fd, off_t(size_)) != 0) {
        const int e = errno;
        ::close(fd);
        detail::fail(ctx, "cannot size the shared-memory segment " + name_ + " to " + std::to_string(size_) +
                              " bytes: " + errno_message(e) + " (is /dev/shm large enough?)");
      }
      map(fd, ctx);
      ShmControl& c = control();
      c.world = std::uint32_t(world_);
      c.capacity = cap_;
      aref(c.magic).store(kShmMagic, std::memory_order_release);
      return;
    }
    detail::fail(ctx, "could not find a free shared-memory segment name");
  }
  /// The other ranks: opens rank 0's segment and checks it is what this group expects.
  void attach(const std::string& name, const std::string& ctx) {
    EMBER_CHECK(name.size() > 7 && name.size() < 200 && name.rfind("/ember-", 0) == 0 &&
                    name.find('/', 1) == std::string::npos,
                ctx, ": rank 0 announced an invalid segment name ", ember::detail::quote_untrusted(name));
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) detail::fail(ctx, "shm_open(" + name + "): " + errno_message(errno));
    name_ = name;
    unlinked_ = true;  // rank 0 owns the name
    struct stat st {};
    if (::fstat(fd, &st) != 0 || std::size_t(st.st_size) != size_) {
      ::close(fd);
      detail::fail(ctx, "the shared-memory segment " + name + " has " + std::to_string(st.st_size) +
                            " bytes, expected " + std::to_string(size_) + " (ranks disagree on the group's size?)");
    }
    map(fd, ctx);
    const ShmControl& c = control();
    EMBER_CHECK(aref(const_cast<std::uint64_t&>(c.magic)).load(std::memory_order_acquire) == kShmMagic &&
                    c.world == std::uint32_t(world_) && c.capacity == cap_,
                ctx, ": the shared-memory segment ", name, " does not belong to this group");
  }
  void unlink() {
    if (!unlinked_ && !name_.empty()) ::shm_unlink(name_.c_str());
    unlinked_ = true;
  }
  const std::string& name() const { return name_; }

  ShmControl& control() const { return *reinterpret_cast<ShmControl*>(base_); }
  ShmBell& bell(int r) const { return reinterpret_cast<ShmBell*>(base_ + off_bells_)[r]; }
  ShmInbox& inbox(int r) const { return reinterpret_cast<ShmInbox*>(base_ + off_inbox_)[r]; }
  char* data(int r) const { return base_ + off_data_ + cap_ * std::size_t(r); }
  std::size_t capacity() const { return cap_; }
  int world() const { return world_; }

  /// After publishing something rank r may wait for (a head or tail store, seq_cst): wakes r if it sleeps. A rank
  /// that polls reads the counters themselves, so the common case touches no line of r's but the `sleeping` word.
  void notify(int r) const {
    ShmBell& b = bell(r);
    if (aref(b.sleeping).load(std::memory_order_seq_cst) != 0) wake(r);
  }
  void wake(int r) const {
    ShmBell& b = bell(r);
    aref(b.bell).fetch_add(1, std::memory_order_seq_cst);
    ::syscall(SYS_futex, &b.bell, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  /// Sleeps (at most `ms`) unless `changed()` says what rank r waits for has happened: the eventcount protocol with
  /// notify() (r announces itself in `sleeping` before it looks a last time, so a notifier either sees it or r sees
  /// the notifier's store).
  template <class Changed>
  void sleep(int r, Changed changed, int ms) const {
    ShmBell& b = bell(r);
    const std::uint32_t seen = aref(b.bell).load(std::memory_order_seq_cst);
    aref(b.sleeping).fetch_add(1, std::memory_order_seq_cst);
    if (!changed()) {
      timespec ts{ms / 1000, long(ms % 1000) * 1000000L};
      ::syscall(SYS_futex, &b.bell, FUTEX_WAIT, seen, &ts, nullptr, 0);
    }
    aref(b.sleeping).fetch_sub(1, std::memory_order_seq_cst);
  }

  /// Marks the group aborted by `rank` with a reason (the first abort wins) and wakes everyone.
  void abort(int rank, const std::string& why) const {
    ShmControl& c = control();
    std::uint32_t expected = 0;
    if (aref(c.aborted).compare_exchange_strong(expected, std::uint32_t(rank + 1))) {
      const std::size_t n = std::min(why.size(), sizeof c.abort_msg - 1);
      std::memcpy(c.abort_msg, why.data(), n);
      c.abort_msg[n] = 0;
      aref(c.msg_ready).store(1, std::memory_order_release);
    }
    for (int r = 0; r < world_; ++r) wake(r);
  }
  /// "" when not aborted, else "rank k gave up: <why>".
  std::string abort_reason() const {
    ShmControl& c = control();
    const std::uint32_t a = aref(c.aborted).load(std::memory_order_acquire);
    if (a == 0) return {};
    for (int i = 0; i < 1000 && aref(c.msg_ready).load(std::memory_order_acquire) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::string msg(c.abort_msg, ::strnlen(c.abort_msg, sizeof c.abort_msg));
    return "rank " + std::to_string(a - 1) + " gave up: " + msg;
  }

 private:
  void map(int fd, const std::string& ctx) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) detail::fail(ctx, "mmap of the shared-memory segment: " + errno_message(e));
    base_ = static_cast<char*>(p);
  }

  int world_;
  std::size_t cap_, off_bells_ = 0, off_inbox_ = 0, off_data_ = 0, size_ = 0;
  char* base_ = nullptr;
  std::string name_;
  bool unlinked_ = false;
};

/// The ring engine's channel over a segment: sends into the next rank's inbox, receives from this rank's.
class ShmChannel {
 public:
  static constexpr bool kWritesInPlace = true;
  ShmChannel(const ShmSegment& g, int rank, CallContext ctx, bool oversubscribed)
      : g_(g), rank_(rank), next_((rank + 1) % g.world()), prev_((rank + g.world() - 1) % g.world()), ctx_(ctx),
        oversubscribed_(oversubscribed) {}

  /// What this rank waits for: data in its inbox (the head), space in the next rank's (its tail).
  struct Token {
    std::uint64_t head_in, tail_out;
  };
  Token token() const {
    return {aref(g_.inbox(rank_).head).load(std::memory_order_acquire),
            aref(g_.inbox(next_).tail).load(std::memory_order_acquire)};
  }
  /// Whether what the caller waits for (data to receive, space to send into) may have come since `t`.
  bool changed(const Token& t, bool want_send = true, bool want_recv = true) const {
    return (want_recv && aref(g_.inbox(rank_).head).load(std::memory_order_acquire) != t.head_in) ||
           (want_send && aref(g_.inbox(next_).tail).load(std::memory_order_acquire) != t.tail_out);
  }

  std::size_t send_some(const char* p, std::size_t n) {
    ShmInbox& c = g_.inbox(next_);
    const std::uint64_t head = aref(c.head).load(std::memory_order_relaxed);
    const std::uint64_t tail = aref(c.tail).load(std::memory_order_acquire);
    const std::size_t cap = g_.capacity();
    const std::size_t free = cap - std::size_t(head - tail);
    if (free == 0 || n == 0) return 0;
    const std::size_t pos = std::size_t(head % cap);
    const std::size_t m = std::min({n, free, cap - pos});
    std::memcpy(g_.data(next_) + pos, p, m);
    aref(c.head).store(head + m, std::memory_order_seq_cst);
    g_.notify(next_);
    return m;
  }
  /// The free space of the next rank's inbox that is contiguous, to write into before commit().
  std::pair<char*, std::size_t> send_view() const {
    ShmInbox& c = g_.inbox(next_);
    const std::uint64_t head = aref(c.head).load(std::memory_order_relaxed);
    const std::uint64_t tail = aref(c.tail).load(std::memory_order_acquire);
    const std::size_t cap = g_.capacity();
    const std::size_t pos = std::size_t(head % cap);
    return {g_.data(next_) + pos, std::min(cap - std::size_t(head - tail), cap - pos)};
  }
  void commit(std::size_t n) {
    ShmInbox& c = g_.inbox(next_);
    aref(c.head).store(aref(c.head).load(std::memory_order_relaxed) + n, std::memory_order_seq_cst);
    g_.notify(next_);
  }
  std::pair<const char*, std::size_t> recv_view() const {
    ShmInbox& c = g_.inbox(rank_);
    const std::uint64_t head = aref(c.head).load(std::memory_order_acquire);
    const std::uint64_t tail = aref(c.tail).load(std::memory_order_relaxed);
    const std::size_t cap = g_.capacity();
    const std::size_t pos = std::size_t(tail % cap);
    return {g_.data(rank_) + pos, std::min(std::size_t(head - tail), cap - pos)};
  }
  std::size_t available() const {
    ShmInbox& c = g_.inbox(rank_);
    return std::size_t(aref(c.head).load(std::memory_order_acquire) - aref(c.tail).load(std::memory_order_relaxed));
  }
  void consume(std::size_t n) {
    ShmInbox& c = g_.inbox(rank_);
    aref(c.tail).store(aref(c.tail).load(std::memory_order_relaxed) + n, std::memory_order_seq_cst);
    g_.notify(prev_);
  }
  std::size_t recv_into(char* dst, std::size_t n) {
    std::size_t got = 0;
    for (int part = 0; part < 2 && got < n; ++part) {  // at most two runs: up to the wrap, then from the start
      auto [p, avail] = recv_view();
      const std::size_t m = std::min(avail, n - got);
      if (m == 0) break;
      std::memcpy(dst + got, p, m);
      consume(m);
      got += m;
    }
    return got;
  }

  void wait(const Token& token, bool want_send, bool want_recv, Deadline deadline, const RingProgress& prog) {
    if (!want_send && !want_recv) want_send = want_recv = true;
    // Poll (the next chunk is usually microseconds away): with the pause instruction for 20 us (none when there are
    // more ranks than cores), then giving the core to any other runnable thread between polls until the spin budget
    // is spent; then sleep on the futex in short slices, checking the abort flag, the peers' processes and the
    // deadline between slices.
    const auto t0 = Clock::now();
    const auto pause_until = t0 + std::chrono::microseconds(oversubscribed_ ? 0 : 20);
    const auto spin_until = t0 + std::chrono::microseconds(spin_budget_us());
    for (int i = 1; !changed(token, want_send, want_recv); ++i) {
      if ((i & 63) != 0 && !oversubscribed_) {
        cpu_relax();
        continue;
      }
      const auto now = Clock::now();
      if (now > spin_until) break;
      if (now > pause_until) std::this_thread::yield();
    }
    while (!changed(token, want_send, want_recv)) {
      check(deadline, prog, token, want_send, want_recv);
      g_.sleep(rank_, [&] { return changed(token, want_send, want_recv); }, 20);
    }
  }

 private:
  // Fails the wait when the group was aborted, when a rank this wait depends on has exited without what it waits
  // for having come (the previous rank for data, the next for space: a rank further round the ring may finish its
  // part of a broadcast and exit normally while this one still waits on a live neighbour; if it died mid-collective,
  // its neighbours fail and abort the group, which names it), or at the deadline.
  void check(Deadline deadline, const RingProgress& prog, const Token& token, bool want_send, bool want_recv) {
    const std::string why = g_.abort_reason();
    if (!why.empty()) detail::fail(ctx_.str(), why);
    const auto now = Clock::now();
    if (now >= next_liveness_check_) {
      next_liveness_check_ = now + std::chrono::milliseconds(100);
      const ShmControl& c = g_.control();
      for (int r : {want_recv ? prev_ : -1, want_send ? next_ : -1})
        if (r >= 0 && r != rank_ && process_gone(c.pid[r]) && !changed(token, want_send, want_recv))
          detail::fail(ctx_.str(), "rank " + std::to_string(r) + " (pid " + std::to_string(c.pid[r]) +
                                 ") has exited (" + prog.str() + ")");
    }
    if (now >= deadline)
      detail::fail(ctx_.str(), "timed out waiting for rank " + std::to_string(prev_) + " or rank " +
                             std::to_string(next_) + " (" + prog.str() + ")");
  }

  const ShmSegment& g_;
  int rank_, next_, prev_;
  CallContext ctx_;
  bool oversubscribed_;
  Clock::time_point next_liveness_check_{};
};

}  // namespace detail

/// The options of ShmCollectives, the shared-memory backend (one host; PyTorch's gloo has no counterpart).
struct ShmOptions {
  /// Bytes of each rank's inbox in the segment, clamped to [4 KiB, 1 GiB] and rounded up to 4 KiB; 0:
  /// EMBER_SHM_CHANNEL_BYTES, else 4 MiB.
  std::size_t channel_bytes = 0;
};

/// The shared-memory backend (all ranks on one host).
class ShmCollectives final : public detail::RingCollectives<ShmCollectives> {
 public:
  /// Rank `rank` of `world` on one host: rank 0 creates the shared segment, the others attach to it (announced
  /// through `boot`); at most kMaxShmRanks ranks.
  ShmCollectives(int rank, int world, Bootstrap& boot, std::chrono::milliseconds timeout, ShmOptions o = {})
      : RingCollectives(rank, world, timeout) {
    const std::string ctx = "dist: setting up the shm backend (rank " + std::to_string(rank) + " of " +
                            std::to_string(world) + ")";
    EMBER_CHECK(world <= detail::kMaxShmRanks, ctx, ": at most ", detail::kMaxShmRanks,
                " ranks share a segment, got ", world, "; use the tcp backend");
    const Deadline d = deadline_in(timeout);
    // Rank 0 sizes and creates the segment and announces "<capacity> <name>".
    std::string mine;
    if (rank == 0) {
      seg_ = std::make_unique<detail::ShmSegment>(world, channel_bytes(o));
      seg_->create(ctx);
      mine = std::to_string(seg_->capacity()) + " " + seg_->name();
    }
    const std::string announced = boot.all_gather(mine, "shm segment", d)[0];
    if (rank != 0) {
      const auto sp = announced.find(' ');
      long long cap = -1;
      EMBER_CHECK(sp != std::string::npos && ember::detail::parse_int(std::string_view(announced).substr(0, sp), cap) &&
                  cap >= 4096 && cap <= (1LL << 30) && cap % 4096 == 0, ctx,
                  ": rank 0 announced an invalid segment ", ember::detail::quote_untrusted(announced));
      seg_ = std::make_unique<detail::ShmSegment>(world, std::size_t(cap));
      seg_->attach(announced.substr(sp + 1), ctx);
    }
    seg_->control().pid[rank] = int(::getpid());
    boot.all_gather("", "shm attached", d);
    if (rank == 0) seg_->unlink();  // every rank has it mapped; nothing is left behind if a rank dies
  }
  ~ShmCollectives() override { stop(); }
  /// The backend's name, as ProcessGroup::backend() reports it.
  const char* name() const override { return "shm"; }
  /// The ring's link for one call (the ring algorithms send and receive through it).
  detail::ShmChannel channel(detail::CallContext ctx) const {
    return detail::ShmChannel(*seg_, rank_, ctx, oversubscribed_);
  }

 protected:
  /// Tells the other ranks, through the segment, that this one gave up and why.
  void abort_peers(const std::string& why) noexcept override { seg_->abort(rank_, why); }

 private:
  static std::size_t channel_bytes(const ShmOptions& o) {
    std::size_t n = o.channel_bytes;
    if (n == 0) {
      n = std::size_t(4) << 20;
      n = std::size_t(
          ember::detail::env_int("dist::ShmCollectives", "EMBER_SHM_CHANNEL_BYTES", std::int64_t(n), 4096, 1LL << 30));
    }
    n = std::clamp<std::size_t>(n, 4096, std::size_t(1) << 30);
    return (n + 4095) / 4096 * 4096;
  }
  std::unique_ptr<detail::ShmSegment> seg_;
  // More ranks on this host than cores this process may use: a waiting rank yields instead of spinning.
  bool oversubscribed_ = [this] {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return world_ > cores;
  }();
};

}  // namespace ember::dist
