#include "layout/tp_homes.h"

#include <algorithm>
#include <numeric>

namespace orthoshard::layout {

std::vector<int> AssignTpHomes(const std::vector<double>& costs, int tp) {
  std::vector<int> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&costs](int a, int b) { return costs[a] > costs[b]; });
  std::vector<double> load(std::max(tp, 1), 0.0);
  std::vector<int> homes(costs.size(), 0);
  for (int i : order) {
    const int home = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    homes[i] = home;
    load[home] += costs[i];
  }
  return homes;
}

std::vector<double> TpHomeLoads(const std::vector<double>& costs, const std::vector<int>& homes,
                                int tp) {
  std::vector<double> load(std::max(tp, 1), 0.0);
  for (size_t i = 0; i < costs.size(); ++i) load[homes[i]] += costs[i];
  return load;
}

}  // namespace orthoshard::layout
