#include "collectives/rendezvous.h"

#include <cctype>
#include <cstdint>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

extern char** environ;

namespace orthoshard::collectives {
namespace {

const std::string* Lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

absl::StatusOr<int64_t> IntVar(const Environment& env, const std::string& name, int64_t fallback,
                               int64_t min_value, int64_t max_value) {
  const std::string* text = Lookup(env, name);
  if (text == nullptr) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *text, "' is not an integer"));
  }
  if (value < min_value || value > max_value) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "=", value,
                                                   " is outside [", min_value, ", ", max_value,
                                                   "]"));
  }
  return value;
}

// "node[03-05,9],other" -> "node03"; "a,b" -> "a"; "host" -> "host".
std::string FirstSlurmHost(absl::string_view nodelist) {
  size_t end = 0;
  while (end < nodelist.size() && nodelist[end] != ',' && nodelist[end] != '[') ++end;
  std::string host(nodelist.substr(0, end));
  if (end < nodelist.size() && nodelist[end] == '[') {
    size_t i = end + 1;
    while (i < nodelist.size() && std::isdigit(static_cast<unsigned char>(nodelist[i]))) {
      host.push_back(nodelist[i++]);
    }
  }
  return host;
}

absl::Status CheckRanks(const RendezvousInfo& info, const char* rank_var, const char* world_var) {
  if (info.rank >= info.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(rank_var, "=", info.rank, " must be below ", world_var, "=", info.world_size));
  }
  if (info.local_rank >= info.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("local rank ", info.local_rank,
                                                   " must be below the local world size ",
                                                   info.local_world_size));
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxRanks = 1 << 24;

absl::StatusOr<RendezvousInfo> FromTorchrun(const Environment& env) {
  RendezvousInfo info;
  info.source = "torchrun";
  ASSIGN_OR_RETURN(info.world_size, IntVar(env, "WORLD_SIZE", 1, 1, kMaxRanks));
  ASSIGN_OR_RETURN(info.rank, IntVar(env, "RANK", 0, 0, kMaxRanks));
  ASSIGN_OR_RETURN(info.local_rank, IntVar(env, "LOCAL_RANK", 0, 0, kMaxRanks));
  ASSIGN_OR_RETURN(info.local_world_size, IntVar(env, "LOCAL_WORLD_SIZE", 1, 1, kMaxRanks));
  if (const std::string* local = Lookup(env, "LOCAL_WORLD_SIZE")) {
    info.local_world_size_from = absl::StrCat("LOCAL_WORLD_SIZE=", *local);
  }
  ASSIGN_OR_RETURN(info.master_port, IntVar(env, "MASTER_PORT", 29500, 1, 65535));
  if (const std::string* addr = Lookup(env, "MASTER_ADDR")) info.master_addr = *addr;
  if (const std::string* agent = Lookup(env, "TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string value = absl::AsciiStrToLower(*agent);
    info.agent_hosts_store = value == "true" || value == "1";
  }
  if (const std::string* run = Lookup(env, "TORCHELASTIC_RUN_ID"); run != nullptr && *run != "none") {
    info.job_id = *run;
  }
  ASSIGN_OR_RETURN(const int64_t attempt,
                   IntVar(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxRanks));
  info.attempt = static_cast<int>(attempt);
  if (const std::string* job = Lookup(env, "ORTHOSHARD_JOB_ID")) info.job_id = *job;
  if (const std::string* token = Lookup(env, "ORTHOSHARD_JOB_TOKEN")) info.job_token = *token;
  RETURN_IF_ERROR(CheckRanks(info, "RANK", "WORLD_SIZE"));
  return info;
}

absl::StatusOr<RendezvousInfo> FromSlurm(const Environment& env) {
  RendezvousInfo info;
  info.source = "slurm";
  ASSIGN_OR_RETURN(info.world_size, IntVar(env, "SLURM_NTASKS", 1, 1, kMaxRanks));
  ASSIGN_OR_RETURN(info.rank, IntVar(env, "SLURM_PROCID", 0, 0, kMaxRanks));
  ASSIGN_OR_RETURN(info.local_rank, IntVar(env, "SLURM_LOCALID", 0, 0, kMaxRanks));
  if (const std::string* per_node = Lookup(env, "SLURM_NTASKS_PER_NODE")) {
    // Set with --ntasks-per-node: e.g. "4" (older SLURMs "4(x2)"): the first number.
    int64_t count = 0;
    const std::string digits = per_node->substr(0, per_node->find_first_not_of("0123456789"));
    if (!absl::SimpleAtoi(digits, &count) || count < 1 || count > kMaxRanks) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable SLURM_NTASKS_PER_NODE='",
                                                     *per_node, "' has no task count"));
    }
    info.local_world_size = static_cast<int>(count);
    info.local_world_size_from = absl::StrCat("SLURM_NTASKS_PER_NODE=", *per_node);
  } else if (const std::string* tasks = Lookup(env, "SLURM_TASKS_PER_NODE")) {
    // Set by every srun: this node's entry of e.g. "2(x3),1".
    const std::string* node_text = Lookup(env, "SLURM_NODEID");
    ASSIGN_OR_RETURN(const int64_t node, IntVar(env, "SLURM_NODEID", 0, 0, kMaxRanks));
    absl::StatusOr<int> count = SlurmTasksOnNode(*tasks, node_text != nullptr ? node : -1);
    if (!count.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable SLURM_TASKS_PER_NODE='", *tasks, "'",
                       node_text != nullptr ? absl::StrCat(" with SLURM_NODEID=", node) : "",
                       ": ", count.status().message()));
    }
    info.local_world_size = *count;
    info.local_world_size_from =
        node_text != nullptr
            ? absl::StrCat("SLURM_TASKS_PER_NODE=", *tasks, ", SLURM_NODEID=", node)
            : absl::StrCat("SLURM_TASKS_PER_NODE=", *tasks);
  } else {
    info.local_world_size = info.local_rank + 1;
  }
  if (const std::string* addr = Lookup(env, "MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (const std::string* nodes = Lookup(env, "SLURM_JOB_NODELIST")) {
    info.master_addr = FirstSlurmHost(*nodes);
  }
  if (Lookup(env, "MASTER_PORT") != nullptr) {
    ASSIGN_OR_RETURN(info.master_port, IntVar(env, "MASTER_PORT", 29500, 1, 65535));
  } else if (Lookup(env, "SLURM_JOB_ID") != nullptr) {
    ASSIGN_OR_RETURN(int64_t job, IntVar(env, "SLURM_JOB_ID", 0, 0, INT64_MAX));
    info.master_port = static_cast<int>(20000 + job % 10000);
  }
  if (const std::string* job = Lookup(env, "SLURM_JOB_ID")) {
    const std::string* step = Lookup(env, "SLURM_STEP_ID");
    info.job_id = absl::StrCat(*job, ".", step != nullptr ? *step : "0");
  }
  ASSIGN_OR_RETURN(const int64_t attempt, IntVar(env, "SLURM_RESTART_COUNT", 0, 0, kMaxRanks));
  info.attempt = static_cast<int>(attempt);
  if (const std::string* job = Lookup(env, "ORTHOSHARD_JOB_ID")) info.job_id = *job;
  if (const std::string* token = Lookup(env, "ORTHOSHARD_JOB_TOKEN")) info.job_token = *token;
  RETURN_IF_ERROR(CheckRanks(info, "SLURM_PROCID", "SLURM_NTASKS"));
  return info;
}

}  // namespace

absl::StatusOr<int> SlurmTasksOnNode(absl::string_view tasks_per_node, int64_t node) {
  int64_t first_node = 0;  // of the current entry
  std::optional<int64_t> uniform;  // the count of every entry so far, while they agree
  for (absl::string_view entry : absl::StrSplit(tasks_per_node, ',')) {
    absl::string_view count_text = entry;
    int64_t repeat = 1;
    if (const size_t paren = entry.find('('); paren != absl::string_view::npos) {
      count_text = entry.substr(0, paren);
      absl::string_view rest = entry.substr(paren + 1);
      if (!absl::ConsumePrefix(&rest, "x") || !absl::ConsumeSuffix(&rest, ")") ||
          !absl::SimpleAtoi(rest, &repeat) || repeat < 1 || repeat > kMaxRanks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "entry '", entry, "' is neither N nor N(xM) with M a node count in [1, ", kMaxRanks,
            "]"));
      }
    }
    int64_t count = 0;
    if (count_text.empty() ||
        count_text.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(count_text, &count) || count < 1 || count > kMaxRanks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry '", entry, "' has no task count in [1, ", kMaxRanks, "]"));
    }
    if (node >= 0 && node < first_node + repeat) return static_cast<int>(count);
    if (node < 0) {
      if (uniform.has_value() && *uniform != count) {
        return absl::InvalidArgumentError(
            "the count differs between nodes and SLURM_NODEID, which says which node this is, is "
            "not set");
      }
      uniform = count;
    }
    first_node += repeat;
    if (first_node > kMaxRanks) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxRanks, " nodes"));
    }
  }
  if (node < 0 && uniform.has_value()) return static_cast<int>(*uniform);
  if (node < 0) return absl::InvalidArgumentError("no entry");
  return absl::InvalidArgumentError(absl::StrCat("lists ", first_node, " node(s), node ", node,
                                                 " has no entry"));
}

absl::StatusOr<RendezvousInfo> ParseRendezvous(const Environment& env) {
  if (Lookup(env, "RANK") != nullptr && Lookup(env, "WORLD_SIZE") != nullptr) {
    return FromTorchrun(env);
  }
  if (Lookup(env, "SLURM_PROCID") != nullptr && Lookup(env, "SLURM_NTASKS") != nullptr) {
    return FromSlurm(env);
  }
  return absl::NotFoundError(
      "no rendezvous environment: expected RANK and WORLD_SIZE (torchrun) or SLURM_PROCID and "
      "SLURM_NTASKS (SLURM)");
}

Environment ProcessEnvironment() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    absl::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq == absl::string_view::npos) continue;
    env[std::string(text.substr(0, eq))] = std::string(text.substr(eq + 1));
  }
  return env;
}

}  // namespace orthoshard::collectives
