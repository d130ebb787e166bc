// `ckpt`: inspect, verify and export checkpoints. Exit codes: 0 success, 1 the command failed,
// 2 bad arguments. All logic lives in ckpt_commands.h; this file only maps results to exit codes.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "checkpoint/ckpt_commands.h"

int main(int argc, char** argv) {
  // Under `bazel run`, resolve relative paths against the directory the user ran it from.
  if (const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY"); cwd != nullptr) {
    if (chdir(cwd) != 0) {
      std::cerr << "ckpt: cannot change to BUILD_WORKING_DIRECTORY " << cwd << "\n";
      return 1;
    }
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  auto command = orthoshard::checkpoint::ParseCkptArgs(args);
  if (!command.ok()) {
    std::cerr << "ckpt: " << command.status().message() << "\n"
              << orthoshard::checkpoint::kCkptUsage << "\n";
    return 2;
  }
  absl::Status status = orthoshard::checkpoint::RunCkptCommand(*command, std::cout);
  if (!status.ok()) {
    std::cerr << "ckpt: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
