// ember — atomic file replacement for io/: the implementation lives in ember/core/atomic_file.hpp (the data layer
// uses it too); this header keeps the io:: names.
#pragma once

#include "ember/core/atomic_file.hpp"

namespace ember::io {

namespace detail {
using ember::detail::atomic_write_before_rename;
using ember::detail::remove_stale_temp_files;
}  // namespace detail

using ember::AtomicFile;
using ember::atomic_write;

}  // namespace ember::io
