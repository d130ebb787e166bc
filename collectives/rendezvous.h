// Who this process is in the job: rank, world size and where the rendezvous store lives, read from
// torchrun's environment contract or, failing that, from SLURM's.
//
// Library code takes the environment as a map (ParseRendezvous), so it is testable and never reads
// the process environment; integration code calls ProcessEnvironment() once.
#ifndef ORTHOSHARD_COLLECTIVES_RENDEZVOUS_H_
#define ORTHOSHARD_COLLECTIVES_RENDEZVOUS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::collectives {

using Environment = absl::flat_hash_map<std::string, std::string>;

struct RendezvousInfo {
  int rank = 0;                           // global rank, in [0, world_size)
  int world_size = 1;                     // number of processes in the job
  int local_rank = 0;                     // rank among the processes on this machine
  int local_world_size = 1;               // processes on this machine
  // Where local_world_size came from, for messages ("LOCAL_WORLD_SIZE=4",
  // "SLURM_TASKS_PER_NODE=2(x3), SLURM_NODEID=1"); empty when no variable said it (a default).
  std::string local_world_size_from;
  std::string master_addr = "127.0.0.1";  // host of the TCPStore
  int master_port = 29500;                // port of the TCPStore
  // True when a launcher (torchrun's agent or LaunchLocal) hosts the store, so no rank does;
  // otherwise rank 0 hosts it.
  bool agent_hosts_store = false;
  std::string source;  // "torchrun" or "slurm"
  // Which job and which attempt of it this rank belongs to. The ranks check the job against the
  // store they joined (a store of another job fails the rendezvous at once, naming both), and each
  // attempt of an elastic restart rendezvouses under its own key prefix, so it never reads the
  // keys of the attempt before it. Empty job_id: only the world size is checked.
  std::string job_id;
  int attempt = 0;
  // The job's secret, checked at rendezvous (JobIdentity::token in internal/job_store.h): from
  // ORTHOSHARD_JOB_TOKEN, empty when unset.
  std::string job_token;

  // Whether this process runs the TCPStore server.
  bool HostsStore() const { return !agent_hosts_store && rank == 0; }
};

// Reads torchrun's variables when RANK and WORLD_SIZE are set: RANK, WORLD_SIZE, LOCAL_RANK
// (default 0), LOCAL_WORLD_SIZE (default 1), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default
// 29500), TORCHELASTIC_USE_AGENT_STORE ("True"/"1" means the agent hosts the store), job_id
// from TORCHELASTIC_RUN_ID (unless "none", torchrun's default without --rdzv-id) and attempt from
// TORCHELASTIC_RESTART_COUNT (default 0). ORTHOSHARD_JOB_ID, when set, is the job_id under any
// launcher (LaunchLocal sets it); ORTHOSHARD_JOB_TOKEN, when set, is the job_token under any.
// Otherwise SLURM's when SLURM_PROCID and SLURM_NTASKS are set: rank SLURM_PROCID, world
// SLURM_NTASKS, local rank SLURM_LOCALID, local world SLURM_NTASKS_PER_NODE (its first number; set
// with --ntasks-per-node), else this node's entry of SLURM_TASKS_PER_NODE (set by every srun;
// SlurmTasksOnNode with SLURM_NODEID), else SLURM_LOCALID + 1; MASTER_ADDR if set, else the first
// host of SLURM_JOB_NODELIST (e.g. "node[03-05,9]" gives "node03"), else 127.0.0.1; MASTER_PORT if set, else 20000 + SLURM_JOB_ID % 10000 (so concurrent
// jobs on shared nodes differ), else 29500; job_id "SLURM_JOB_ID.SLURM_STEP_ID"; attempt
// SLURM_RESTART_COUNT (default 0).
// Errors: kNotFound if neither set of variables is present; kInvalidArgument naming the variable
// for a non-integer, out-of-range or inconsistent value (rank >= world size, port outside
// [1, 65535]).
absl::StatusOr<RendezvousInfo> ParseRendezvous(const Environment& env);

// The task count of node `node` (SLURM_NODEID, counted from 0) in SLURM's SLURM_TASKS_PER_NODE:
// comma-separated entries "N" (one node of N tasks) or "N(xM)" (M nodes of N tasks each), so
// "2(x3),1" gives 2 on nodes 0-2 and 1 on node 3. A negative `node` (SLURM_NODEID unknown) accepts
// only a list whose entries all agree. Errors: kInvalidArgument saying what is wrong (a malformed
// entry, a count outside [1, 2^24], a node beyond the list, counts that differ with no node).
absl::StatusOr<int> SlurmTasksOnNode(absl::string_view tasks_per_node, int64_t node);

// The process environment as a map. For integration code (main functions) only.
Environment ProcessEnvironment();

}  // namespace orthoshard::collectives

#endif  // ORTHOSHARD_COLLECTIVES_RENDEZVOUS_H_
