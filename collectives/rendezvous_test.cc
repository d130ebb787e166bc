#include "collectives/rendezvous.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::collectives {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(RendezvousTest, ReadsTorchrunVariables) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info, ParseRendezvous({{"RANK", "5"},
                                                             {"WORLD_SIZE", "8"},
                                                             {"LOCAL_RANK", "1"},
                                                             {"LOCAL_WORLD_SIZE", "4"},
                                                             {"MASTER_ADDR", "node7"},
                                                             {"MASTER_PORT", "1234"},
                                                             {"SLURM_PROCID", "0"},
                                                             {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 1234);
  EXPECT_FALSE(info.agent_hosts_store);
  EXPECT_FALSE(info.HostsStore());
}

TEST(RendezvousTest, TorchrunDefaultsAndAgentStore) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info, ParseRendezvous({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_TRUE(info.HostsStore());
  ASSERT_OK_AND_ASSIGN(
      info, ParseRendezvous(
                {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_TRUE(info.agent_hosts_store);
  EXPECT_FALSE(info.HostsStore());
}

// The job a rank belongs to, and which attempt of it, for the store check and the key prefix.
TEST(RendezvousTest, JobAndAttempt) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info, ParseRendezvous({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(info.job_id, "");
  EXPECT_EQ(info.attempt, 0);
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"RANK", "0"},
                                              {"WORLD_SIZE", "1"},
                                              {"TORCHELASTIC_RUN_ID", "none"}}));
  EXPECT_EQ(info.job_id, "");  // torchrun's default without --rdzv-id names no job
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"RANK", "0"},
                                              {"WORLD_SIZE", "1"},
                                              {"TORCHELASTIC_RUN_ID", "4f1c"},
                                              {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  EXPECT_EQ(info.job_id, "4f1c");
  EXPECT_EQ(info.attempt, 2);
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"RANK", "0"},
                                              {"WORLD_SIZE", "1"},
                                              {"TORCHELASTIC_RUN_ID", "4f1c"},
                                              {"ORTHOSHARD_JOB_ID", "local-7-ab"}}));
  EXPECT_EQ(info.job_id, "local-7-ab");
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"SLURM_PROCID", "0"},
                                              {"SLURM_NTASKS", "1"},
                                              {"SLURM_JOB_ID", "99"},
                                              {"SLURM_STEP_ID", "3"},
                                              {"SLURM_RESTART_COUNT", "1"}}));
  EXPECT_EQ(info.job_id, "99.3");
  EXPECT_EQ(info.attempt, 1);
  EXPECT_THAT(ParseRendezvous({{"RANK", "0"},
                               {"WORLD_SIZE", "1"},
                               {"TORCHELASTIC_RESTART_COUNT", "x"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("TORCHELASTIC_RESTART_COUNT='x' is not an integer")));
}

TEST(RendezvousTest, FallsBackToSlurm) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info,
                       ParseRendezvous({{"SLURM_PROCID", "6"},
                                        {"SLURM_NTASKS", "8"},
                                        {"SLURM_LOCALID", "2"},
                                        {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                        {"SLURM_JOB_NODELIST", "gpu[03-04,9],cpu1"},
                                        {"SLURM_JOB_ID", "123456"}}));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "gpu03");
  EXPECT_EQ(info.master_port, 23456);
}

TEST(RendezvousTest, SlurmHonoursMasterVariables) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info, ParseRendezvous({{"SLURM_PROCID", "0"},
                                                             {"SLURM_NTASKS", "2"},
                                                             {"SLURM_JOB_NODELIST", "a,b"},
                                                             {"MASTER_ADDR", "10.0.0.1"},
                                                             {"MASTER_PORT", "4000"}}));
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 4000);
}

TEST(RendezvousTest, RejectsMissingAndBadValues) {
  EXPECT_THAT(ParseRendezvous({}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("expected RANK and WORLD_SIZE")));
  EXPECT_THAT(
      ParseRendezvous({{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK='x' is not an integer")));
  EXPECT_THAT(
      ParseRendezvous({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK=2 must be below WORLD_SIZE=2")));
  EXPECT_THAT(ParseRendezvous({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MASTER_PORT=70000 is outside [1, 65535]")));
  EXPECT_THAT(ParseRendezvous(
                  {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "x"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_NTASKS_PER_NODE='x' has no task count")));
}

MATCHER_P(Holds, value, "is OK and holds " + ::testing::PrintToString(value)) {
  return arg.ok() && *arg == value;
}

TEST(SlurmTasksOnNodeTest, ExpandsRepeatsAndLists) {
  EXPECT_THAT(SlurmTasksOnNode("4", 0), Holds(4));
  EXPECT_THAT(SlurmTasksOnNode("2(x3)", 0), Holds(2));
  EXPECT_THAT(SlurmTasksOnNode("2(x3)", 2), Holds(2));
  EXPECT_THAT(SlurmTasksOnNode("2,1", 0), Holds(2));
  EXPECT_THAT(SlurmTasksOnNode("2,1", 1), Holds(1));
  EXPECT_THAT(SlurmTasksOnNode("2(x3),1", 2), Holds(2));
  EXPECT_THAT(SlurmTasksOnNode("2(x3),1", 3), Holds(1));
  EXPECT_THAT(SlurmTasksOnNode("1,3(x2),8", 3), Holds(8));
  // Without SLURM_NODEID only a uniform list says this node's count.
  EXPECT_THAT(SlurmTasksOnNode("2(x3)", -1), Holds(2));
  EXPECT_THAT(SlurmTasksOnNode("2,2(x4)", -1), Holds(2));
}

TEST(SlurmTasksOnNodeTest, RejectsMalformedAndShortLists) {
  const auto invalid = [](const char* text) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text));
  };
  EXPECT_THAT(SlurmTasksOnNode("2(x3),1", 4), invalid("lists 4 node(s), node 4 has no entry"));
  EXPECT_THAT(SlurmTasksOnNode("2,1", -1), invalid("differs between nodes and SLURM_NODEID"));
  EXPECT_THAT(SlurmTasksOnNode("", 0), invalid("entry '' has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("0", 0), invalid("entry '0' has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("-2", 0), invalid("entry '-2' has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("2,,1", 1), invalid("entry '' has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("2(3)", 0), invalid("entry '2(3)' is neither N nor N(xM)"));
  EXPECT_THAT(SlurmTasksOnNode("2(x0)", 0), invalid("entry '2(x0)' is neither N nor N(xM)"));
  EXPECT_THAT(SlurmTasksOnNode("2(x3", 0), invalid("is neither N nor N(xM)"));
  EXPECT_THAT(SlurmTasksOnNode("(x3)", 0), invalid("entry '(x3)' has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("99999999999", 0), invalid("has no task count"));
  EXPECT_THAT(SlurmTasksOnNode("1(x16777216),1(x16777216)", 99999999),
              invalid("more than 16777216 nodes"));
}

// Plain srun (no --ntasks-per-node) sets SLURM_TASKS_PER_NODE only: this node's entry is the
// local world size.
TEST(RendezvousTest, SlurmTasksPerNodeGivesThisNodesCount) {
  ASSERT_OK_AND_ASSIGN(RendezvousInfo info, ParseRendezvous({{"SLURM_PROCID", "4"},
                                                             {"SLURM_NTASKS", "7"},
                                                             {"SLURM_LOCALID", "0"},
                                                             {"SLURM_NODEID", "2"},
                                                             {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.local_world_size_from, "SLURM_TASKS_PER_NODE=2(x3),1, SLURM_NODEID=2");
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"SLURM_PROCID", "6"},
                                              {"SLURM_NTASKS", "7"},
                                              {"SLURM_NODEID", "3"},
                                              {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  EXPECT_EQ(info.local_world_size, 1);
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"SLURM_PROCID", "1"},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_LOCALID", "1"},
                                              {"SLURM_TASKS_PER_NODE", "2"}}));
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.local_world_size_from, "SLURM_TASKS_PER_NODE=2");
  // SLURM_NTASKS_PER_NODE, when set, wins.
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"SLURM_PROCID", "0"},
                                              {"SLURM_NTASKS", "8"},
                                              {"SLURM_NODEID", "0"},
                                              {"SLURM_NTASKS_PER_NODE", "4"},
                                              {"SLURM_TASKS_PER_NODE", "2(x4)"}}));
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.local_world_size_from, "SLURM_NTASKS_PER_NODE=4");
  // Neither: unknown, SLURM_LOCALID + 1 at least.
  ASSERT_OK_AND_ASSIGN(info, ParseRendezvous({{"SLURM_PROCID", "1"},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.local_world_size_from, "");
}

TEST(RendezvousTest, SlurmTasksPerNodeErrorsNameTheVariables) {
  EXPECT_THAT(ParseRendezvous({{"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "3"},
                               {"SLURM_NODEID", "2"},
                               {"SLURM_TASKS_PER_NODE", "2,1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_TASKS_PER_NODE='2,1' with SLURM_NODEID=2: lists 2 node(s), "
                                 "node 2 has no entry")));
  EXPECT_THAT(ParseRendezvous(
                  {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "2,1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_TASKS_PER_NODE='2,1': the count differs between nodes")));
  EXPECT_THAT(ParseRendezvous({{"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "3"},
                               {"SLURM_LOCALID", "2"},
                               {"SLURM_NODEID", "1"},
                               {"SLURM_TASKS_PER_NODE", "2(x2)"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("local rank 2 must be below the local world size 2")));
}

}  // namespace
}  // namespace orthoshard::collectives
