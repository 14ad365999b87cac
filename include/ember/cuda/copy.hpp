// ember — copies between host and CUDA memory and between CUDA devices: the implementation of core's
// detail::CudaCopyPart (core/storage.hpp), which Tensor::to, cuda(), cpu(), copy_, item(), to_vector() and printing
// use. Including this header registers it.
//
// Ordering: a copy runs on the current stream of the CUDA device involved (the destination's for copies between
// two devices, after an event makes it wait for the source's current stream, and the source's stream then waits for
// the copy, so neither block is reused too early). Host <-> device copies wait for the copy to finish before
// returning, except with non_blocking from/to pinned memory, where the host storage is handed to
// detail::PendingCopies (cuda/pinned.hpp) and kept alive until an event recorded after the copy has completed.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <cstddef>
#include <optional>
#include <utility>

#include "ember/core/storage.hpp"
#include "ember/cuda/allocator.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/pinned.hpp"
#include "ember/cuda/stream.hpp"
#include "ember/profile/range.hpp"

namespace ember::cuda {

namespace detail {

/// Copies nbytes from src (+src_offset) to dst (+dst_offset); at least one of them is on a CUDA device.
inline void copy_storage(const Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
                         std::size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  const Device dd = dst->device, sd = src->device;
  EMBER_PROFILE_RANGE_CAT(dd.is_cuda() ? (sd.is_cuda() ? "copy device to device" : "copy host to device")
                                       : "copy device to host",
                          "copy");  // the host's part: the launch, and the wait when the copy blocks
  char* d = static_cast<char*>(dst->data) + dst_offset;
  const char* s = static_cast<const char*>(src->data) + src_offset;
  PendingCopies::instance().poll();
  if (dd.is_cuda() && sd.is_cuda()) {
    check_device(dd, "copy");
    check_device(sd, "copy");
    if (dd.index == sd.index) {
      // Same device: ordered on the current stream, asynchronous to the host as in PyTorch.
      DeviceGuard g(dd.index);
      EMBER_CUDA_CHECK(cudaMemcpyAsync(d, s, nbytes, cudaMemcpyDeviceToDevice, current_stream(dd.index).handle()));
      return;
    }
    const Stream ss = current_stream(sd.index), ds = current_stream(dd.index);
    std::optional<Event> ready, done;
    {
      DeviceGuard g(sd.index);
      ready.emplace();
      ready->record(ss);  // the source is ready when the work queued on its stream so far is done
    }
    {
      DeviceGuard g(dd.index);
      ready->block(ds);
      EMBER_CUDA_CHECK(cudaMemcpyPeerAsync(d, dd.index, s, sd.index, nbytes, ds.handle()));
      done.emplace();
      done->record(ds);
    }
    {
      DeviceGuard g(sd.index);
      done->block(ss);  // the source's block may be freed and reused on its stream only after the copy
    }
    if (!non_blocking) ds.synchronize();
    return;
  }
  const bool h2d = dd.is_cuda();
  const Device dev = h2d ? dd : sd;
  const Storage& host = h2d ? src : dst;
  check_device(dev, "copy");
  DeviceGuard g(dev.index);
  const Stream st = current_stream(dev.index);
  EMBER_CUDA_CHECK(cudaMemcpyAsync(d, s, nbytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, st.handle()));
  if (non_blocking && ::ember::is_pinned(*host)) {
    Event done;
    done.record(st);
    PendingCopies::instance().add(std::move(done), host);
  } else {
    st.synchronize();  // pageable memory, or a blocking copy: done when this returns
  }
}

inline const bool copy_registered = ::ember::detail::provide<::ember::detail::CudaCopyPart>(&copy_storage);

}  // namespace detail

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
