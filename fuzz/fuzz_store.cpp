// libFuzzer target: the rendezvous store's server logic (dist::StoreCore), with the input as what one client sends
// over its connection, interleaved with what else happens to the server: the client reading (some of) its replies,
// time passing, a well-behaved second client setting, reading, waiting for and deleting keys, idle connections
// arriving. After every step the server's counts must agree with a recount (bytes of keys and values exact, within
// the store's limit; buffered bytes within their bound; connection counts within their caps; no client left waiting
// for a key that is set); in token mode a client that never proved the token must not change any key. A crash, a
// sanitizer report, an exception other than the harness's own checks, or a broken invariant is a bug.
//
// Input: byte 0 holds flags (bit 0: the store has a token; bit 1: the harness sends a correct greeting for the
// client, so that the rest reaches the commands), then records, each an op byte and its argument bytes:
//   0 L bytes[L]  the client sends L bytes (kept in order; the server takes what it will read now)
//   1 n           the client reads up to 64 n bytes of its replies        2 n   time passes: 50 n ms
//   3 k n         the second client sets key k to n digits                4 k   the second client GETs key k
//   5             an idle connection arrives (at most 8)                  6     the client sends what it has left
//   7 k           the second client deletes key k
// Seeds: fuzz/corpus/store (sessions of every command, pipelined requests, waits, large values, bad greetings).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ember/dist/store_core.hpp"

namespace {

using namespace ember;
using dist::StoreCore;
namespace dd = ember::dist::detail;

const std::string kToken = "fuzz-token-0123456789";

[[noreturn]] void bug(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_store: %s %s\n", what, detail.c_str());
  __builtin_trap();
}

// Fixed nonces, so that the harness can compute a correct proof and runs repeat exactly.
void fixed_random(void* p, std::size_t n) { std::memset(p, 0xa5, n); }

std::string request(std::uint8_t cmd, const std::string& key, const std::string& extra = {}) {
  std::string m(1, char(cmd));
  dd::put_u32(m, std::uint32_t(key.size()));
  return m + key + extra;
}

struct Conn {
  StoreCore::Id id = 0;
  std::string pending;  // sent by the client, not yet taken by the server
  std::string got;      // replies read
};

class Harness {
 public:
  Harness(bool token, StoreCore::TimePoint t0) : token_(token), now_(t0), core_(token ? kToken : "", limits(), fixed_random) {}

  static dist::StoreLimits limits() {
    dist::StoreLimits l;
    l.max_store_bytes = 16 << 10;
    l.max_clients = 4;
    l.max_handshakes = 4;
    l.handshake_timeout = std::chrono::seconds(2);
    l.request_timeout = std::chrono::seconds(5);
    l.connection_buffer = 1024;
    l.shared_buffer = 8 << 10;
    return l;
  }

  void start(bool greet) {
    client_.id = core_.open(now_);
    read(client_, 1 << 20);
    proven_ = !token_;
    if (greet) {
      unsigned char nc[dd::kNonceBytes] = {};
      unsigned char ns[dd::kNonceBytes];
      fixed_random(ns, sizeof ns);
      const dd::Digest proof = dd::client_proof(kToken, ns, nc);
      client_.pending = std::string(dd::kClientMagic) + std::string(32, '\0') +
                        std::string(reinterpret_cast<const char*>(proof.data()), proof.size());
      push(client_);
      proven_ = true;
    }
    helper_.id = core_.open(now_);
    read(helper_, 1 << 20);
    helper_.got.clear();
    unsigned char ns[dd::kNonceBytes];
    fixed_random(ns, sizeof ns);
    unsigned char nc[dd::kNonceBytes] = {1};
    const dd::Digest proof = dd::client_proof(kToken, ns, nc);
    helper_.pending = std::string(dd::kClientMagic) + std::string(reinterpret_cast<const char*>(nc), 32) +
                      std::string(reinterpret_cast<const char*>(proof.data()), proof.size());
    push(helper_);
    read(helper_, 1 << 20);
    if (!core_.alive(helper_.id) || helper_.got.size() != 9 + 32 || helper_.got[0] != char(dd::kOk))
      bug("the well-behaved client was not admitted");
    helper_.got.clear();
    check();
  }

  void step(std::uint8_t op, const std::uint8_t*& p, const std::uint8_t* end) {
    auto arg = [&]() -> std::uint8_t { return p < end ? *p++ : 0; };
    switch (op % 8) {
      case 0: {
        const std::size_t n = std::min<std::size_t>(arg(), std::size_t(end - p));
        client_.pending.append(reinterpret_cast<const char*>(p), n);
        p += n;
        push_client();
        break;
      }
      case 1: read(client_, std::size_t(arg()) * 64); break;
      case 2:
        now_ += std::chrono::milliseconds(50 * arg());
        core_.tick(now_);
        break;
      case 3: {
        const std::string key = "k" + std::to_string(arg() % 4);
        const std::string value(std::size_t(arg()) % 24, '7');
        std::string x;
        dd::put_u64(x, value.size());
        helper_call(request(dd::kSet, key, x + value));
        break;
      }
      case 4: helper_call(request(dd::kGet, "k" + std::to_string(arg() % 4))); break;
      case 5:
        if (idle_ < 8) {
          core_.open(now_);
          ++idle_;
        }
        break;
      case 6: push_client(); break;
      default: helper_call(request(dd::kDel, "k" + std::to_string(arg() % 4))); break;
    }
    (void)core_.take_dropped();
    check();
  }

  void finish() {
    for (int i = 0; i < 64 && core_.alive(client_.id); ++i) {
      read(client_, 1 << 20);
      push_client();
    }
    check();
  }

 private:
  void push(Conn& c) {
    while (!c.pending.empty() && core_.alive(c.id)) {
      const std::size_t k = std::min(core_.want_read(c.id), c.pending.size());
      if (k == 0) break;
      core_.received(c.id, c.pending.data(), k, now_);
      c.pending.erase(0, k);
    }
  }
  // The fuzzed client sends; unless it proved the token, no key may change.
  void push_client() {
    const std::uint64_t before = core_.bytes_used();
    const std::size_t keys = core_.keys();
    push(client_);
    if (!proven_ && (core_.bytes_used() != before || core_.keys() != keys))
      bug("a client that did not prove the token changed the store");
  }
  void read(Conn& c, std::size_t n) {
    const std::string_view out = core_.output(c.id).substr(0, n);
    c.got.append(out);
    core_.sent(c.id, out.size());
    if (c.got.size() > (1 << 16)) c.got.erase(0, c.got.size() - 1024);
  }
  // The second client: one request, its replies read (a GET of a missing key stays waiting, and is answered later).
  void helper_call(const std::string& req) {
    if (!core_.alive(helper_.id)) return;
    helper_.pending += req;
    push(helper_);
    read(helper_, 1 << 20);
    // Its replies are well formed: a status and a length within the limits. (A value the fuzzed client set can be
    // as large as the store holds; the second client's own values and the error texts are short.)
    while (helper_.got.size() >= 9) {
      const std::uint64_t n = dd::get_le(helper_.got.data() + 1, 8);
      if (std::uint8_t(helper_.got[0]) > dd::kRefused || n > limits().max_store_bytes)
        bug("a malformed reply to the second client", std::to_string(n) + " bytes");
      if (helper_.got.size() < 9 + n) break;
      helper_.got.erase(0, 9 + n);
    }
  }
  void check() {
    try {
      core_.check_invariants();
    } catch (const Error& e) {
      bug("an invariant broke:", e.what());
    }
    if (core_.buffered_bytes() > core_.buffered_bound()) bug("buffered bytes beyond the bound");
  }

  bool token_, proven_ = false;
  StoreCore::TimePoint now_;
  StoreCore core_;
  Conn client_, helper_;
  int idle_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  Harness h((flags & 1) != 0, StoreCore::TimePoint{} + std::chrono::hours(1));
  h.start((flags & 2) != 0);
  const std::uint8_t* p = data + 1;
  const std::uint8_t* end = data + size;
  while (p < end) {
    const std::uint8_t op = *p++;
    h.step(op, p, end);
  }
  h.finish();
  return 0;
}
