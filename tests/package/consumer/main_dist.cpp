// A user's data-parallel program, started by the packaged launcher (ember::ember-run -n 2): every rank's all-reduce
// of its rank number gives the sum over ranks.
#include <ember/dist.hpp>
#include <ember/ember.hpp>
#include <iostream>
using namespace ember;

int main() {
  dist::ProcessGroup& pg = dist::init();
  Tensor<float> t = full<float>({4}, float(pg.rank() + 1));
  pg.all_reduce(t).wait();
  const float want = float(pg.size() * (pg.size() + 1) / 2);
  std::cout << "consumer_dist: rank " << pg.rank() << " of " << pg.size() << ": " << t.data()[0] << "\n";
  return pg.size() == 2 && t.data()[0] == want && t.data()[3] == want ? 0 : 1;
}
