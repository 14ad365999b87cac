// ember — the ring: every CPU collective of the shm and tcp backends is one pass of this engine over a channel
// (bytes to the next rank, bytes from the previous one).
//
// A collective is planned as a stream of segments received from the previous rank, each either copied into place or
// combined (reduced) into it, and a stream sent to the next rank that is an optional first segment followed by the
// received segments themselves, each forwarded as soon as it has been processed. All of ring all-reduce
// (reduce-scatter then all-gather), reduce-scatter, all-gather and a pipelined broadcast have that shape: in step s
// a rank sends exactly what it received (and reduced) in step s-1. So the engine pipelines at the grain of a chunk,
// across steps as well as within them: while chunk i is being reduced, chunk i-1 is already travelling on.
//
// Before its data every rank sends a small header to the next one (which collective, dtype, count, op, root, and a
// sequence number); a rank whose neighbour disagrees raises an error naming both calls instead of reading
// mismatched data. The backend then aborts the group, so the others fail at once too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/storage.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/detail/reduce.hpp"
#include "ember/dist/socket.hpp"
#include "ember/dist/work.hpp"

namespace ember::dist::detail {

/// What every rank tells the next one before a collective's data.
struct WireHeader {
  std::uint32_t magic = 0x524d4245;  // "EBMR"
  std::uint8_t kind = 0, dtype = 0, op = 0, pad = 0;
  std::int32_t root = 0;
  std::int32_t world = 0;
  std::int64_t count = 0;  // all_reduce/broadcast: the buffer; all_gather: each rank's input; reduce_scatter: output
  std::uint64_t seq = 0;   // collectives this group ran before
};

/// "all_reduce of 1000 float32 (sum)".
inline std::string describe_call(const WireHeader& h) {
  if (h.magic != WireHeader{}.magic) return "something that is not an ember collective";
  const auto kind = CollectiveKind(h.kind);
  std::string s = collective_name(kind);
  if (kind == CollectiveKind::Barrier) return s;
  s += " of " + std::to_string(h.count) + " " + dtype_name(ScalarType(h.dtype));
  if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter)
    s += std::string(" (") + reduce_op_name(ReduceOp(h.op)) + ")";
  if (kind == CollectiveKind::Broadcast) s += " from rank " + std::to_string(h.root);
  return s;
}

/// Names the disagreement between this rank's call and the previous rank's, or returns "" when they agree.
inline std::string header_mismatch(const WireHeader& mine, const WireHeader& theirs, int prev) {
  const bool same_call = mine.magic == theirs.magic && mine.kind == theirs.kind && mine.dtype == theirs.dtype &&
                         mine.op == theirs.op && mine.root == theirs.root && mine.count == theirs.count &&
                         mine.world == theirs.world;
  if (same_call && mine.seq == theirs.seq) return {};
  std::string s = "rank " + std::to_string(prev) + " called " + describe_call(theirs);
  if (theirs.magic == mine.magic) s += " (its collective #" + std::to_string(theirs.seq) + ")";
  s += ", this rank " + describe_call(mine) + " (its collective #" + std::to_string(mine.seq) +
       "); every rank must make the same collective calls, in the same order, with the same sizes and dtypes";
  return s;
}

/// One segment of the receive stream: `bytes` bytes from the previous rank, copied to `dst` (mode Copy) or
/// combined with `base` into `dst` (Reduce; dst may be base), for Avg's last step with the scale (ReduceScale).
struct Segment {
  enum Mode : std::uint8_t { Copy, Reduce, ReduceScale };
  char* dst = nullptr;
  const char* base = nullptr;
  std::size_t bytes = 0;
  Mode mode = Copy;
};

struct RingPlan {
  const char* first = nullptr;  // sent before the forwarded segments
  std::size_t first_bytes = 0;
  std::vector<Segment> recv;
  std::size_t forward = 0;      // the first `forward` received segments are sent on, in order, after `first`
  ScalarType dtype = ScalarType::Float;
  ReduceOp op = ReduceOp::Sum;
  double scale = 1.0;           // for ReduceScale segments
};

/// Which part of a collective a channel error happened in, for the message.
struct RingProgress {
  std::size_t sent = 0, to_send = 0, received = 0, to_receive = 0;
  std::string str() const {
    return "sent " + std::to_string(sent) + " of " + std::to_string(to_send) + " bytes, received " +
           std::to_string(received) + " of " + std::to_string(to_receive);
  }
};

// Bytes moved per channel call: large enough to amortise the call (a system call on tcp), small enough that sending
// and reducing take turns often (the pipeline's grain). Measured on loopback tcp and on shm with 2 ranks: 1 MiB beat
// 64 and 256 KiB on tcp (28-39 ms against 37-53 ms for 64 MiB) and matched them on shm.
inline constexpr std::size_t kRingChunk = std::size_t(1) << 20;

/// Runs one collective over `ch`. Channel provides:
///   Token token();                                               // progress marker, read before trying
///   std::size_t send_some(const char* p, std::size_t n);         // non-blocking, may return 0
///   static constexpr bool kWritesInPlace;                        // has send_view() and commit(n):
///   std::pair<char*, std::size_t> send_view(); void commit(n);   //   room to write in place
///   std::size_t recv_into(char* dst, std::size_t n);             // non-blocking copy, may return 0
///   std::pair<const char*, std::size_t> recv_view();             // readable bytes in place
///   std::size_t available();                                     // readable bytes (in place or not)
///   void consume(std::size_t n);                                 // after recv_view
///   void wait(const Token&, bool want_send, bool want_recv, Deadline, const RingProgress&);
/// Errors (timeouts, a peer that left) are thrown by the channel with the collective's context.
template <class Channel>
void run_ring(Channel& ch, const RingPlan& plan, const WireHeader& mine, int prev, Deadline deadline,
              const CallContext& ctx) {
  const std::size_t es = element_size(plan.dtype);
  const std::size_t nseg = plan.recv.size();
  std::vector<std::size_t> roff(nseg + 1, 0);
  for (std::size_t i = 0; i < nseg; ++i) roff[i + 1] = roff[i] + plan.recv[i].bytes;
  const std::size_t total_recv = roff[nseg];
  const std::size_t fwd_bytes = roff[std::min(plan.forward, nseg)];
  const std::size_t total_send = plan.first_bytes + fwd_bytes;
  constexpr std::size_t H = sizeof(WireHeader);

  // Each stream is padded to a multiple of 8 bytes, so the next collective's elements start aligned (and never
  // straddle the end of a shared-memory ring, whose size is a multiple of 64).
  const std::size_t send_pad = (8 - (H + total_send) % 8) % 8, recv_pad = (8 - (H + total_recv) % 8) % 8;
  static constexpr char zeros[8] = {};
  char pad_sink[8];
  std::size_t pad_sent = 0, pad_recv = 0;

  WireHeader theirs{};
  std::size_t hdr_sent = 0, hdr_recv = 0, sent = 0, processed = 0;
  std::size_t rseg = 0, sseg = 0;  // current receive segment; segment the send position is in
  RingProgress prog{0, total_send, 0, total_recv};
  while (rseg < nseg && roff[rseg + 1] <= processed) ++rseg;  // (skip empty segments)

  while (hdr_sent < H || sent < total_send || pad_sent < send_pad || hdr_recv < H || processed < total_recv ||
         pad_recv < recv_pad) {
    const auto token = ch.token();
    bool progress = false;
    // ---- send: the header, then whatever of the send stream is ready.
    if (hdr_sent < H) {
      const std::size_t k = ch.send_some(reinterpret_cast<const char*>(&mine) + hdr_sent, H - hdr_sent);
      hdr_sent += k;
      progress |= k > 0;
    }
    bool want_send = hdr_sent < H;
    if (hdr_sent == H && sent < total_send) {
      const std::size_t ready = plan.first_bytes + std::min(processed, fwd_bytes);
      if (sent < ready) {
        const char* p;
        std::size_t len;
        if (sent < plan.first_bytes) {
          p = plan.first + sent;
          len = plan.first_bytes - sent;
        } else {
          const std::size_t q = sent - plan.first_bytes;
          while (roff[sseg + 1] <= q) ++sseg;
          p = plan.recv[sseg].dst + (q - roff[sseg]);
          len = roff[sseg + 1] - q;
        }
        len = std::min({len, ready - sent, kRingChunk});
        const std::size_t k = ch.send_some(p, len);
        sent += k;
        progress |= k > 0;
        want_send = true;
      }
    }
    if (sent == total_send && pad_sent < send_pad) {
      const std::size_t k = ch.send_some(zeros + pad_sent, send_pad - pad_sent);
      pad_sent += k;
      progress |= k > 0;
      want_send = true;
    }
    // ---- receive: the header (checked before any data is used), then the segments.
    bool want_recv = false;
    if (hdr_recv < H) {
      const std::size_t k = ch.recv_into(reinterpret_cast<char*>(&theirs) + hdr_recv, H - hdr_recv);
      hdr_recv += k;
      progress |= k > 0;
      want_recv = true;
      if (hdr_recv == H) {
        const std::string why = header_mismatch(mine, theirs, prev);
        if (!why.empty()) throw Error(ctx.str() + ": " + why);
      }
    } else if (processed < total_recv) {
      const Segment& s = plan.recv[rseg];
      const std::size_t off = processed - roff[rseg];
      const std::size_t rem = std::min(s.bytes - off, kRingChunk);
      std::size_t k = 0;
      if (s.mode == Segment::Copy) {
        k = ch.recv_into(s.dst + off, rem);
      } else {
        auto [p, n] = ch.recv_view();
        n = std::min(n, rem);
        n -= n % es;
        if (n > 0) {
          combine(s.dst + off, s.base + off, p, n / es, plan.dtype, plan.op,
                  s.mode == Segment::ReduceScale ? plan.scale : 1.0);
          ch.consume(n);
          k = n;
        }
      }
      processed += k;
      while (rseg < nseg && roff[rseg + 1] <= processed) ++rseg;
      progress |= k > 0;
      want_recv = true;
    } else if (pad_recv < recv_pad) {
      const std::size_t k = ch.recv_into(pad_sink + pad_recv, recv_pad - pad_recv);
      pad_recv += k;
      progress |= k > 0;
      want_recv = true;
    }
    if (!progress) {
      prog.sent = sent;
      prog.received = processed;
      ch.wait(token, want_send, want_recv, deadline, prog);
    }
  }
}

/// The bytes of segment k when n elements are split into w nearly equal parts (the first n % w one larger).
inline std::pair<std::size_t, std::size_t> split(std::size_t n, int w, int k, std::size_t es) {
  const std::size_t base = n / std::size_t(w), extra = n % std::size_t(w), uk = std::size_t(k);
  const std::size_t begin = uk * base + std::min(uk, extra);
  return {begin * es, (base + (uk < extra ? 1 : 0)) * es};
}
inline int ring_mod(int a, int w) { return ((a % w) + w) % w; }

/// In-place ring all-reduce of n elements at data: w-1 reduce-scatter steps, then w-1 all-gather steps.
inline RingPlan plan_all_reduce(char* data, std::size_t n, ScalarType t, ReduceOp op, int r, int w) {
  RingPlan p;
  p.dtype = t;
  p.op = op;
  p.scale = 1.0 / w;
  if (w == 1) return p;
  const std::size_t es = element_size(t);
  auto seg = [&](int k) { return split(n, w, ring_mod(k, w), es); };
  p.first = data + seg(r).first;
  p.first_bytes = seg(r).second;
  for (int s = 0; s < w - 1; ++s) {
    auto [off, len] = seg(r - s - 1);
    const bool last = s == w - 2;
    p.recv.push_back({data + off, data + off, len,
                      last && op == ReduceOp::Avg ? Segment::ReduceScale : Segment::Reduce});
  }
  for (int s = 0; s < w - 1; ++s) {
    auto [off, len] = seg(r - s);
    p.recv.push_back({data + off, nullptr, len, Segment::Copy});
  }
  p.forward = p.recv.size() - 1;
  return p;
}

/// Reduce-scatter of w*m elements at `in` into the m elements of `out` (rank r gets part r): partial results go to
/// `scratch` (w*m elements; parts that are not needed stay untouched), the input is only read.
inline RingPlan plan_reduce_scatter(char* out, const char* in, char* scratch, std::size_t m, ScalarType t,
                                    ReduceOp op, int r, int w) {
  RingPlan p;
  p.dtype = t;
  p.op = op;
  p.scale = 1.0 / w;
  if (w == 1) return p;
  const std::size_t bytes = m * element_size(t);
  auto off = [&](int k) { return std::size_t(ring_mod(k, w)) * bytes; };
  p.first = in + off(r - 1);
  p.first_bytes = bytes;
  for (int s = 0; s < w - 1; ++s) {
    const int k = r - s - 2;
    const bool last = s == w - 2;
    char* dst = last ? out : scratch + off(k);
    p.recv.push_back({dst, in + off(k), bytes,
                      last && op == ReduceOp::Avg ? Segment::ReduceScale : Segment::Reduce});
  }
  p.forward = p.recv.size() - 1;
  return p;
}

/// All-gather into `out` (w*m elements; this rank's part r must already be in place).
inline RingPlan plan_all_gather(char* out, std::size_t m, ScalarType t, int r, int w) {
  RingPlan p;
  p.dtype = t;
  if (w == 1) return p;
  const std::size_t bytes = m * element_size(t);
  auto off = [&](int k) { return std::size_t(ring_mod(k, w)) * bytes; };
  p.first = out + off(r);
  p.first_bytes = bytes;
  for (int s = 0; s < w - 1; ++s) p.recv.push_back({out + off(r - s - 1), nullptr, bytes, Segment::Copy});
  p.forward = p.recv.size() - 1;
  return p;
}

/// Broadcast from `root` along the ring root -> root+1 -> ... (each rank forwards chunks as they arrive).
inline RingPlan plan_broadcast(char* data, std::size_t n, ScalarType t, int root, int r, int w) {
  RingPlan p;
  p.dtype = t;
  if (w == 1) return p;
  const std::size_t bytes = n * element_size(t);
  if (r == root) {
    p.first = data;
    p.first_bytes = bytes;
    return p;
  }
  p.recv.push_back({data, nullptr, bytes, Segment::Copy});
  p.forward = ring_mod(r + 1, w) == root ? 0 : 1;
  return p;
}

/// memcpy that accepts null pointers when there is nothing to copy (empty tensors have no data).
inline void copy(void* dst, const void* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

/// Sends all n bytes (waiting for space).
template <class Channel>
void send_all(Channel& ch, const char* p, std::size_t n, Deadline d, RingProgress& prog) {
  while (n > 0) {
    const auto token = ch.token();
    const std::size_t k = ch.send_some(p, n);
    p += k;
    n -= k;
    prog.sent += k;
    if (k == 0) ch.wait(token, true, false, d, prog);
  }
}
/// Receives exactly n bytes (waiting for them).
template <class Channel>
void recv_all(Channel& ch, char* p, std::size_t n, Deadline d, RingProgress& prog) {
  while (n > 0) {
    const auto token = ch.token();
    const std::size_t k = ch.recv_into(p, n);
    p += k;
    n -= k;
    prog.received += k;
    if (k == 0 && n > 0) ch.wait(token, false, true, d, prog);
  }
}

/// The all-reduce of small buffers, where latency rules: the whole buffers go round the ring (w-1 steps, each one
/// message of header and data), then every rank combines the w buffers itself, in rank order, so that every rank
/// computes the same bits. Two ranks need one exchange instead of the ring's two rounds.
template <class Channel>
void run_small_all_reduce(Channel& ch, char* data, std::size_t n, ScalarType t, ReduceOp op, int r, int w,
                          const WireHeader& mine, Deadline d, const CallContext& ctx) {
  const std::size_t es = element_size(t), bytes = n * es, H = sizeof(WireHeader);
  const std::size_t msg = H + (bytes + 7) / 8 * 8;  // (8-byte aligned, as every stream)
  thread_local std::vector<char> scratch, out, in;
  out.resize(msg);
  in.resize(msg);
  std::memcpy(out.data(), &mine, H);
  RingProgress prog{0, msg * std::size_t(w - 1), 0, msg * std::size_t(w - 1)};
  const int prev = ring_mod(r - 1, w);
  const double last_scale = op == ReduceOp::Avg ? 1.0 / w : 1.0;
  if (w == 2) {
    // One exchange: the message is written straight into the channel and the peer's is combined straight out of it,
    // when they lie there in one piece. (Two operands: a op b and b op a are the same bits for every op here.)
    bool written = false;
    if constexpr (Channel::kWritesInPlace) {
      if (auto [room, free] = ch.send_view(); free >= msg) {
        std::memcpy(room, &mine, H);
        copy(room + H, data, bytes);
        ch.commit(msg);
        written = true;
      }
    }
    if (!written) {
      copy(out.data() + H, data, bytes);
      send_all(ch, out.data(), msg, d, prog);
    }
    for (;;) {
      const auto token = ch.token();
      auto [p, avail] = ch.recv_view();
      const char* theirs_at = nullptr;
      if (avail >= msg) {
        theirs_at = p;
      } else if (ch.available() >= msg) {  // (it wraps round the end of a shared-memory ring)
        recv_all(ch, in.data(), msg, d, prog);
        theirs_at = in.data();
      } else {
        ch.wait(token, false, true, d, prog);
        continue;
      }
      WireHeader theirs;
      std::memcpy(&theirs, theirs_at, H);
      const std::string why = header_mismatch(mine, theirs, prev);
      if (!why.empty()) throw Error(ctx.str() + ": " + why);
      combine(data, data, theirs_at + H, n, t, op, last_scale);
      if (theirs_at == p) ch.consume(msg);
      return;
    }
  }
  scratch.resize(bytes * std::size_t(w));
  auto part = [&](int k) { return scratch.data() + std::size_t(ring_mod(k, w)) * bytes; };
  copy(part(r), data, bytes);
  for (int s = 0; s < w - 1; ++s) {
    copy(out.data() + H, part(r - s), bytes);  // step s forwards what step s-1 received
    send_all(ch, out.data(), msg, d, prog);
    recv_all(ch, in.data(), msg, d, prog);
    WireHeader theirs;
    std::memcpy(&theirs, in.data(), H);
    const std::string why = header_mismatch(mine, theirs, prev);
    if (!why.empty()) throw Error(ctx.str() + ": " + why);
    copy(part(r - s - 1), in.data() + H, bytes);
  }
  combine(data, part(0), part(1), n, t, op, 1.0);
  for (int k = 2; k < w; ++k) combine(data, data, part(k), n, t, op, k == w - 1 ? last_scale : 1.0);
}

inline WireHeader make_header(CollectiveKind k, ScalarType t, ReduceOp op, int root, std::int64_t count, int world,
                              std::uint64_t seq) {
  WireHeader h;
  h.kind = std::uint8_t(k);
  h.dtype = std::uint8_t(t);
  h.op = std::uint8_t(op);
  h.root = root;
  h.count = count;
  h.world = world;
  h.seq = seq;
  return h;
}

/// The collectives of the two ring backends, over any channel (`Derived::channel(ctx)` makes one).
template <class Derived>
class RingCollectives : public Collectives {
 public:
  using Collectives::Collectives;

 protected:
  void all_reduce(const Buffer& b, ReduceOp op, Deadline d, std::uint64_t seq) override {
    const WireHeader h = make_header(CollectiveKind::AllReduce, b.dtype, op, 0, b.numel, world_, seq);
    if (b.bytes() * std::size_t(world_) <= small_bytes_) {
      const CallContext ctx{this, CollectiveKind::AllReduce};
      auto ch = static_cast<Derived*>(this)->channel(ctx);
      run_small_all_reduce(ch, static_cast<char*>(b.data), std::size_t(b.numel), b.dtype, op, rank_, world_, h, d,
                           ctx);
      return;
    }
    const RingPlan plan =
        plan_all_reduce(static_cast<char*>(b.data), std::size_t(b.numel), b.dtype, op, rank_, world_);
    run(CollectiveKind::AllReduce, plan, h, d);
  }
  void broadcast(const Buffer& b, int root, Deadline d, std::uint64_t seq) override {
    const RingPlan plan =
        plan_broadcast(static_cast<char*>(b.data), std::size_t(b.numel), b.dtype, root, rank_, world_);
    run(CollectiveKind::Broadcast, plan,
        make_header(CollectiveKind::Broadcast, b.dtype, ReduceOp::Sum, root, b.numel, world_, seq), d);
  }
  void all_gather(const Buffer& out, const Buffer& in, Deadline d, std::uint64_t seq) override {
    char* o = static_cast<char*>(out.data);
    char* mine = o + std::size_t(rank_) * in.bytes();
    if (mine != in.data) copy(mine, in.data, in.bytes());
    const RingPlan plan = plan_all_gather(o, std::size_t(in.numel), in.dtype, rank_, world_);
    run(CollectiveKind::AllGather, plan,
        make_header(CollectiveKind::AllGather, in.dtype, ReduceOp::Sum, 0, in.numel, world_, seq), d);
  }
  void reduce_scatter(const Buffer& out, const Buffer& in, ReduceOp op, Deadline d, std::uint64_t seq) override {
    const Storage scratch = make_storage(in.bytes(), Device::cpu());
    const RingPlan plan = plan_reduce_scatter(static_cast<char*>(out.data), static_cast<const char*>(in.data),
                                              static_cast<char*>(scratch->data), std::size_t(out.numel), out.dtype,
                                              op, rank_, world_);
    run(CollectiveKind::ReduceScatter, plan,
        make_header(CollectiveKind::ReduceScatter, out.dtype, op, 0, out.numel, world_, seq), d);
  }
  void barrier(Deadline d, std::uint64_t seq) override {
    // A one-byte all-reduce: no rank leaves before every rank's byte has gone round.
    char byte = 0;
    const CallContext ctx{this, CollectiveKind::Barrier};
    auto ch = static_cast<Derived*>(this)->channel(ctx);
    run_small_all_reduce(ch, &byte, 1, ScalarType::UInt8, ReduceOp::Max, rank_, world_,
                         make_header(CollectiveKind::Barrier, ScalarType::UInt8, ReduceOp::Max, 0, 0, world_, seq), d,
                         ctx);
  }

  /// All-reduces of at most this many bytes times the world size take the small-message path (EMBER_DIST_SMALL_BYTES,
  /// default 64 KiB).
  std::size_t small_bytes_ = [] {
    return std::size_t(ember::detail::env_int("dist", "EMBER_DIST_SMALL_BYTES", 64 << 10, 0, 1LL << 40));
  }();

 private:
  void run(CollectiveKind k, const RingPlan& plan, const WireHeader& h, Deadline d) {
    const CallContext ctx{this, k};
    auto ch = static_cast<Derived*>(this)->channel(ctx);
    run_ring(ch, plan, h, (rank_ + world_ - 1) % world_, d, ctx);
  }
};

}  // namespace ember::dist::detail
