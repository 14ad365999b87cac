// ember — how the ranks of a group exchange the little they need to set a backend up (addresses, a segment's name,
// an NCCL id): an all-gather of short strings. Through the TCP store (StoreBootstrap) or, under mpirun, MPI itself.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/socket.hpp"
#include "ember/dist/store.hpp"

namespace ember::dist {

/// How the ranks of a group exchange the little they need to connect (addresses, NCCL's unique id) before any
/// collective runs: through the rendezvous store (StoreBootstrap) or through MPI.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  /// Every rank's `mine`, in rank order. `what` names the exchange in keys and error messages ("tcp addresses").
  virtual std::vector<std::string> all_gather(const std::string& mine, const std::string& what, Deadline d) = 0;
  /// Leaves the reason a rank gave up for the others to quote (best effort; never throws).
  virtual void post_abort(const std::string& why) noexcept { (void)why; }
  /// The reason another rank left, if any (best effort, waits briefly; never throws).
  virtual std::string read_abort() noexcept { return {}; }
  /// Where the rendezvous happens, for messages ("the store at 10.0.0.1:29500").
  virtual std::string where() const = 0;
};

/// The all-gather through the store: rank r sets "<prefix>/<what>/<round>/<r>" and reads the others' keys. A rank
/// that never sets its key makes the others fail at the deadline with a message naming the missing ranks.
class StoreBootstrap : public Bootstrap {
 public:
  /// Exchanges through `store` under keys starting with `prefix`, as rank `rank` of `world`.
  StoreBootstrap(std::shared_ptr<Store> store, std::string prefix, int rank, int world)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_(world) {}

  std::vector<std::string> all_gather(const std::string& mine, const std::string& what, Deadline d) override {
    const std::string base = prefix_ + "/" + what + "/" + std::to_string(round_++) + "/";
    store_->set(base + std::to_string(rank_), mine);
    std::vector<std::string> out(static_cast<std::size_t>(world_));
    for (int k = 0; k < world_; ++k) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now());
      try {
        out[std::size_t(k)] = store_->get(base + std::to_string(k), std::max(left, std::chrono::milliseconds(0)));
      } catch (const Error&) {
        // Name every rank that has not arrived (the reason, not just the first missing key).
        std::string missing;
        int arrived = 0;
        try {
          for (int j = 0; j < world_; ++j) {
            if (store_->check(base + std::to_string(j))) ++arrived;
            else missing += (missing.empty() ? "" : ", ") + std::to_string(j);
          }
        } catch (const Error&) {
          throw;  // the store itself is gone: its own message says so
        }
        throw Error("dist: " + what + ": timed out at " + where() + ": " + std::to_string(arrived) + " of " +
                    std::to_string(world_) + " ranks arrived (missing: rank " + missing + ")");
      }
    }
    return out;
  }
  void post_abort(const std::string& why) noexcept override {
    try {
      store_->set(prefix_ + "/abort", "rank " + std::to_string(rank_) + ": " + why);
    } catch (...) {
    }
  }
  std::string read_abort() noexcept override {
    try {
      return store_->get(prefix_ + "/abort", std::chrono::milliseconds(500));
    } catch (...) {
      return {};
    }
  }
  std::string where() const override { return "the store at " + store_->address(); }
  /// The store exchanged through.
  const std::shared_ptr<Store>& store() const { return store_; }
  /// The keys' prefix.
  const std::string& prefix() const { return prefix_; }

 private:
  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_, world_;
  std::uint64_t round_ = 0;
};

}  // namespace ember::dist
