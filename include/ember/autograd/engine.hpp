// ember — the backward pass: runs the nodes reachable from a root in reverse recording order, each once all of
// its consumers have delivered their gradients; leaf sinks run as soon as they are complete (so a DDP hook can
// start communicating while the rest of backward continues). Without retain_graph, each node frees what it
// saved right after it runs.
#pragma once

#include <memory>
#include <queue>
#include <unordered_map>
#include <vector>

#include "ember/config.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"

namespace ember::autograd {

EMBER_HEADER_INLINE void run_backward(const std::shared_ptr<Node>& root, bool retain_graph);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void run_backward(const std::shared_ptr<Node>& root, bool retain_graph) {
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
    n->apply();
    n->clear_grad();
    if (!retain_graph && !n->is_accumulator()) {
      n->release();
      n->released = true;
    }
    for (auto& e : n->next)
      if (e && --deps[e.get()] == 0) ready.push(e.get());
  }
}
#endif

}  // namespace ember::autograd
