// Tests of an eval reply's event line: quoted with escapes, cut at the bounds but never inside a
// UTF-8 character, the index counted from 1, the length limit said. (Rendering and decoding
// through the real chat tool: tests/server:chat_job_test.)
#include "server/job_eval_prompts.h"

#include <gtest/gtest.h>

namespace megatrain::server {
namespace {

v1::EvalReply Reply(const std::string& prompt, const std::string& text, bool stopped) {
  engine::EvalReplyReport r;
  r.index = 1;
  r.prompt = prompt;
  r.text = text;
  r.ids = {5, 6, 7};
  r.stopped = stopped;
  return ToEvalReply(20, r);
}

TEST(EvalReplyLineTest, QuotesEscapesAndSaysTheLengthLimit) {
  const v1::EvalReply reply = Reply("Say \"hi\"", "line one\nline\ttwo \\ \x01 end", true);
  EXPECT_EQ(reply.step(), 20u);
  EXPECT_EQ(reply.index(), 1u);
  EXPECT_EQ(reply.tokens(), 3u);
  EXPECT_EQ(EvalReplyLine(reply),
            "eval step 20 [2] \"Say \\\"hi\\\"\" -> \"line one\\nline\\ttwo \\\\ \\x01 end\"");
  EXPECT_EQ(EvalReplyLine(Reply("p", "", false)), "eval step 20 [2] \"p\" -> \"\" (length limit)");
}

TEST(EvalReplyLineTest, CutsAtTheBoundsNeverInsideACharacter) {
  // 59 ASCII bytes then a 3-byte character across the 60-byte bound: cut before it.
  const std::string prompt = std::string(59, 'a') + "\xe6\x97\xa5" + "tail";
  std::string reply;
  while (reply.size() < kEvalLineReplyBytes + 10) reply += "\xf0\x9f\x97\xbc";  // 4-byte emoji
  const std::string line = EvalReplyLine(Reply(prompt, reply, true));
  EXPECT_NE(line.find("\"" + std::string(59, 'a') + "\"... -> "), std::string::npos) << line;
  const size_t arrow = line.find(" -> \"");
  ASSERT_NE(arrow, std::string::npos);
  const std::string shown = line.substr(arrow + 5, line.size() - arrow - 5 - 4);  // "\"..."
  EXPECT_EQ(line.substr(line.size() - 4), "\"...");
  EXPECT_EQ(shown.size(), kEvalLineReplyBytes / 4 * 4);
  EXPECT_EQ(shown, reply.substr(0, shown.size()));
}

}  // namespace
}  // namespace megatrain::server
