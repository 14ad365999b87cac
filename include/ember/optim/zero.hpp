// ember — ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded across the ranks of a process group.
//
// The parameters of each group are laid end to end (a flat vector, padded to a multiple of the world size) and rank
// r owns the r-th of its world-size equal parts: it keeps optimizer state (momentum, Adam's moments) for that part
// only, so each rank holds about 1/world of the state a plain optimizer would. A step reduce-scatters the gradients
// (each rank receives the average of its part), runs the wrapped optimizer (SGD, Adam, AdamW) on the part, and
// all-gathers the updated parts into every rank's parameters. The result equals the wrapped optimizer stepping on
// the averaged gradients. Under nn::DistributedDataParallel the gradients are averaged already when backward returns:
// ZeRO sees that (nn::ddp_group_of) and only reads its part, so the two compose without options; DDP over another
// process group than ZeRO's, or over part of the parameters, is an error. With `{.reduce_gradients = false}` the
// gradients are taken as averaged by other means.
//
//   optim::ZeroRedundancyOptimizer<optim::AdamW<float>> opt(model.parameters(), {.lr = 3e-4});
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Unlike a plain optimizer, a parameter without a gradient is stepped with a zero gradient (its part of the flat
// vector is zero; Adam's moments and weight decay still move it); a step where no parameter has a gradient is
// skipped. state_dict() is the plain optimizer's format ("state.<i>.exp_avg" per parameter) once
// consolidate_state_dict() has gathered it on one rank; load_state_dict() takes that format on every rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/storage.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/dist/init.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/nn/ddp.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/range.hpp"

namespace ember::optim {

/// The options of optim::ZeroRedundancyOptimizer after (params, the wrapped optimizer's options, process group), its
/// own (torch.distributed.optim.ZeroRedundancyOptimizer has no such option; its parameters_as_bucket_view and
/// overlap_with_ddp are not supported):
///   optim::ZeroRedundancyOptimizer<optim::SGD<float>> opt(params, {.lr = 0.1}, nullptr, {.reduce_gradients = false});
struct ZeroOptions {
  /// Reduce-scatter the gradients (average over the ranks) before the step; false when they are averaged already
  /// (PyTorch's behaviour: its ZeroRedundancyOptimizer never averages them, it expects DDP to have done so).
  /// Gradients that a DistributedDataParallel averaged are never averaged again, whatever this says.
  bool reduce_gradients = true;
};

/// ZeRO-1 around the optimizer `Opt` (SGD<T>, Adam<T> or AdamW<T>).
template <class Opt>
class ZeroRedundancyOptimizer final : public Optimizer {
  using Group = typename Opt::Group;
  using Options = decltype(Group::options);
  using T = typename decltype(Group::params)::value_type::value_type;

 public:
  /// One group of `params` with options `o`, sharded over the ranks of `pg` (the default group when null), as
  /// torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, ...).
  ZeroRedundancyOptimizer(std::vector<Tensor<T>> params, const Options& o, dist::ProcessGroup* pg = nullptr,
                          ZeroOptions z = {})
      : ZeroRedundancyOptimizer(std::vector<Group>{{std::move(params), o}}, pg, z) {}
  /// Several param groups, sharded over the ranks of `pg` (the default group when null).
  explicit ZeroRedundancyOptimizer(std::vector<Group> groups, dist::ProcessGroup* pg = nullptr, ZeroOptions z = {})
      : pg_(pg ? *pg : dist::default_group()), zopt_(z) {
    const std::int64_t w = pg_.size(), r = pg_.rank();
    std::vector<Group> shard_groups;
    for (auto& g : groups) {
      Flat f;
      f.params = g.params;
      for (const auto& p : f.params) {
        EMBER_CHECK(p.defined() && p.is_leaf() && p.is_contiguous(), "optim::ZeroRedundancyOptimizer: parameters "
                    "must be contiguous leaf tensors");
        EMBER_CHECK(p.device() == f.params.front().device(), "optim::ZeroRedundancyOptimizer: the parameters of a "
                    "group are on ", f.params.front().device().str(), " and ", p.device().str());
        f.offsets.push_back(f.total);
        f.total += p.numel();
      }
      const Device dev = f.params.empty() ? Device::cpu() : f.params.front().device();
      f.shard = std::max<std::int64_t>((f.total + w - 1) / w, 1);
      f.begin = r * f.shard;
      f.flat_grad = zeros<T>(Shape{f.shard * w}, dev);
      f.flat_param = zeros<T>(Shape{f.shard * w}, dev);
      f.shard_param = zeros<T>(Shape{f.shard}, dev);
      f.shard_grad = zeros<T>(Shape{f.shard}, dev);
      gather(f, f.shard_param, f.begin, false);  // this rank's part of the parameters
      f.shard_param.grad() = f.shard_grad;
      shard_groups.push_back(Group{{f.shard_param}, g.options});
      flats_.push_back(std::move(f));
    }
    inner_ = std::make_unique<Opt>(std::move(shard_groups));
  }

  void step() override {
    EMBER_PROFILE_RANGE_CAT("ZeroRedundancyOptimizer.step", "optimizer");
    NoGradGuard ng;
    bool any = false;
    for (const Flat& f : flats_)
      for (const auto& p : f.params) any = any || (p.has_meta() && p.grad().defined());
    if (!any) return;
    const bool reduce = zopt_.reduce_gradients && !averaged_by_ddp();
    // 1. Every rank's gradients, flat; each rank receives the average of its own part.
    std::vector<dist::Work> works;
    for (Flat& f : flats_) {
      gather(f, f.flat_grad, 0, true);
      if (reduce) {
        works.push_back(pg_.reduce_scatter_tensor(f.shard_grad, f.flat_grad, dist::ReduceOp::Avg));
      } else {
        copy_bytes(f.shard_grad.storage(), 0, f.flat_grad.storage(), std::size_t(f.begin) * sizeof(T),
                   std::size_t(f.shard) * sizeof(T));
      }
      gather(f, f.shard_param, f.begin, false);  // the parameters as they are now (the user may have loaded some)
    }
    for (auto& w : works) w.wait();
    works.clear();
    // 2. The wrapped optimizer on this rank's part; 3. every rank's updated part into every rank's parameters.
    for (Flat& f : flats_) f.shard_grad.bump_version();
    inner_->step();
    for (Flat& f : flats_) works.push_back(pg_.all_gather_into_tensor(f.flat_param, f.shard_param));
    for (auto& w : works) w.wait();
    for (Flat& f : flats_) scatter(f);
  }

  /// Whether a DistributedDataParallel averages these parameters' gradients in backward (then the step does not
  /// average them again): all of them over this optimizer's group, or none; anything else is an error.
  bool averaged_by_ddp() const {
    std::size_t n = 0, by_ddp = 0;
    bool other_group = false;
    for (const Flat& f : flats_)
      for (const auto& p : f.params) {
        ++n;
        if (const dist::ProcessGroup* g = nn::ddp_group_of(p)) {
          ++by_ddp;
          other_group = other_group || g != &pg_;
        }
      }
    EMBER_CHECK(by_ddp == 0 || by_ddp == n, "optim::ZeroRedundancyOptimizer: DistributedDataParallel averages the "
                "gradients of ", by_ddp, " of its ", n, " parameters; wrap the whole model in DDP, or none of it");
    EMBER_CHECK(!other_group, "optim::ZeroRedundancyOptimizer: its parameters' gradients are averaged by a "
                "DistributedDataParallel over another process group than the optimizer's; give both the same group");
    return by_ddp > 0;
  }

  void zero_grad(bool set_to_none = true) override {
    for (Flat& f : flats_) detail::zero_grads(f.params, set_to_none);
  }
  /// The number of param groups.
  std::size_t num_groups() const override { return inner_->num_groups(); }
  double& lr(std::size_t g) override { return inner_->lr(g); }
  double* momentum(std::size_t g) override { return inner_->momentum(g); }

  /// The optimizer this rank runs on its part of the parameters.
  Opt& local_optimizer() { return *inner_; }
  /// Bytes of optimizer state this rank holds (its part only).
  std::size_t local_state_bytes() const {
    std::size_t n = 0;
    for (const auto& [k, t] : inner_->state_dict())
      if (k.rfind("state.", 0) == 0)
        n += std::visit(
            [](const auto& x) {
              using U = typename std::remove_cvref_t<decltype(x)>::value_type;
              return std::size_t(x.numel()) * sizeof(U);
            },
            t);
    return n;
  }
  /// [begin, end) of group g's flat parameter vector this rank owns (end is clipped to the vector's length).
  std::pair<std::int64_t, std::int64_t> local_range(std::size_t g = 0) const {
    const Flat& f = flats_.at(g);
    return {std::min(f.begin, f.total), std::min(f.begin + f.shard, f.total)};
  }

  /// Gathers the whole optimizer state on rank `to` (every rank must call it); state_dict() there returns it in the
  /// wrapped optimizer's own format.
  void consolidate_state_dict(int to = 0) {
    EMBER_CHECK(to >= 0 && to < pg_.size(), "optim::ZeroRedundancyOptimizer::consolidate_state_dict: rank ", to,
                " is out of range for a world of ", pg_.size());
    const nn::StateDict local = inner_->state_dict();
    nn::StateDict full;
    std::size_t first_param = 0;
    for (std::size_t g = 0; g < flats_.size(); ++g) {
      const Flat& f = flats_[g];
      const std::string pre = "state." + std::to_string(g) + ".";
      for (auto it = local.lower_bound(pre); it != local.end() && it->first.rfind(pre, 0) == 0; ++it) {
        const std::string name = it->first.substr(pre.size());
        if (const Tensor<T>* part = per_element(it->second, f.shard, name)) {
          Tensor<T> all = empty<T>(Shape{f.shard * pg_.size()}, part->device());
          pg_.all_gather_into_tensor(all, *part).wait();
          for (std::size_t k = 0; k < f.params.size(); ++k) {
            const auto& p = f.params[k];
            full.emplace("state." + std::to_string(first_param + k) + "." + name,
                         all.slice(0, f.offsets[k], f.offsets[k] + p.numel()).reshape(p.shape()).clone());
          }
        } else {
          for (std::size_t k = 0; k < f.params.size(); ++k)
            full.emplace("state." + std::to_string(first_param + k) + "." + name, it->second);
        }
      }
      first_param += f.params.size();
    }
    for (auto it = local.lower_bound("param_groups."); it != local.end() && it->first.rfind("param_groups.", 0) == 0;
         ++it)
      full.emplace(it->first, it->second);
    consolidated_ = pg_.rank() == to ? std::move(full) : nn::StateDict();
    consolidated_on_ = to;
  }
  /// The consolidated state (see consolidate_state_dict), on the rank it was gathered to.
  nn::StateDict state_dict() const override {
    EMBER_CHECK(consolidated_on_ == pg_.rank(), "optim::ZeroRedundancyOptimizer::state_dict: call "
                "consolidate_state_dict(", consolidated_on_ < 0 ? 0 : consolidated_on_, ") on every rank first, then "
                "state_dict() on rank ", consolidated_on_ < 0 ? 0 : consolidated_on_, " (this is rank ", pg_.rank(),
                ")");
    return consolidated_;
  }
  /// Loads a state in the wrapped optimizer's format (a plain optimizer's or a consolidated one); every rank keeps
  /// its own part.
  void load_state_dict(const nn::StateDict& sd) override { inner_->load_state_dict(local_state(sd)); }
  void check_state_dict(const nn::StateDict& sd) const override { inner_->check_state_dict(local_state(sd)); }

 private:
  // This rank's part of a state in the wrapped optimizer's format, in the format of inner_ (its shards).
  nn::StateDict local_state(const nn::StateDict& sd) const {
    nn::StateDict local;
    std::size_t first_param = 0;
    for (std::size_t g = 0; g < flats_.size(); ++g) {
      const Flat& f = flats_[g];
      if (f.params.empty()) continue;
      // The names of the first parameter's state stand for the group's.
      const std::string pre0 = "state." + std::to_string(first_param) + ".";
      for (auto it = sd.lower_bound(pre0); it != sd.end() && it->first.rfind(pre0, 0) == 0; ++it) {
        const std::string name = it->first.substr(pre0.size());
        const auto* t0 = std::get_if<Tensor<T>>(&it->second);
        const bool elementwise = name != "step" && t0 && t0->shape() == f.params[0].shape();
        if (!elementwise) {
          local.emplace("state." + std::to_string(g) + "." + name, it->second);
          continue;
        }
        Tensor<T> flat = zeros<T>(Shape{f.shard * pg_.size()}, f.params[0].device());
        for (std::size_t k = 0; k < f.params.size(); ++k) {
          const std::string key = "state." + std::to_string(first_param + k) + "." + name;
          const auto e = sd.find(key);
          const Tensor<T>* t = e == sd.end() ? nullptr : std::get_if<Tensor<T>>(&e->second);
          EMBER_CHECK(t && t->shape() == f.params[k].shape(), "optim::ZeroRedundancyOptimizer::load_state_dict: '",
                      key, "' is ", e == sd.end() ? std::string("missing") : nn::describe(e->second), ", expected ",
                      dtype_name<T>(), " ", f.params[k].shape().str());
          flat.slice(0, f.offsets[k], f.offsets[k] + f.params[k].numel()).copy_(t->reshape(Shape{t->numel()}));
        }
        local.emplace("state." + std::to_string(g) + "." + name, flat.slice(0, f.begin, f.begin + f.shard).clone());
      }
      first_param += f.params.size();
    }
    for (auto it = sd.lower_bound("param_groups."); it != sd.end() && it->first.rfind("param_groups.", 0) == 0; ++it)
      local.emplace(it->first, it->second);
    return local;
  }

  struct Flat {
    std::vector<Tensor<T>> params;
    std::vector<std::int64_t> offsets;  // of each parameter in the flat vector
    std::int64_t total = 0, shard = 0, begin = 0;
    Tensor<T> flat_grad, flat_param;    // (shard * world)
    Tensor<T> shard_param, shard_grad;  // (shard): this rank's part
  };

  static const Tensor<T>* per_element(const AnyTensor& t, std::int64_t shard, const std::string& name) {
    const auto* x = std::get_if<Tensor<T>>(&t);
    return x && name != "step" && x->dim() == 1 && x->numel() == shard ? x : nullptr;
  }

  // Copies elements [from, from + dst.numel()) of the flat vector of the parameters (or of their gradients; zeros
  // where a parameter has none, or past the end) into dst.
  static void gather(const Flat& f, const Tensor<T>& dst, std::int64_t from, bool grads) {
    const std::int64_t to = from + dst.numel();
    if (grads || f.total < to) {  // zeros where nothing is copied
      NoGradGuard ng;
      Tensor<T>(dst).zero_();
    }
    for (std::size_t k = 0; k < f.params.size(); ++k) {
      const std::int64_t a = std::max(from, f.offsets[k]), b = std::min(to, f.offsets[k] + f.params[k].numel());
      if (a >= b) continue;
      Tensor<T> src = f.params[k];
      if (grads) {
        if (!src.has_meta() || !src.grad().defined()) continue;
        src = src.grad().is_contiguous() ? src.grad() : src.grad().contiguous();
      }
      copy_bytes(dst.storage(), std::size_t(dst.storage_offset() + a - from) * sizeof(T), src.storage(),
                 std::size_t(src.storage_offset() + a - f.offsets[k]) * sizeof(T), std::size_t(b - a) * sizeof(T));
    }
    dst.bump_version();
  }
  // Writes the flat parameter vector back into the parameters.
  static void scatter(const Flat& f) {
    for (std::size_t k = 0; k < f.params.size(); ++k) {
      const Tensor<T>& p = f.params[k];
      copy_bytes(p.storage(), std::size_t(p.storage_offset()) * sizeof(T), f.flat_param.storage(),
                 std::size_t(f.offsets[k]) * sizeof(T), std::size_t(p.numel()) * sizeof(T));
      p.bump_version();
    }
  }

  dist::ProcessGroup& pg_;
  ZeroOptions zopt_;
  std::vector<Flat> flats_;
  std::unique_ptr<Opt> inner_;
  nn::StateDict consolidated_;
  int consolidated_on_ = -1;
};

}  // namespace ember::optim
