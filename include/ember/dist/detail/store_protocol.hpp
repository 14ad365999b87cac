// ember — the rendezvous store server's side of the protocol: StoreCore::hello, which checks a client's greeting and
// its proof of the token, and StoreCore::serve, which answers the requests (SET, ADD, CHECK, DEL, GET, WAIT) against
// the keys and values. The bytes themselves are in dist/detail/store_wire.hpp; the connections' buffers, waits and
// deadlines are StoreCore's, in <ember/dist/store_core.hpp>, which includes this.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ember/config.hpp"
#include "ember/dist/detail/auth.hpp"
#include "ember/dist/detail/store_wire.hpp"
#include "ember/dist/store_core.hpp"

namespace ember::dist {

// The client's greeting is complete: its proof decides whether it is served.
inline void StoreCore::hello(Id id, Conn& c) {
  const char* p = c.in.data();
  if (std::string_view(p, 4) != detail::kClientMagic) {  // not an ember client (or another protocol version)
    drop(id, true);
    return;
  }
  const auto* nonce_c = reinterpret_cast<const unsigned char*>(p + 4);
  const auto* proof = reinterpret_cast<const unsigned char*>(p + 4 + detail::kNonceBytes);
  if (!token_.empty()) {
    const detail::Digest want = detail::client_proof(token_, c.nonce, nonce_c);
    if (!detail::equal_constant_time(want.data(), proof, want.size())) {
      refuse_and_close(c, "the client did not prove it knows the job's token (EMBER_DIST_TOKEN)");
      return;
    }
  }
  if (ready_count_ >= limits_.max_clients) {
    refuse_and_close(c, "the store already serves " + std::to_string(ready_count_) + " connections");
    return;
  }
  detail::Digest mine{};
  if (!token_.empty()) mine = detail::server_proof(token_, c.nonce, nonce_c);
  c.in.clear();
  c.stage = Stage::Ready;
  c.since = now_;
  --handshakes_;
  ++ready_count_;
  reply(c, detail::kOk, std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size()));
}

// Answers the complete requests at the front of c.in, stopping at one that must wait (for a key, for its replies
// to be read, or for room in the shared buffer).
inline void StoreCore::serve(Id id, Conn& c) {
  if (c.stage != Stage::Ready) return;
  std::size_t pos = 0;
  bool served = false;
  while (!c.waits && !c.starved && !c.dead && c.pending_out() < limits_.connection_buffer) {
    const std::size_t avail = c.in.size() - pos;
    const char* p = c.in.data() + pos;
    if (avail < 5) break;
    const auto cmd = std::uint8_t(p[0]);
    const std::uint64_t klen = detail::get_le(p + 1, 4);
    if (cmd < detail::kSet || cmd > detail::kWait || klen > detail::kMaxKey) {
      c.dead = true;
      break;
    }
    std::uint64_t need = 5 + klen, vlen = 0;
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
    if (need > limits_.connection_buffer + limits_.shared_buffer) {  // could never be held
      c.dead = true;
      break;
    }
    if (avail < need) break;
    const std::string_view key(p + 5, klen);
    auto it = data_.find(key);
    if ((cmd == detail::kGet || cmd == detail::kWait) && it == data_.end()) {
      c.waits = true;
      c.waiting = std::string(key);
      waiters_[c.waiting].push_back(id);
      break;
    }
    // What this connection will hold once the request is answered (replies other than a GET's value are at most
    // 64 bytes); a reply that does not fit waits for room. A value that could never fit is refused.
    const bool too_large = cmd == detail::kGet && detail::kReplyHead + it->second.size() >
                                                      limits_.connection_buffer + limits_.shared_buffer;
    const std::uint64_t answer = cmd == detail::kGet && !too_large ? it->second.size() : 64;
    if (!room_for(c, c.in.size() - pos - need + c.pending_out() + detail::kReplyHead + answer)) {
      c.starved = true;
      starved_.push_back(id);
      break;
    }
    pos += need;
    served = true;
    switch (cmd) {
      case detail::kSet:
      case detail::kAdd: {
        std::string value;
        if (cmd == detail::kSet) {
          value.assign(p + 5 + klen + 8, vlen);
        } else {
          long long cur = 0;
          if (it != data_.end() && !it->second.empty() && !ember::detail::parse_int(it->second, cur)) {
            reply(c, detail::kRefused, "the value is not an integer");
            break;
          }
          const auto delta = detail::get_le(p + 5 + klen, 8);  // added in two's complement
          value = std::to_string(static_cast<long long>(static_cast<std::uint64_t>(cur) + delta));
        }
        const std::uint64_t old = it == data_.end() ? 0 : key.size() + it->second.size();
        const std::uint64_t after = bytes_ - old + key.size() + value.size();
        if (after > limits_.max_store_bytes) {
          reply(c, detail::kRefused, "the store is full");
          break;
        }
        bytes_ = after;
        if (it == data_.end()) it = data_.emplace(std::string(key), std::move(value)).first;
        else it->second = std::move(value);
        reply(c, detail::kOk, cmd == detail::kAdd ? std::string_view(it->second) : std::string_view());
        wake_waiters(it->first);
        break;
      }
      case detail::kCheck: reply(c, it != data_.end() ? detail::kOk : detail::kMissing, {}); break;
      case detail::kDel:
        if (it == data_.end()) {
          reply(c, detail::kMissing, {});
        } else {
          bytes_ -= key.size() + it->second.size();
          data_.erase(it);
          reply(c, detail::kOk, {});
        }
        break;
      case detail::kGet:
        if (too_large) reply(c, detail::kRefused, "the value is larger than the server's reply buffers");
        else reply(c, detail::kOk, it->second);
        break;
      case detail::kWait: reply(c, detail::kOk, {}); break;
    }
  }
  if (c.dead) {
    drop(id, true);
    return;
  }
  c.in.erase(0, pos);
  if (served) c.since = now_;
  recount(c);
}

}  // namespace ember::dist
