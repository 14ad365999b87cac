// ember — nn::ModuleList and nn::ModuleDict: hold submodules of any type, register them (their parameters join
// the parent's, under "0", "1", ... or the given keys) and hand them back by position or key.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

namespace detail {
/// Iterates a vector of shared module pointers as Module& (or M& for a typed list).
template <class M, class It>
struct DerefIterator {
  It it;
  M& operator*() const { return static_cast<M&>(**it); }
  M* operator->() const { return &**this; }
  DerefIterator& operator++() {
    ++it;
    return *this;
  }
  bool operator==(const DerefIterator& o) const { return it == o.it; }
  bool operator!=(const DerefIterator& o) const { return it != o.it; }
};

template <class M>
M& checked_cast(Module& m, const char* op, const std::string& where) {
  static_assert(std::is_base_of_v<Module, M>, "the requested type must derive from nn::Module");
  auto* p = dynamic_cast<M*>(&m);
  EMBER_CHECK(p != nullptr, op, ": ", where, " holds a ", m.type_name(), ", not the requested module type");
  return *p;
}
}  // namespace detail

/// A list of submodules (torch.nn.ModuleList): registered under their positions, so model.parameters() and
/// state_dict() see them ("blocks.3.attn.in_proj_weight"). Copies share the modules, as every Module handle.
///   nn::ModuleList blocks;
///   for (int i = 0; i < 4; ++i) blocks.push_back(Block(...));
///   for (auto& b : blocks) x = static_cast<Block&>(b).forward(x);   // or blocks.at<Block>(i)
class ModuleList : public Module {
  using Items = std::vector<std::shared_ptr<Module>>;

 public:
  ModuleList() : Module("ModuleList") {}
  /// A list of `modules`, in order (nn.ModuleList([...])).
  template <class... M>
    requires(sizeof...(M) > 0 && (std::is_base_of_v<Module, std::remove_cvref_t<M>> && ...))
  explicit ModuleList(M&&... modules) : Module("ModuleList") {
    (push_back(std::forward<M>(modules)), ...);
  }

  /// Appends a module (a handle to it: the caller's copy and the list's share parameters); returns the list's.
  template <class M>
  std::remove_cvref_t<M>& push_back(M&& module) {
    using D = std::remove_cvref_t<M>;
    static_assert(std::is_base_of_v<Module, D>, "ModuleList::push_back: expected an nn::Module");
    auto m = std::make_shared<D>(std::forward<M>(module));
    register_module(std::to_string(items_->size()), *m);
    items_->push_back(m);
    return *m;
  }
  /// The number of modules (len(list)).
  std::size_t size() const { return items_->size(); }
  /// Whether the list has no modules.
  bool empty() const { return items_->empty(); }
  /// Entry i (negative counts from the end, as in Python).
  Module& operator[](std::int64_t i) const { return *(*items_)[index(i)]; }
  /// Entry i as its C++ type M (an error naming the entry's type_name() when it is another).
  template <class M>
  M& at(std::int64_t i) const {
    return detail::checked_cast<M>((*this)[i], "ModuleList::at", "entry " + std::to_string(i));
  }
  /// Iterates the modules in order, as Module& (`for (auto& m : list)`).
  detail::DerefIterator<Module, Items::const_iterator> begin() const { return {items_->cbegin()}; }
  /// The end of the iteration.
  detail::DerefIterator<Module, Items::const_iterator> end() const { return {items_->cend()}; }

 private:
  std::size_t index(std::int64_t i) const {
    const auto n = std::int64_t(items_->size());
    EMBER_CHECK(i >= -n && i < n, "ModuleList: index ", i, " is out of range for a list of ", n, " modules");
    return std::size_t(i < 0 ? i + n : i);
  }
  std::shared_ptr<Items> items_ = std::make_shared<Items>();  // shared by the list's handles
};

/// Submodules by name, in insertion order (torch.nn.ModuleDict): registered under their keys.
class ModuleDict : public Module {
  using Items = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;

 public:
  ModuleDict() : Module("ModuleDict") {}

  /// Adds a module under `key` (a valid name: non-empty, no '.', not yet used); returns the dict's handle.
  template <class M>
  std::remove_cvref_t<M>& insert(const std::string& key, M&& module) {
    using D = std::remove_cvref_t<M>;
    static_assert(std::is_base_of_v<Module, D>, "ModuleDict::insert: expected an nn::Module");
    auto m = std::make_shared<D>(std::forward<M>(module));
    register_module(key, *m);
    items_->emplace_back(key, m);
    return *m;
  }
  /// The number of modules (len(dict)).
  std::size_t size() const { return items_->size(); }
  /// Whether the dict has no modules.
  bool empty() const { return items_->empty(); }
  /// Whether a module is stored under `key` (`key in dict`).
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  /// The keys, in insertion order (dict.keys()).
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const auto& [n, m] : *items_) k.push_back(n);
    return k;
  }
  /// The module under `key`; an error listing the keys when there is none.
  Module& operator[](const std::string& key) const {
    Module* m = find(key);
    if (!m) {
      std::string have;
      for (const auto& [n, x] : *items_) have += (have.empty() ? "'" : ", '") + n + "'";
      throw Error("ModuleDict: no module under key '" + key + "' (keys: " + (have.empty() ? "none" : have) + ")");
    }
    return *m;
  }
  /// The module under `key` as its C++ type M (an error naming its type_name() when it is another).
  template <class M>
  M& at(const std::string& key) const {
    return detail::checked_cast<M>((*this)[key], "ModuleDict::at", "key '" + key + "'");
  }

 private:
  Module* find(const std::string& key) const {
    for (const auto& [n, m] : *items_)
      if (n == key) return m.get();
    return nullptr;
  }
  std::shared_ptr<Items> items_ = std::make_shared<Items>();
};

}  // namespace ember::nn
