// ember — grad mode: whether operations record autograd nodes on this thread.
#pragma once

#include "ember/core/storage.hpp"

namespace ember {

namespace autograd {
inline bool& grad_mode_flag() {
  thread_local bool on = true;
  return on;
}
}  // namespace autograd

inline bool is_grad_enabled() { return autograd::grad_mode_flag(); }

/// While alive, nothing is recorded on this thread (inference, optimizer updates). Costs one flag check per op.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(autograd::grad_mode_flag()) { autograd::grad_mode_flag() = false; }
  ~NoGradGuard() { autograd::grad_mode_flag() = prev_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Turns grad mode on or off for a scope (torch.set_grad_enabled).
class GradModeGuard {
 public:
  /// Grad mode on (true) or off until the guard is destroyed, then the previous mode again.
  explicit GradModeGuard(bool on) : prev_(autograd::grad_mode_flag()) { autograd::grad_mode_flag() = on; }
  ~GradModeGuard() { autograd::grad_mode_flag() = prev_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

/// Evaluation without autograd, cheaper and stricter than NoGradGuard (torch.inference_mode): while alive, nothing
/// is recorded and nothing is saved for backward on this thread, and every tensor allocated is an *inference
/// tensor*: it has no version counter (in-place writes to it cost nothing extra), and outside the guard autograd
/// refuses it (an op that would save it for backward, or requires_grad_(true), is an error naming the tensor).
/// clone() an inference tensor outside the guard to get a normal one. The documented way to evaluate a model:
///   model.eval();
///   { InferenceMode im; auto logits = model(x); ... }
class InferenceMode {
 public:
  /// Inference mode on (or, with false, off: torch.inference_mode(False)) until the guard is destroyed.
  explicit InferenceMode(bool on = true)
      : prev_inference_(detail::inference_mode_flag()), prev_grad_(autograd::grad_mode_flag()) {
    detail::inference_mode_flag() = on;
    if (on) autograd::grad_mode_flag() = false;
  }
  ~InferenceMode() {
    detail::inference_mode_flag() = prev_inference_;
    autograd::grad_mode_flag() = prev_grad_;
  }
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;
  /// Whether inference mode is on in this thread (torch.is_inference_mode_enabled()).
  static bool is_enabled() { return detail::inference_mode_flag(); }

 private:
  bool prev_inference_, prev_grad_;
};

inline bool is_inference_mode_enabled() { return detail::inference_mode_flag(); }

}  // namespace ember
