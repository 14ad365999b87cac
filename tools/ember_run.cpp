// ember-run: starts N copies of a program on this host as the ranks of one job, as `torchrun --nproc-per-node N
// --no-python` does. It serves the rendezvous store itself, on 127.0.0.1 (a free port unless --master-port says
// otherwise), and gives each rank RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// EMBER_USE_AGENT_STORE=1, EMBER_DIST_TOKEN (the store serves only clients that prove they know it: the one in
// ember-run's environment, else 32 random bytes made for the job), and EMBER_NUM_THREADS = cores / N when it is
// not set. Each rank's output lines are
// prefixed with its rank. Ctrl-C / SIGTERM are forwarded to every rank. When a rank fails (non-zero exit or a
// signal) the others are stopped (SIGTERM, then SIGKILL after a grace period) and ember-run exits with the failed
// rank's code (128 + signal for a signal); 0 when every rank exits 0.
//
//   ember-run -n 2 build/examples/08_ddp_fashion_mnist --epochs 2
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/store.hpp>

extern char** environ;

namespace {

int signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const unsigned char c = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t r = ::write(signal_pipe[1], &c, 1);
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: ember-run -n N [--master-port PORT] [--no-prefix] [--] program [args...]\n"
               "  -n, --nproc-per-node N  ranks to start on this host (1..1024)\n"
               "  --master-port PORT      the rendezvous store's port (default: a free one)\n"
               "  --no-prefix             do not prefix each output line with the rank\n"
               "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
               "EMBER_USE_AGENT_STORE=1, EMBER_DIST_TOKEN (the store's shared secret: the one set, else a new\n"
               "random one) and, unless set, EMBER_NUM_THREADS = cores / N. The store listens on 127.0.0.1.\n");
}

struct Rank {
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of the rank's stdout and stderr pipes
  std::string out_buf, err_buf;
  bool running = true;
  int status = 0;
};

// Writes the complete lines of buf, each with the prefix, and keeps the rest (all of it when `flush`).
void emit(std::string& buf, FILE* to, const std::string& prefix, bool flush) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(to, "%s%.*s\n", prefix.c_str(), int(nl - start), buf.data() + start);
    start = nl + 1;
  }
  if (flush && start < buf.size()) {
    std::fprintf(to, "%s%s\n", prefix.c_str(), buf.c_str() + start);
    start = buf.size();
  }
  buf.erase(0, start);
  std::fflush(to);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0, port = 0;
  bool prefix = true;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ember-run: %s needs a value\n", name);
        std::exit(2);
      }
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (!end || *end) {
        std::fprintf(stderr, "ember-run: %s: '%s' is not a number\n", name, argv[i]);
        std::exit(2);
      }
      return v;
    };
    if (a == "-n" || a == "--nproc" || a == "--nproc-per-node") n = int(value("-n"));
    else if (a == "--master-port") port = int(value("--master-port"));
    else if (a == "--no-prefix") prefix = false;
    else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--") {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "ember-run: unknown option %s\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      break;
    }
  }
  if (n < 1 || n > 1024 || port < 0 || port > 65535 || i >= argc) {
    usage(stderr);
    return 2;
  }
  std::vector<char*> prog(argv + i, argv + argc);
  prog.push_back(nullptr);

  std::unique_ptr<ember::dist::StoreServer> store;
  std::string token;
  try {
    const char* given = std::getenv("EMBER_DIST_TOKEN");
    if (given && *given) {
      token = given;
      ember::dist::detail::check_token(token, "EMBER_DIST_TOKEN");
    } else {
      token = ember::dist::detail::new_token();
    }
    store = std::make_unique<ember::dist::StoreServer>(
        ember::dist::StoreServerOptions{.host = "127.0.0.1", .port = port, .token = token});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember-run: %s\n", e.what());
    return 1;
  }
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(s, &sa, nullptr);

  std::map<std::string, std::string> base;
  for (char** p = environ; *p; ++p) {
    const std::string kv(*p);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) base[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!base.count("EMBER_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    base["EMBER_NUM_THREADS"] = std::to_string(std::max(1u, cores / unsigned(n)));
  }
  base["WORLD_SIZE"] = base["LOCAL_WORLD_SIZE"] = std::to_string(n);
  base["MASTER_ADDR"] = "127.0.0.1";
  base["MASTER_PORT"] = std::to_string(store->port());
  base["EMBER_USE_AGENT_STORE"] = "1";
  base["EMBER_DIST_TOKEN"] = token;

  std::vector<Rank> ranks(static_cast<std::size_t>(n));
  int exit_code = 0, failed = -1;
  bool stopping = false;
  auto deadline_kill = std::chrono::steady_clock::time_point::max();
  for (int r = 0; r < n; ++r) {
    auto env = base;
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    std::vector<std::string> kvs;
    for (auto& [k, v] : env) kvs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kvs) envp.push_back(s.data());
    envp.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return 1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&defaults, s);
    posix_spawnattr_setsigdefault(&at, &defaults);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, prog[0], &fa, &at, prog.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    ::close(out[1]);
    ::close(err[1]);
    Rank& rk = ranks[std::size_t(r)];
    rk.out = out[0];
    rk.err = err[0];
    if (rc != 0) {
      std::fprintf(stderr, "ember-run: cannot start %s: %s\n", prog[0], std::strerror(rc));
      rk.running = false;
      failed = r;
      exit_code = 127;
      stopping = true;
      for (Rank& o : ranks)
        if (o.pid > 0) ::kill(o.pid, SIGTERM);
      deadline_kill = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      break;
    }
    rk.pid = pid;
  }

  auto stop_all = [&](int sig) {
    for (Rank& rk : ranks)
      if (rk.running && rk.pid > 0) ::kill(rk.pid, sig);
  };
  for (;;) {
    // Reap what has exited.
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      Rank& rk = ranks[r];
      if (!rk.running || rk.pid <= 0) continue;
      int st = 0;
      if (::waitpid(rk.pid, &st, WNOHANG) != rk.pid) continue;
      rk.running = false;
      rk.status = st;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && failed < 0) {
        failed = int(r);
        exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (WIFEXITED(st))
          std::fprintf(stderr, "ember-run: rank %zu exited with code %d; stopping the other ranks\n", r,
                       WEXITSTATUS(st));
        else
          std::fprintf(stderr, "ember-run: rank %zu was killed by signal %d (%s); stopping the other ranks\n", r,
                       WTERMSIG(st), strsignal(WTERMSIG(st)));
        stopping = true;
        stop_all(SIGTERM);
        deadline_kill = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
    if (stopping && std::chrono::steady_clock::now() > deadline_kill) {
      stop_all(SIGKILL);
      deadline_kill = std::chrono::steady_clock::time_point::max();
    }
    std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<std::size_t, bool>> who;  // (rank, is stderr)
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].out >= 0) {
        fds.push_back({ranks[r].out, POLLIN, 0});
        who.push_back({r, false});
      }
      if (ranks[r].err >= 0) {
        fds.push_back({ranks[r].err, POLLIN, 0});
        who.push_back({r, true});
      }
    }
    bool any_running = false;
    for (const Rank& rk : ranks) any_running = any_running || (rk.running && rk.pid > 0);
    if (!any_running && who.empty()) break;
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      unsigned char sig;
      while (::read(signal_pipe[0], &sig, 1) == 1) {
        if (sig == SIGCHLD) continue;
        // Forwarded to every rank; a second Ctrl-C kills them.
        stop_all(stopping ? SIGKILL : int(sig));
        if (!stopping) {
          stopping = true;
          exit_code = 128 + sig;
          deadline_kill = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        }
      }
    }
    char buf[1 << 15];
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [r, is_err] = who[k - 1];
      Rank& rk = ranks[r];
      int& fd = is_err ? rk.err : rk.out;
      std::string& b = is_err ? rk.err_buf : rk.out_buf;
      const ssize_t got = ::read(fd, buf, sizeof buf);
      const std::string pre = prefix ? "[rank " + std::to_string(r) + "] " : std::string();
      if (got > 0) {
        b.append(buf, std::size_t(got));
        emit(b, is_err ? stderr : stdout, pre, false);
      } else {
        emit(b, is_err ? stderr : stdout, pre, true);
        ::close(fd);
        fd = -1;
      }
    }
  }
  return exit_code;
}
