// ember — the rendezvous store's wire format (little-endian), spoken after the handshake of dist/detail/auth.hpp:
// a request is u8 command, u32 key length, key, then for SET a u64 value length and the value, for ADD an i64; a reply
// is u8 status (0 ok, 1 missing, 2 refused), u64 length, payload (GET's value, ADD's sum, or why it was refused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ember::dist::detail {

enum StoreCmd : std::uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kDel = 5, kWait = 6 };
enum StoreStatus : std::uint8_t { kOk = 0, kMissing = 1, kRefused = 2 };
inline constexpr std::size_t kMaxKey = 4096;
inline constexpr std::uint64_t kMaxValue = std::uint64_t(64) << 20;
inline constexpr std::uint64_t kMaxStoreBytes = std::uint64_t(1) << 30;
inline constexpr std::size_t kMaxStoreClients = 4096;
inline constexpr std::size_t kReplyHead = 9;

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

}  // namespace ember::dist::detail
