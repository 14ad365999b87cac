// Cookbook: an fp16 loop with loss scaling, checkpointed and resumed exactly (the scaler's scale and growth tracker
// included) with train::save_run / train::resume_run. README, "Cookbook".
#include <ember/ember.hpp>
#include <ember/train/run.hpp>

#include <cstdio>
#include <filesystem>

using namespace ember;

int main() {
  const std::string path = "cookbook_resume.ckpt";
  std::filesystem::remove(path);
  manual_seed(0);
  // [snippet]
  nn::LinearT<amp::fp16_mixed> model(16, 4);  // fp32 master weights, half activations
  optim::AdamW<float> opt(model.parameters(), {.lr = 1e-3});
  optim::StepLR sched(opt, 10, 0.5);
  amp::GradScaler scaler;
  std::int64_t step = 0;
  const train::Run run{.model = &model, .optimizer = opt, .scheduler = sched, .scaler = scaler, .step = &step};
  if (std::filesystem::exists(path)) train::resume_run(path, run);  // all or nothing
  while (step < 20) {
    const Tensor<half> x = cast<half>(randn<float>({8, 16}));
    Tensor<float> loss = mean(square(Tensor<float>(cast<float>(model(x)))));
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    sched.step();
    if (++step % 5 == 0) train::save_run(path, run);  // every 5 steps (the step count says what is done)
  }
  // [/snippet]
  // A fresh run from the checkpoint continues at step 20 with the same scale.
  nn::LinearT<amp::fp16_mixed> model2(16, 4);
  optim::AdamW<float> opt2(model2.parameters(), {.lr = 1e-3});
  optim::StepLR sched2(opt2, 10, 0.5);
  amp::GradScaler scaler2;
  std::int64_t step2 = 0;
  train::resume_run(path, {.model = &model2, .optimizer = opt2, .scheduler = sched2, .scaler = scaler2,
                           .step = &step2});
  std::printf("resumed at step %lld, scale %g (saved run: %g)\n", static_cast<long long>(step2), scaler2.get_scale(),
              scaler.get_scale());
  std::filesystem::remove(path);
  return step2 == 20 && scaler2.get_scale() == scaler.get_scale() ? 0 : 1;
}
