// StructuredLog: user-supplied values never put a raw control character into the log.
#include "server/structured_log.h"

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

std::string Logged(const StructuredLog::Fields& fields) {
  std::FILE* f = std::tmpfile();
  {
    StructuredLog log(f);
    log.JobEvent("rpc_error", "job-000001", fields);
  }
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<char>(c));
  std::fclose(f);
  return out;
}

// Issue 16, point 13: CR, LF, ESC and NUL in a value (a path in an error message, say) would
// forge a second log line, drive the reader's terminal or cut the line short.
TEST(StructuredLogTest, EscapesEveryControlCharacter) {
  constexpr char kHostile[] = "/out/x\revent=forged\n\x1b[2J\0tail";
  const std::string hostile(kHostile, sizeof(kHostile) - 1);
  const std::string line = Logged({{"message", hostile}, {"plain", "a\x1b"}});
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line, ended once
  for (char c : line.substr(0, line.size() - 1)) {
    EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        << "raw control character " << static_cast<int>(c) << " in: " << line;
  }
  EXPECT_NE(line.find(R"(message="/out/x\revent=forged\n\x1b[2J\x00tail")"), std::string::npos)
      << line;
  EXPECT_NE(line.find(R"(plain="a\x1b")"), std::string::npos) << line;
}

TEST(StructuredLogTest, PlainValuesStayUnquoted) {
  const std::string line = Logged({{"state", "RUNNING"}, {"message", "two words"}});
  EXPECT_NE(line.find(" event=rpc_error job=job-000001 state=RUNNING message=\"two words\"\n"),
            std::string::npos)
      << line;
}

}  // namespace
}  // namespace megatrain::server
