// ember — the backward pass: runs the nodes reachable from a root in reverse recording order, each once all of
// its consumers have delivered their gradients; leaf sinks run as soon as they are complete (so a DDP hook can
// start communicating while the rest of backward continues). Without retain_graph, each node frees what it
// saved right after it runs.
#pragma once

#include <functional>
#include <memory>
#include <queue>
#include <unordered_map>
#include <vector>

#include "ember/config.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/profile/range.hpp"

namespace ember::autograd {

/// The backward passes running on this thread and what to run when they end (queue_callback).
struct BackwardPassState {
  int depth = 0;                                 ///< Nested backward passes running on this thread.
  std::vector<std::function<void()>> callbacks;  ///< What to run when the outermost one ends.
};
inline BackwardPassState& backward_pass_state() {
  thread_local BackwardPassState s;
  return s;
}

/// Runs `fn` once the backward pass now running on this thread has finished, after every node and gradient hook
/// (torch's Variable._execution_engine.queue_callback). DistributedDataParallel waits for its gradient all-reduces
/// here, so backward() returns with the gradients averaged. An error outside a backward pass.
inline void queue_callback(std::function<void()> fn) {
  auto& s = backward_pass_state();
  EMBER_CHECK(s.depth > 0, "autograd::queue_callback: called outside a backward pass");
  s.callbacks.push_back(std::move(fn));
}

EMBER_HEADER_INLINE void run_backward(const std::shared_ptr<Node>& root, bool retain_graph);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void run_backward(const std::shared_ptr<Node>& root, bool retain_graph) {
  auto& state = backward_pass_state();
  struct Depth {  // the callbacks queued by a pass that fails are dropped with it
    BackwardPassState& s;
    explicit Depth(BackwardPassState& st) : s(st) { ++s.depth; }
    ~Depth() {
      if (--s.depth == 0) s.callbacks.clear();
    }
  } depth(state);
  // Count, for every reachable node, how many edges point at it.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root.get()};
  deps[root.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e) continue;
      auto [it, fresh] = deps.try_emplace(e.get(), 0);
      ++it->second;
      if (fresh) stack.push_back(e.get());
    }
  }
  auto later_first = [](Node* a, Node* b) { return a->seq < b->seq; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  ready.push(root.get());
  NoGradGuard no_grad;  // backward itself records nothing
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    EMBER_CHECK(!n->released, "backward: trying to go through ", n->name(),
                " a second time, but its saved tensors were freed by the first backward(); call "
                "backward(retain_graph = true) the first time if you need to run backward twice");
    {
      profile::Range range(n->name(), "backward");
      n->apply();
    }
    n->clear_grad();
    if (!retain_graph && !n->is_accumulator()) {
      n->release();
      n->released = true;
    }
    for (auto& e : n->next)
      if (e && --deps[e.get()] == 0) ready.push(e.get());
  }
  if (state.depth == 1) {
    // (A callback may queue another one.)
    for (std::size_t i = 0; i < state.callbacks.size(); ++i) {
      auto fn = std::move(state.callbacks[i]);
      fn();
    }
  }
}
#endif

}  // namespace ember::autograd
