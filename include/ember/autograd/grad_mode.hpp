// ember — grad mode: whether operations record autograd nodes on this thread.
#pragma once

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
  explicit GradModeGuard(bool on) : prev_(autograd::grad_mode_flag()) { autograd::grad_mode_flag() = on; }
  ~GradModeGuard() { autograd::grad_mode_flag() = prev_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace ember
