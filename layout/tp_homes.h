// Where each tensor-parallel matrix is orthogonalised under Muon's `owner` mode: the dp owner of a
// TP-split matrix is the same dp index on every tp rank (the layout is a function of the tp-local
// shapes, equal on every tp rank), so the owners of its shards form one tp group; inside it the
// matrix gets one home, which gathers the shards, runs Newton–Schulz once on the whole matrix and
// returns each shard. Homes are balanced by Newton–Schulz cost (metrics.h's max(m,n)·min(m,n)² per
// logical matrix) with the longest-processing-time rule. Pure: costs in, homes out; the optimizer
// (optimizers/distributed) and the planning table (//layout:plan) use this one function.
#ifndef ORTHOSHARD_LAYOUT_TP_HOMES_H_
#define ORTHOSHARD_LAYOUT_TP_HOMES_H_

#include <vector>

namespace orthoshard::layout {

// The tp rank (in [0, tp)) that is home to each matrix of `costs` (one entry per matrix, in an
// order every tp rank agrees on). Longest processing time first: matrices by decreasing cost
// (equal costs by increasing index) each go to the rank with the least cost so far (equal loads:
// the lowest rank). Deterministic, so every rank of the tp group computes the same homes.
// Precondition: tp >= 1, costs >= 0.
std::vector<int> AssignTpHomes(const std::vector<double>& costs, int tp);

// The cost each tp rank carries under `homes` (the sum of its matrices' costs).
std::vector<double> TpHomeLoads(const std::vector<double>& costs, const std::vector<int>& homes,
                                int tp);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_TP_HOMES_H_
