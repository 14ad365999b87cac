// ember — optional parts: the one way a layer calls a part of ember that it must not include. core/ calls cuda/'s
// allocators and copies (core never includes CUDA headers), dist/ calls the NCCL and MPI backends (which need
// libraries most programs do not link), the Trainer calls the checkpoint files of train/checkpoint.hpp.
//
// The calling layer declares the part's entry point: a tag type whose Entry is the function-pointer type. The part's
// header installs it when a translation unit includes it, in one line,
//   inline const bool registered = ember::detail::provide<detail::CudaCopyPart>(&copy_storage);
// and the caller reads it with part<P>() (null when the program does not include the part: the caller's error then
// says what to include and link). A test may install a stand-in and remove it again with provide<P>(nullptr).
#pragma once

namespace ember::detail {

/// The entry point of optional part P, null until P's header (or a test) installs it. Zero-initialised before any
/// dynamic initialisation, so a part installed from another translation unit's initialiser is never overwritten.
template <class P>
inline typename P::Entry part_entry = nullptr;

/// Installs e as the entry point of part P (null removes it); returns true, for an `inline const bool` initialiser.
template <class P>
bool provide(typename P::Entry e) {
  part_entry<P> = e;
  return true;
}

/// The entry point of part P, or null when the program does not include P.
template <class P>
typename P::Entry part() {
  return part_entry<P>;
}

}  // namespace ember::detail
