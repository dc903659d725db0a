# The gtest filter of the ops_test cases racecheck and synccheck run (the kernels with shared
# memory, shuffles and barriers: reductions and our attention), sourced by run.sh and checked
# against `ops_test --gtest_list_tests` by gpu_kit_test.sh. The first GPU run (2026-11-27) ran
# zero tests with a filter naming suites that had been renamed; each pattern must match.
sanitize_reduction_patterns=(
  '*Reference/Rmsnorm*'
  '*Reference/CrossEntropy*'
  '*Reference/HeadBlocks*'
  '*Reference/Attention*'
  '*Reference/Embedding*'
)
sanitize_reduction_filter="$(IFS=:; echo "${sanitize_reduction_patterns[*]}")"
