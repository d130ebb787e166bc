// A rank process for launcher_test: `launcher_test_child MODE`.
//   print: prints two stdout lines (the second without a newline) and one stderr line, exits 0.
//   env: prints the rendezvous variables it received.
//   fail: rank 1 exits with 3 at once; the others sleep until killed.
//   stop: rank 1 stops itself (SIGSTOP); rank 0 exits with 3 after 200 ms, the others with 1 after
//         500 ms.
//   wait_signal: prints "ready", waits for SIGTERM, prints "got SIGTERM" and exits with 7.
//   connect: connects to PROBE_ADDR (a numeric address) at MASTER_PORT and to 127.0.0.1 there,
//            printing "ADDR: connected" or "ADDR: <why not>" for each.
//   self: run directly, starts 2 ranks of itself (LaunchSelfUnlessRank); each prints
//         "self rank R of W", rank 1 exits with 5.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "collectives/launch/launcher.h"

namespace {
volatile sig_atomic_t g_terminated = 0;
void OnTerm(int) { g_terminated = 1; }
const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "<unset>" : value;
}
// "connected" or why a TCP connection to `addr`:`port` failed.
const char* TryConnect(const char* addr, const char* port) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(addr, port, &hints, &found) != 0) return "not a numeric address";
  const int fd = socket(found->ai_family, SOCK_STREAM, 0);
  const int rc = connect(fd, found->ai_addr, found->ai_addrlen);
  const char* result = rc == 0 ? "connected" : std::strerror(errno);
  close(fd);
  freeaddrinfo(found);
  return result;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int rank = std::atoi(Env("RANK"));
  if (std::strcmp(argv[1], "print") == 0) {
    std::printf("hello from %d of %s\nno newline at the end", rank, Env("WORLD_SIZE"));
    std::fflush(stdout);
    std::fprintf(stderr, "error line %d\n", rank);
    return 0;
  }
  if (std::strcmp(argv[1], "env") == 0) {
    std::printf(
        "RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s "
        "AGENT_STORE=%s EXTRA=%s\n",
        Env("RANK"), Env("LOCAL_RANK"), Env("WORLD_SIZE"), Env("LOCAL_WORLD_SIZE"),
        Env("MASTER_ADDR"), Env("TORCHELASTIC_USE_AGENT_STORE"), Env("EXTRA"));
    std::printf("MASTER_PORT=%s\n", Env("MASTER_PORT"));
    return 0;
  }
  if (std::strcmp(argv[1], "connect") == 0) {
    for (const char* addr : {Env("PROBE_ADDR"), "127.0.0.1"}) {
      std::printf("%s: %s\n", addr, TryConnect(addr, Env("MASTER_PORT")));
    }
    return 0;
  }
  if (std::strcmp(argv[1], "fail") == 0) {
    if (rank == 1) return 3;
    sleep(60);
    return 0;
  }
  if (std::strcmp(argv[1], "stop") == 0) {
    if (rank == 1) raise(SIGSTOP);
    usleep(rank == 0 ? 200000 : 500000);
    return rank == 0 ? 3 : 1;
  }
  if (std::strcmp(argv[1], "self") == 0) {
    if (std::optional<int> launched =
            orthoshard::collectives::LaunchSelfUnlessRank(argc, argv, 2)) {
      return *launched;
    }
    std::printf("self rank %d of %s\n", rank, Env("WORLD_SIZE"));
    return rank == 1 ? 5 : 0;
  }
  if (std::strcmp(argv[1], "wait_signal") == 0) {
    struct sigaction action = {};
    action.sa_handler = OnTerm;
    sigaction(SIGTERM, &action, nullptr);
    std::printf("ready\n");
    std::fflush(stdout);
    for (int i = 0; i < 3000 && !g_terminated; ++i) usleep(10000);
    if (!g_terminated) return 1;
    std::printf("got SIGTERM\n");
    return 7;
  }
  return 2;
}
