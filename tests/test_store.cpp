// Tests of the rendezvous store on its own: SHA-256 and HMAC-SHA256 against the published test vectors; the server's
// state machine (StoreCore) driven byte by byte, with a clock the test moves, under the attacks it must withstand
// (byte counts that drift or bypass the limit, replies never read, unfinished large requests, idle connections by
// the thousand, a chain of waiting clients, clients without the token); the TCP server and client (binding,
// authentication both ways, a rogue server's text); and a soak of rogue and legitimate clients on loopback.
#include <doctest/doctest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ember/dist/store.hpp"

using namespace ember;
using dist::StoreCore;
namespace dd = ember::dist::detail;
using TP = StoreCore::TimePoint;

namespace {

std::string hex(const dd::Digest& d, std::size_t n = 32) {
  static constexpr char h[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += h[d[i] >> 4];
    s += h[d[i] & 15];
  }
  return s;
}

const std::string kToken = "0123456789abcdef-the-job-token";

// ---- driving a StoreCore as a client would -------------------------------------------------------------------------

std::string request(std::uint8_t cmd, const std::string& key, const std::string& extra = {}) {
  std::string m(1, char(cmd));
  dd::put_u32(m, std::uint32_t(key.size()));
  return m + key + extra;
}
std::string set_req(const std::string& k, const std::string& v) {
  std::string x;
  dd::put_u64(x, v.size());
  return request(dd::kSet, k, x + v);
}
std::string add_req(const std::string& k, std::int64_t d) {
  std::string x;
  dd::put_u64(x, std::uint64_t(d));
  return request(dd::kAdd, k, x);
}

struct Reply {
  int status;
  std::string payload;
};

// One client connection of a core: handshake, requests (fed as far as the core reads), replies.
struct Peer {
  StoreCore& core;
  StoreCore::Id id;
  TP now;
  std::string got;  // output received, not yet parsed

  Peer(StoreCore& c, TP t, const std::string& token = kToken, bool finish = true) : core(c), id(c.open(t)), now(t) {
    if (finish) handshake(token);
  }
  // The greeting and the answer, with a proof computed from `token`; returns the answer's status.
  int handshake(const std::string& token) {
    read();
    REQUIRE(got.size() >= dd::kServerHelloBytes);
    REQUIRE(got.compare(0, 4, "EMBS") == 0);
    const auto* ns = reinterpret_cast<const unsigned char*>(got.data() + 6);
    const bool token_mode = got[5] == char(dd::kAuthToken);
    unsigned char nc[32];
    for (int i = 0; i < 32; ++i) nc[i] = static_cast<unsigned char>(i * 7 + 1);
    const dd::Digest proof = dd::client_proof(token, ns, nc);
    std::string msg = "EMBC";
    msg.append(reinterpret_cast<const char*>(nc), 32);
    msg.append(reinterpret_cast<const char*>(proof.data()), 32);
    const dd::Digest server = dd::server_proof(token, ns, nc);
    got.erase(0, dd::kServerHelloBytes);
    REQUIRE(feed(msg) == msg.size());
    const Reply r = next();
    if (r.status == dd::kOk && token_mode)
      CHECK(r.payload == std::string(reinterpret_cast<const char*>(server.data()), 32));
    return r.status;
  }
  // Feeds what the core reads of `bytes` now; returns how many it took.
  std::size_t feed(const std::string& bytes) {
    std::size_t off = 0;
    while (off < bytes.size() && core.alive(id)) {
      const std::size_t k = std::min(core.want_read(id), bytes.size() - off);
      if (k == 0) break;
      core.received(id, bytes.data() + off, k, now);
      off += k;
    }
    return off;
  }
  // Takes the queued output (as a socket's reader would).
  void read() {
    const std::string_view out = core.output(id);
    got.append(out);
    core.sent(id, out.size());
  }
  bool has_reply() {
    read();
    return got.size() >= 9 && got.size() >= 9 + dd::get_le(got.data() + 1, 8);
  }
  Reply next() {
    REQUIRE(has_reply());
    const std::size_t n = dd::get_le(got.data() + 1, 8);
    Reply r{int(std::uint8_t(got[0])), got.substr(9, n)};
    got.erase(0, 9 + n);
    return r;
  }
  Reply call(const std::string& req) {
    REQUIRE(feed(req) == req.size());
    return next();
  }
};

}  // namespace

TEST_CASE("dist: SHA-256 and HMAC-SHA256 give the FIPS 180-4 and RFC 4231 test vectors") {
  CHECK(hex(dd::sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(dd::sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(dd::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(dd::sha256("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopq"
                       "rsmnopqrstnopqrstu")) == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  {
    // One million 'a', fed in uneven pieces (the block boundary falls inside them).
    dd::Sha256 h;
    const std::string piece(997, 'a');
    std::size_t left = 1000000;
    while (left > 0) {
      const std::size_t k = std::min(left, piece.size());
      h.update(piece.data(), k);
      left -= k;
    }
    CHECK(hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
  const std::string aa131(131, '\xaa');
  std::string k4;
  for (int i = 1; i <= 25; ++i) k4 += char(i);
  CHECK(hex(dd::hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(dd::hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(dd::hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(hex(dd::hmac_sha256(k4, std::string(50, '\xcd'))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(hex(dd::hmac_sha256(std::string(20, '\x0c'), "Test With Truncation"), 16) ==
        "a3b6167473100ee06e0c796c2955552b");
  CHECK(hex(dd::hmac_sha256(aa131, "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hex(dd::hmac_sha256(aa131, "This is a test using a larger than block-size key and a larger than block-size "
                                   "data. The key needs to be hashed before being used by the HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  const dd::Digest a = dd::sha256("x"), b = dd::sha256("y");
  CHECK(dd::equal_constant_time(a.data(), a.data(), 32));
  CHECK_FALSE(dd::equal_constant_time(a.data(), b.data(), 32));
  dd::Digest c = a;
  c[31] ^= 1;
  CHECK_FALSE(dd::equal_constant_time(a.data(), c.data(), 32));
  // Tokens: long enough to resist an offline guess; the message names the source, never the token.
  CHECK_THROWS_WITH_AS(dd::check_token("secret", "EMBER_DIST_TOKEN"),
                       doctest::Contains("EMBER_DIST_TOKEN holds 6 bytes; a token needs 16"), Error);
  try {
    dd::check_token("secret", "EMBER_DIST_TOKEN");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("secret") == std::string::npos);
  }
  const std::string t1 = dd::new_token(), t2 = dd::new_token();
  CHECK(t1.size() == 64);
  CHECK(t1 != t2);
}

TEST_CASE("dist::StoreCore: the byte count is exact after random operation sequences") {
  dist::StoreLimits lim;
  lim.max_store_bytes = 4096;
  StoreCore core(kToken, lim);
  Peer p(core, TP{});
  std::mt19937 rng(5);
  std::map<std::string, std::string> model;
  const std::vector<std::string> keys{"a", "bb", "counter", std::string(300, 'k'), ""};
  const std::vector<std::string> values{"", "0", "12", "-5", "text", std::string(1000, 'v'), std::string(3000, 'w')};
  auto model_bytes = [&] {
    std::uint64_t n = 0;
    for (const auto& [k, v] : model) n += k.size() + v.size();
    return n;
  };
  int refused_full = 0;
  for (int step = 0; step < 20000; ++step) {
    const std::string& k = keys[rng() % keys.size()];
    const auto it = model.find(k);
    const std::uint64_t old = it == model.end() ? 0 : k.size() + it->second.size();
    switch (rng() % 5) {
      case 0: {
        const std::string& v = values[rng() % values.size()];
        const Reply r = p.call(set_req(k, v));
        if (model_bytes() - old + k.size() + v.size() > lim.max_store_bytes) {
          CHECK(r.status == dd::kRefused);
          CHECK(r.payload == "the store is full");
          ++refused_full;
        } else {
          CHECK(r.status == dd::kOk);
          model[k] = v;
        }
        break;
      }
      case 1: {
        const std::int64_t d = std::int64_t(rng() % 7) - 3;
        long long cur = 0;
        const Reply r = p.call(add_req(k, d));
        if (it != model.end() && !it->second.empty() && !ember::detail::parse_int(it->second, cur)) {
          CHECK(r.status == dd::kRefused);
          break;
        }
        const std::string sum = std::to_string(static_cast<long long>(std::uint64_t(cur) + std::uint64_t(d)));
        if (model_bytes() - old + k.size() + sum.size() > lim.max_store_bytes) {
          CHECK(r.status == dd::kRefused);
          ++refused_full;
        } else {
          CHECK(r.status == dd::kOk);
          CHECK(r.payload == sum);
          model[k] = sum;
        }
        break;
      }
      case 2:
        CHECK(p.call(request(dd::kDel, k)).status == (it == model.end() ? dd::kMissing : dd::kOk));
        model.erase(k);
        break;
      case 3: CHECK(p.call(request(dd::kCheck, k)).status == (it == model.end() ? dd::kMissing : dd::kOk)); break;
      default:
        if (it != model.end()) CHECK(p.call(request(dd::kGet, k)).payload == it->second);
    }
    REQUIRE(core.bytes_used() == model_bytes());
    REQUIRE_NOTHROW(core.check_invariants());
  }
  CHECK(refused_full > 0);  // the limit was reached, and held
}

TEST_CASE("dist::StoreCore: SET k \"\" then ADD k 1, repeated, does not count the key again") {
  dist::StoreLimits lim;
  lim.max_store_bytes = 10000;
  StoreCore core(kToken, lim);
  Peer p(core, TP{});
  const std::string k(100, 'k');
  for (int i = 0; i < 5000; ++i) {
    REQUIRE(p.call(set_req(k, "")).status == dd::kOk);
    REQUIRE(p.call(add_req(k, 1)).payload == "1");
  }
  CHECK(core.bytes_used() == 101);
  // The store holds 101 bytes, so 9,000 more fit (the count that drifted refused them as "full").
  const Reply r = p.call(set_req("other", std::string(9000, 'x')));
  CHECK(r.status == dd::kOk);
  CHECK(core.bytes_used() == 101 + 5 + 9000);
  core.check_invariants();
}

TEST_CASE("dist::StoreCore: ADD of new keys counts against the store's limit") {
  dist::StoreLimits lim;
  lim.max_store_bytes = 65536;
  StoreCore core(kToken, lim);
  Peer p(core, TP{});
  REQUIRE(p.call(set_req("fill", std::string(60000, 'x'))).status == dd::kOk);
  CHECK(p.call(set_req("more", std::string(6000, 'x'))).payload == "the store is full");
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    const Reply r = p.call(add_req(std::to_string(i) + std::string(4090, 'k'), 1));
    if (r.status == dd::kRefused) {
      CHECK(r.payload == "the store is full");
      ++refused;
    }
  }
  CHECK(refused == 39);  // one 4 KB key fitted
  CHECK(core.bytes_used() <= lim.max_store_bytes);
  core.check_invariants();
}

TEST_CASE("dist::StoreCore: a client that does not read its replies is not read from, and is dropped in time") {
  dist::StoreLimits lim;
  lim.connection_buffer = 64 << 10;
  lim.shared_buffer = 1 << 20;
  StoreCore core(kToken, lim);
  const TP t0{};
  Peer w(core, t0), r1(core, t0), r2(core, t0);
  const std::string big(256 << 10, 'b');
  REQUIRE(w.call(set_req("big", big)).status == dd::kOk);
  std::string gets;
  const int n = 200;
  for (int i = 0; i < n; ++i) gets += request(dd::kGet, "big");
  // Pipelined GETs whose replies are not read: one reply is queued, then the connection is not read any more.
  std::size_t fed = 0;
  for (Peer* r : {&r2, &r1}) {  // (r1's count is kept)
    fed = r->feed(gets);
    CHECK(core.want_read(r->id) == 0);
    CHECK(core.output(r->id).size() == 9 + big.size());
  }
  CHECK(core.buffered_bytes() <= 2 * (lim.connection_buffer + 9 + big.size()));
  CHECK(core.buffered_bytes() <= 3 * lim.connection_buffer + lim.shared_buffer);
  core.check_invariants();
  // Others are served meanwhile.
  CHECK(w.call(set_req("small", "1")).status == dd::kOk);
  // A reader that reads gets every reply, in order.
  int replies = 0;
  while (replies < n) {
    r1.read();
    while (r1.has_reply()) {
      const Reply r = r1.next();
      REQUIRE(r.payload.size() == big.size());
      ++replies;
    }
    if (fed < gets.size()) fed += r1.feed(gets.substr(fed));
    REQUIRE_NOTHROW(core.check_invariants());
  }
  CHECK(core.alive(r2.id));
  // The one that never reads is dropped once its replies have not moved for the request timeout.
  core.tick(t0 + lim.request_timeout + std::chrono::seconds(2));
  CHECK_FALSE(core.alive(r2.id));
  CHECK(core.alive(r1.id));
  CHECK(core.alive(w.id));
  core.check_invariants();
}

TEST_CASE("dist::StoreCore: unfinished large SETs share one bounded buffer, and are dropped in time") {
  dist::StoreLimits lim;
  lim.connection_buffer = 64 << 10;
  lim.shared_buffer = 4 << 20;
  StoreCore core(kToken, lim);
  const TP t0{};
  const std::uint64_t vlen = 3 << 20;
  std::vector<std::unique_ptr<Peer>> rogues;
  std::uint64_t taken = 0;
  for (int i = 0; i < 8; ++i) {
    rogues.push_back(std::make_unique<Peer>(core, t0));
    std::string req = set_req("k" + std::to_string(i), std::string(vlen, 'v'));
    req.pop_back();  // never complete
    taken += rogues.back()->feed(req);
  }
  // Each would hold 3 MiB: together no more than the shared buffer plus each one's own share.
  CHECK(taken < 8 * vlen);
  CHECK(core.buffered_bytes() <= lim.shared_buffer + (8 + 1) * lim.connection_buffer);
  core.check_invariants();
  // Small requests are served meanwhile; a large one waits for room.
  Peer legit(core, t0 + std::chrono::seconds(30));
  CHECK(legit.call(set_req("small", "1")).status == dd::kOk);
  const std::string large = set_req("large", std::string(1 << 20, 'L'));
  std::size_t fed = legit.feed(large);
  CHECK(fed < large.size());
  // The rogues held their requests unfinished for the request timeout: dropped, and the large SET goes through.
  core.tick(t0 + lim.request_timeout + std::chrono::seconds(1));
  for (auto& r : rogues) CHECK_FALSE(core.alive(r->id));
  CHECK(core.take_dropped().size() == 8);
  REQUIRE(core.alive(legit.id));
  fed += legit.feed(large.substr(fed));
  CHECK(fed == large.size());
  CHECK(legit.next().status == dd::kOk);
  CHECK(core.bytes_used() == 5 + 1 + 5 + (1 << 20));
  core.check_invariants();
}

TEST_CASE("dist::StoreCore: connections that never authenticate cannot lock the job's ranks out") {
  StoreCore core(kToken);
  const TP t0{};
  for (int i = 0; i < 5000; ++i) core.open(t0);  // idle: never send a byte
  CHECK(core.handshakes() <= core.limits().max_handshakes);
  CHECK(core.connections() <= core.limits().max_handshakes);
  CHECK(core.take_dropped().size() == 5000 - core.limits().max_handshakes);
  // A rank connecting now is served (the oldest idle connection makes room for it).
  Peer rank(core, t0);
  CHECK(rank.call(set_req("ok", "1")).status == dd::kOk);
  // A slow greeting, part sent: dropped at the handshake deadline with the idle ones; the rank stays.
  Peer slow(core, t0, kToken, false);
  slow.read();
  slow.feed("EMBC0123");
  core.tick(t0 + core.limits().handshake_timeout + std::chrono::milliseconds(1));
  CHECK_FALSE(core.alive(slow.id));
  CHECK(core.connections() == 1);
  CHECK(core.handshakes() == 0);
  core.check_invariants();

  // Slots for proven clients are their own: when they are all taken, the next proven client is refused.
  dist::StoreLimits lim;
  lim.max_clients = 4;
  StoreCore small(kToken, lim);
  std::vector<std::unique_ptr<Peer>> ranks;
  for (int i = 0; i < 4; ++i) ranks.push_back(std::make_unique<Peer>(small, t0));
  for (int i = 0; i < 100; ++i) small.open(t0);
  Peer fifth(small, t0, kToken, false);
  CHECK(fifth.handshake(kToken) == dd::kRefused);
  for (auto& r : ranks) CHECK(r->call(request(dd::kCheck, "x")).status == dd::kMissing);
  small.check_invariants();
}

TEST_CASE("dist::StoreCore: a client without the token is dropped before any key is read or written") {
  StoreCore core(kToken);
  const TP t0{};
  Peer rank(core, t0);
  REQUIRE(rank.call(set_req("secret", "s3cr3t")).status == dd::kOk);
  {
    // A wrong token: refused (the reason names the variable), and nothing after the greeting is read.
    Peer bad(core, t0, "wrong-token-0123456789", false);
    bad.read();
    const auto* ns = reinterpret_cast<const unsigned char*>(bad.got.data() + 6);
    unsigned char nc[32] = {};
    const dd::Digest proof = dd::client_proof("wrong-token-0123456789", ns, nc);
    std::string msg = "EMBC" + std::string(32, '\0') + std::string(reinterpret_cast<const char*>(proof.data()), 32);
    bad.got.erase(0, dd::kServerHelloBytes);
    CHECK(bad.feed(msg + set_req("secret", "stolen") + request(dd::kGet, "secret")) == msg.size());
    const Reply r = bad.next();
    CHECK(r.status == dd::kRefused);
    CHECK(r.payload.find("EMBER_DIST_TOKEN") != std::string::npos);
    CHECK(bad.got.empty());
    CHECK_FALSE(core.alive(bad.id));  // closed once the refusal went out
  }
  {
    // A proof made for another connection's nonce (a replay) is refused.
    Peer a(core, t0, kToken, false), b(core, t0, kToken, false);
    a.read();
    b.read();
    const auto* ns_a = reinterpret_cast<const unsigned char*>(a.got.data() + 6);
    unsigned char nc[32] = {1};
    const dd::Digest proof = dd::client_proof(kToken, ns_a, nc);
    const std::string msg = "EMBC" + std::string(reinterpret_cast<const char*>(nc), 32) +
                            std::string(reinterpret_cast<const char*>(proof.data()), 32);
    b.got.erase(0, dd::kServerHelloBytes);
    b.feed(msg);
    CHECK(b.next().status == dd::kRefused);
    a.got.erase(0, dd::kServerHelloBytes);
    a.feed(msg);
    CHECK(a.next().status == dd::kOk);  // on its own connection it is valid
  }
  {
    // Not an ember client at all (a request without the greeting): dropped at once, nothing answered.
    Peer raw(core, t0, kToken, false);
    raw.read();
    std::string req = set_req("secret", "stolen");
    req.resize(dd::kClientHelloBytes, '\0');
    raw.got.clear();
    raw.feed(req);
    CHECK_FALSE(core.alive(raw.id));
    raw.read();
    CHECK(raw.got.empty());
  }
  CHECK(rank.call(request(dd::kGet, "secret")).payload == "s3cr3t");
  core.check_invariants();
  // In open mode (no token) any proof is accepted.
  StoreCore open;
  Peer anyone(open, t0, "whatever-token-123456", true);
  CHECK(anyone.call(set_req("k", "v")).status == dd::kOk);
}

namespace {
// Runs f on a thread with a small stack (a recursion that grows with the input would overflow it).
void on_small_stack(const std::function<void()>& f, std::size_t bytes) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, bytes);
  pthread_t t;
  auto body = [](void* p) -> void* {
    (*static_cast<const std::function<void()>*>(p))();
    return nullptr;
  };
  REQUIRE(pthread_create(&t, &at, body, const_cast<std::function<void()>*>(&f)) == 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&at);
}
}  // namespace

TEST_CASE("dist::StoreCore: waking a chain of 3,000 waiting clients takes no stack in proportion") {
  StoreCore core(kToken);
  const TP t0{};
  const int n = 3000;
  std::vector<std::unique_ptr<Peer>> chain;
  // Client i waits for key i, then (pipelined) sets key i + 1, which wakes client i + 1.
  for (int i = 0; i < n; ++i) {
    chain.push_back(std::make_unique<Peer>(core, t0));
    const std::string req = request(dd::kGet, "k" + std::to_string(i)) + set_req("k" + std::to_string(i + 1), "v");
    REQUIRE(chain.back()->feed(req) == req.size());
  }
  Peer start(core, t0);
  const std::string go = set_req("k0", "v");
  bool threw = false;
  on_small_stack(
      [&] {
        try {
          core.received(start.id, go.data(), go.size(), t0);
        } catch (...) {
          threw = true;
        }
      },
      256 << 10);
  CHECK_FALSE(threw);
  CHECK(start.next().status == dd::kOk);
  int answered = 0;
  for (auto& p : chain) {
    const Reply get = p->next(), set = p->next();
    answered += get.payload == "v" && set.status == dd::kOk;
  }
  CHECK(answered == n);
  CHECK(core.keys() == std::size_t(n + 1));
  core.check_invariants();
}

namespace {
// This host's IPv4 addresses.
std::vector<std::string> local_addresses() {
  ifaddrs* all = nullptr;
  std::vector<std::string> found;
  if (::getifaddrs(&all) != 0) return found;
  for (ifaddrs* a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    found.push_back(buf);
  }
  ::freeifaddrs(all);
  return found;
}
bool is_local_address(const std::string& a) {
  const auto all = local_addresses();
  return std::find(all.begin(), all.end(), a) != all.end();
}
// An IPv4 address of this host other than loopback ("" when it has none).
std::string other_address() {
  for (const std::string& a : local_addresses())
    if (a.rfind("127.", 0) != 0) return a;
  return {};
}

dist::Deadline in_ms(int ms) { return dist::Clock::now() + std::chrono::milliseconds(ms); }

// A server that speaks the store's protocol as a script tells it: accepts one connection and runs `script` on it.
struct Rogue {
  dist::Socket listener = dist::Socket::listen("127.0.0.1", 0, "rogue");
  std::thread thread;
  std::atomic<std::size_t> received_after_hello{0};
  explicit Rogue(std::function<void(Rogue&, dist::Socket&)> script) {
    thread = std::thread([this, script] {
      try {
        dist::Socket s = listener.accept(in_ms(10000), "rogue");
        script(*this, s);
      } catch (const Error&) {
      }
    });
  }
  ~Rogue() { thread.join(); }
  int port() const { return listener.local_port(); }
  static std::string greeting(std::uint8_t mode) {
    std::string g = "EMBS";
    g += char(dd::kStoreProtocol);
    g += char(mode);
    return g + std::string(32, 'n');
  }
  static std::string reply(std::uint8_t status, const std::string& payload) {
    std::string r(1, char(status));
    dd::put_u64(r, payload.size());
    return r + payload;
  }
  // Waits for the client to hang up, counting what it sends.
  void drain(dist::Socket& s) {
    char buf[4096];
    for (;;) {
      if (!s.wait_readable(in_ms(10000))) return;
      const ssize_t r = ::recv(s.fd(), buf, sizeof buf, 0);
      if (r <= 0) return;
      received_after_hello += std::size_t(r);
    }
  }
};
}  // namespace

TEST_CASE("dist::StoreServer: listens on loopback unless told to listen elsewhere") {
  dist::StoreServer local(0);
  CHECK(local.address() == "127.0.0.1");
  CHECK(local.loopback_only());
  dist::StoreServer every(dist::StoreServerOptions{.host = "0.0.0.0"});
  CHECK(every.address() == "0.0.0.0");
  CHECK_FALSE(every.loopback_only());
  const std::string other = other_address();
  if (other.empty()) {
    MESSAGE("this host has no address but loopback: the check from another interface is skipped");
    return;
  }
  // From another of this host's addresses, the loopback server is not there; the one on every interface is.
  CHECK_THROWS_AS(dist::Socket::connect(other, local.port(), in_ms(300), "test"), Error);
  dist::Store client(other, every.port(), std::chrono::seconds(10));
  client.set("k", "v");
  CHECK(client.get("k") == "v");
  // An address that is not one of this host's cannot be listened on.
  std::string foreign;
  for (const char* a : {"198.51.100.77", "203.0.113.77", "192.0.2.77"})
    if (foreign.empty() && !is_local_address(a)) foreign = a;
  REQUIRE_FALSE(foreign.empty());
  CHECK_THROWS_WITH_AS(dist::StoreServer(dist::StoreServerOptions{.host = foreign}),
                       doctest::Contains("not an address of this host"), Error);
}

TEST_CASE("dist::Store: client and server prove to each other that they know the token") {
  dist::StoreServer server(dist::StoreServerOptions{.token = kToken});
  const int port = server.port();
  dist::Store rank("127.0.0.1", port, std::chrono::seconds(10), kToken);
  rank.set("key", "value");
  CHECK(rank.get("key") == "value");
  CHECK(rank.add("n", 2) == 2);
  CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", port, std::chrono::seconds(5)),
                       doctest::Contains("the store requires the job's token: set EMBER_DIST_TOKEN"), Error);
  CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", port, std::chrono::seconds(5), "another-token-0123456789"),
                       doctest::Contains("the store refused the connection: \"the client did not prove it knows the "
                                         "job's token (EMBER_DIST_TOKEN)\""),
                       Error);
  {
    // A client that skips the proof and sends a request: disconnected, the key is neither written nor read.
    dist::Socket raw = dist::Socket::connect("127.0.0.1", port, in_ms(5000), "raw");
    char hello[dd::kServerHelloBytes];
    raw.recv_all(hello, sizeof hello, in_ms(5000), "raw");
    const std::string attack = "EMBC" + std::string(64, 'x') + set_req("key", "stolen") + set_req("new", "1");
    raw.send_all(attack.data(), attack.size(), in_ms(5000), "raw");
    std::string back;
    char buf[256];
    for (;;) {
      if (!raw.wait_readable(in_ms(5000))) break;
      const ssize_t r = ::recv(raw.fd(), buf, sizeof buf, 0);
      if (r <= 0) break;
      back.append(buf, std::size_t(r));
    }
    CHECK(back.size() > 9);
    CHECK(back[0] == char(dd::kRefused));
  }
  CHECK(rank.get("key") == "value");
  CHECK_FALSE(rank.check("new"));
  // A client with a token refuses a store that asks for none: it cannot be the job's.
  dist::StoreServer open(0);
  CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", open.port(), std::chrono::seconds(5), kToken),
                       doctest::Contains("the store does not ask for a token, but this process has one"), Error);
  CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", port, std::chrono::seconds(5), "short"),
                       doctest::Contains("dist::Store: the token holds 5 bytes"), Error);
}

TEST_CASE("dist::Store: a rogue server cannot pass for the job's store, and its text is quoted as data") {
  {
    // It asks for the token, then answers the proof with a made-up one: the client gives up before any request.
    Rogue rogue([](Rogue& r, dist::Socket& s) {
      const std::string g = Rogue::greeting(dd::kAuthToken);
      s.send_all(g.data(), g.size(), in_ms(5000), "rogue");
      char hello[dd::kClientHelloBytes];
      s.recv_all(hello, sizeof hello, in_ms(5000), "rogue");
      const std::string ok = Rogue::reply(dd::kOk, std::string(32, 'p'));
      s.send_all(ok.data(), ok.size(), in_ms(5000), "rogue");
      r.drain(s);
    });
    CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", rogue.port(), std::chrono::seconds(5), kToken),
                         doctest::Contains("the store could not prove it knows the job's token"), Error);
    rogue.thread.join();
    rogue.thread = std::thread([] {});
    CHECK(rogue.received_after_hello == 0);
  }
  const std::string evil = "\x1b[2J\nrank 0: all good\r\x07";
  const std::string quoted = "\"\\x1b[2J\\nrank 0: all good\\r\\x07\"";
  {
    // An open store whose refusal of a request carries control bytes: they arrive escaped.
    Rogue rogue([&](Rogue& r, dist::Socket& s) {
      const std::string g = Rogue::greeting(dd::kAuthOpen);
      s.send_all(g.data(), g.size(), in_ms(5000), "rogue");
      char buf[dd::kClientHelloBytes];
      s.recv_all(buf, sizeof buf, in_ms(5000), "rogue");
      const std::string ok = Rogue::reply(dd::kOk, std::string(32, '\0'));
      s.send_all(ok.data(), ok.size(), in_ms(5000), "rogue");
      char req[5 + 1 + 8 + 1];
      s.recv_all(req, sizeof req, in_ms(5000), "rogue");
      const std::string no = Rogue::reply(dd::kRefused, evil);
      s.send_all(no.data(), no.size(), in_ms(5000), "rogue");
      r.drain(s);
    });
    dist::Store client("127.0.0.1", rogue.port(), std::chrono::seconds(5));
    try {
      client.set("k", "v");
      FAIL("the refusal was not an error");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK(m.find("the store refused the request: " + quoted) != std::string::npos);
      CHECK(m.find('\x1b') == std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
  }
  {
    // The same text as the refusal of the connection itself.
    Rogue rogue([&](Rogue& r, dist::Socket& s) {
      const std::string g = Rogue::greeting(dd::kAuthToken);
      s.send_all(g.data(), g.size(), in_ms(5000), "rogue");
      char buf[dd::kClientHelloBytes];
      s.recv_all(buf, sizeof buf, in_ms(5000), "rogue");
      const std::string no = Rogue::reply(dd::kRefused, evil);
      s.send_all(no.data(), no.size(), in_ms(5000), "rogue");
      r.drain(s);
    });
    CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", rogue.port(), std::chrono::seconds(5), kToken),
                         doctest::Contains(("the store refused the connection: " + quoted).c_str()), Error);
  }
  {
    // Something else on the port: its first bytes are quoted too.
    Rogue rogue([&](Rogue& r, dist::Socket& s) {
      const std::string g = "HTTP/1.1 400\x1b[31m" + std::string(dd::kServerHelloBytes, '\n');
      s.send_all(g.data(), g.size(), in_ms(5000), "rogue");
      r.drain(s);
    });
    CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", rogue.port(), std::chrono::seconds(5)),
                         doctest::Contains("does not answer as this version of ember's store (it sent \"HTTP/1.1 "
                                           "400\\x1b[31m\\n"),
                         Error);
  }
}

namespace {
// A raw connection that passes the handshake with `token` (for clients that misbehave after it).
dist::Socket raw_client(int port, const std::string& token) {
  dist::Socket s = dist::Socket::connect("127.0.0.1", port, in_ms(10000), "insider");
  char hello[dd::kServerHelloBytes];
  s.recv_all(hello, sizeof hello, in_ms(10000), "insider");
  unsigned char nc[32] = {};
  const dd::Digest proof = dd::client_proof(token, reinterpret_cast<const unsigned char*>(hello + 6), nc);
  const std::string msg = "EMBC" + std::string(32, '\0') + std::string(reinterpret_cast<const char*>(proof.data()), 32);
  s.send_all(msg.data(), msg.size(), in_ms(10000), "insider");
  char answer[9 + 32];
  s.recv_all(answer, sizeof answer, in_ms(10000), "insider");
  if (answer[0] != char(dd::kOk)) throw Error("insider: refused");
  s.set_nonblocking(true);
  return s;
}
// Sends what the kernel takes of `bytes` without waiting; returns how much.
std::size_t push(const dist::Socket& s, const std::string& bytes) {
  const ssize_t w = ::send(s.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return w > 0 ? std::size_t(w) : 0;
}
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
}  // namespace

TEST_CASE("dist::StoreServer: a soak of rogue and legitimate clients: the legitimate ones finish, buffers stay bounded") {
  dist::StoreLimits lim;
  lim.max_clients = 64;
  lim.max_handshakes = 16;
  lim.handshake_timeout = std::chrono::milliseconds(300);
  lim.request_timeout = std::chrono::seconds(1);
  lim.connection_buffer = 64 << 10;
  lim.shared_buffer = 2 << 20;
  dist::StoreServer server(dist::StoreServerOptions{.token = kToken, .limits = lim});
  const int port = server.port();
  const std::uint64_t bound = (64 + 16) * (64 << 10) + (2 << 20);
  REQUIRE(server.stats().buffered_bound == bound);
  {
    dist::Store setup("127.0.0.1", port, std::chrono::seconds(30), kToken);
    setup.set("big", std::string(512 << 10, 'b'));
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  auto rogue = [&](std::function<void()> round) {
    threads.emplace_back([&stop, round] {
      while (!stop) {
        try {
          round();
        } catch (const Error&) {  // the server hung up: that is its right
        }
      }
    });
  };
  // Idle connections by the hundred, the oldest replaced by a new one each millisecond.
  for (int k = 0; k < 2; ++k)
    rogue([&] {
      std::deque<dist::Socket> held;
      while (!stop) {
        held.push_back(dist::Socket::connect("127.0.0.1", port, in_ms(2000), "idle"));
        if (held.size() > 100) held.pop_front();
        sleep_ms(1);
      }
    });
  // Garbage, then a hang-up.
  rogue([&] {
    dist::Socket s = dist::Socket::connect("127.0.0.1", port, in_ms(2000), "garbage");
    std::string junk(1024, '\0');
    for (auto& c : junk) c = char(std::rand());
    push(s, junk);
    sleep_ms(2);
  });
  // A wrong token, with requests after it.
  rogue([&] {
    dist::Socket s = raw_client(port, "wrong-token-0123456789");
    push(s, set_req("big", "stolen"));
  });
  // A greeting one byte at a time.
  rogue([&] {
    dist::Socket s = dist::Socket::connect("127.0.0.1", port, in_ms(2000), "slow");
    for (int i = 0; i < 68 && !stop; ++i) {
      push(s, "E");
      sleep_ms(50);
    }
  });
  // Insiders (they have the token): pipelined GETs of a 512 KiB value never read, and large SETs never finished.
  for (int k = 0; k < 2; ++k)
    rogue([&] {
      dist::Socket s = raw_client(port, kToken);
      std::string gets;
      for (int i = 0; i < 500; ++i) gets += request(dd::kGet, "big");
      push(s, gets);
      for (int i = 0; i < 30 && !stop; ++i) sleep_ms(50);
    });
  rogue([&] {
    dist::Socket s = raw_client(port, kToken);
    std::string req = set_req("huge", std::string(1536 << 10, 'h'));
    req.resize(req.size() - 100);
    std::size_t off = 0;
    for (int i = 0; i < 30 && !stop; ++i) {
      off += push(s, req.substr(off));
      sleep_ms(50);
    }
  });
  // The job's ranks: a fresh client every 10 rounds; each round sets, reads back, adds, checks and waits.
  const int m = 4;
  std::vector<std::string> errors(m);
  std::vector<int> rounds(m, 0);
  std::vector<std::thread> legit;
  for (int r = 0; r < m; ++r)
    legit.emplace_back([&, r] {
      try {
        std::unique_ptr<dist::Store> st;
        for (int i = 0; !stop || i < 40; ++i) {
          if (i % 10 == 0) st = std::make_unique<dist::Store>("127.0.0.1", port, std::chrono::seconds(30), kToken);
          const std::string key = "rank" + std::to_string(r) + "/" + std::to_string(i);
          const std::string value(std::size_t(100 + 37 * i), char('a' + r));
          st->set(key, value);
          if (st->get(key) != value) throw Error("read back another value at " + key);
          if (st->add("count" + std::to_string(r), 1) != i + 1) throw Error("the count went wrong at " + key);
          if (!st->check(key)) throw Error("check lost " + key);
          st->wait({key});
          rounds[std::size_t(r)] = i + 1;
        }
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
      }
    });
  std::size_t most_connections = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
    most_connections = std::max(most_connections, server.stats().connections);
    sleep_ms(10);
  }
  stop = true;
  for (auto& t : legit) t.join();
  for (auto& t : threads) t.join();
  for (int r = 0; r < m; ++r) {
    CAPTURE(r);
    CHECK(errors[std::size_t(r)] == "");
    CHECK(rounds[std::size_t(r)] >= 40);
  }
  const auto st = server.stats();
  MESSAGE("peak buffered ", st.peak_buffered_bytes, " bytes of at most ", bound, "; at most ", most_connections,
          " connections; rounds ", rounds[0], " ", rounds[1], " ", rounds[2], " ", rounds[3]);
  CHECK(st.peak_buffered_bytes <= bound);
  CHECK(most_connections <= lim.max_clients + lim.max_handshakes);
  dist::Store after("127.0.0.1", port, std::chrono::seconds(30), kToken);
  CHECK((after.get("big") == std::string(512 << 10, 'b')));
  CHECK_FALSE(after.check("huge"));
}
