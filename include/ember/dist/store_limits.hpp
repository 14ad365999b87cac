// ember — StoreLimits: the bounds the rendezvous store's server holds every client to (bytes stored, clients,
// handshakes and their timeouts, buffers); what each bound protects against is described in dist/store_core.hpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "ember/dist/detail/store_wire.hpp"

namespace ember::dist {

/// What the store's server allows its clients (StoreServerOptions::limits). The defaults suit a job of up to
/// thousands of ranks. PyTorch's TCPStore has no such limits.
struct StoreLimits {
  /// Bytes of keys and values held, together (the default, kMaxStoreBytes, is 1 GiB).
  std::uint64_t max_store_bytes = detail::kMaxStoreBytes;
  /// Connections that proved the token (the job's ranks, launchers, tools); the default, kMaxStoreClients, is 4096.
  std::size_t max_clients = detail::kMaxStoreClients;
  /// Connections still in their handshake; a new one beyond this drops the oldest.
  std::size_t max_handshakes = 64;
  /// How long a new connection has to prove the token.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  /// How long a connection may hold part of a request without completing one.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(60);
  /// Bytes of requests and replies each connection may buffer of its own.
  std::size_t connection_buffer = std::size_t(64) << 10;
  /// Bytes buffered beyond the connections' own shares (large values on their way), all connections together.
  std::uint64_t shared_buffer = std::uint64_t(128) << 20;
};

}  // namespace ember::dist
