// The spellings of the job spec's on/off flags, rewritten before absl parses them.
#include "client/spec_switch_flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

std::vector<std::string> Spelled(std::vector<std::string> args) {
  SpellOutSpecSwitches(args);
  return args;
}

TEST(SpellOutSpecSwitchesTest, BareAndNoFormsBecomeExplicitValues) {
  EXPECT_EQ(
      Spelled({"megatrain", "submit", "--zero1", "-speculative_update", "--nopack",
               "-notrain_on_prompt"}),
      (std::vector<std::string>{"megatrain", "submit", "--zero1=true", "--speculative_update=true",
                                "--pack=false", "--train_on_prompt=false"}));
}

TEST(SpellOutSpecSwitchesTest, ExplicitValuesAndOtherFlagsAreLeftAlone) {
  const std::vector<std::string> args = {"megatrain",   "plan",       "--zero1=false",
                                         "--pack=true", "--json",     "--nojson",
                                         "--zero11",    "--nozero1x", "zero1"};
  EXPECT_EQ(Spelled(args), args);
}

TEST(SpellOutSpecSwitchesTest, StopsAtTheEndOfTheFlags) {
  EXPECT_EQ(Spelled({"megatrain", "--zero1", "--", "--zero1"}),
            (std::vector<std::string>{"megatrain", "--zero1=true", "--", "--zero1"}));
}

}  // namespace
}  // namespace megatrain::client
