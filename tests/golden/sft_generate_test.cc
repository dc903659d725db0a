// Issue 17, point 6: the exported fine-tuned model (tests/golden/sft_export_tiny, the HF files of a
// train_local fine-tuning checkpoint) replies through `sample --chat` exactly as through
// transformers: for each chat prompt of generate.json (make_generate_golden.py: from_pretrained,
// apply_chat_template(add_generation_prompt=True), generate(do_sample=False)) the rendered prompt
// ids, the greedy reply ids (ending at generation_config.json's eos, or cut by max_new_tokens)
// and the decoded text are the same; a conversation it cannot read is refused naming the flag.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/provenance/sha256.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"

namespace megatrain {
namespace {

constexpr char kExport[] = "tests/golden/sft_export_tiny";

nlohmann::json ReadGolden() {
  std::ifstream in(absl::StrCat(kExport, "/generate.json"));
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

// `sample --chat --json` on the export for one case's conversation; its JSON line, or a
// discarded value after a failed expectation.
nlohmann::json SampleChat(const nlohmann::json& golden_case,
                          const std::vector<std::string>& extra) {
  nlohmann::json conversation;
  conversation["messages"] = golden_case["messages"];
  std::vector<std::string> argv = {
      "engine/train/sample",
      absl::StrCat("--model=", kExport),
      "--chat",
      "--chat_tool=tools/hf_chat/megatrain_chat_tokenize",
      "--conversation=" + conversation.dump(),
      "--temperature=0",
      absl::StrCat("--tokens=", golden_case["max_new_tokens"].get<int>()),
      "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<server::ChildResult> run = server::RunChildProcess(argv, [] { return false; });
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return nlohmann::json::value_t::discarded;
  EXPECT_EQ(run->exit_code, 0) << run->err << " (the chat tool needs scripts/setup's venv)";
  return nlohmann::json::parse(run->out, nullptr, /*allow_exceptions=*/false);
}

TEST(SftGenerateTest, GoldenIsForTheseFilesAndHasNoNearTies) {
  const nlohmann::json golden = ReadGolden();
  ASSERT_TRUE(golden.is_object()) << kExport << "/generate.json";
  for (const auto& [name, sha256] : golden["files_sha256"].items()) {
    absl::StatusOr<std::string> got = provenance::Sha256FileHex(absl::StrCat(kExport, "/", name));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, sha256.get<std::string>())
        << name << " changed: rerun tests/golden/make_generate_golden.py (README.md)";
  }
  // An fp32 engine's logits differ from torch's by about 1e-5 here; a reply token whose lead over
  // the runner-up were that small would be a coin toss, not a check. Regenerate with other
  // prompts if this fails.
  EXPECT_GT(golden["smallest_logit_margin"].get<double>(), 1e-2);
  ASSERT_EQ(golden["cases"].size(), 4u);
}

TEST(SftGenerateTest, SampleChatRepliesAsTransformersGenerate) {
  const nlohmann::json golden = ReadGolden();
  ASSERT_TRUE(golden.is_object()) << kExport << "/generate.json";
  int ended_at_eos = 0;
  for (const nlohmann::json& golden_case : golden["cases"]) {
    SCOPED_TRACE(golden_case["name"].get<std::string>());
    const nlohmann::json sampled = SampleChat(golden_case, {});
    ASSERT_TRUE(sampled.is_object()) << sampled.dump();
    EXPECT_EQ(sampled["prompt_ids"], golden_case["prompt_ids"]);
    EXPECT_EQ(sampled["reply_ids"], golden_case["reply_ids"]);
    EXPECT_EQ(sampled["text"], golden_case["text"]);
    ended_at_eos += golden_case["ended_at_eos"].get<bool>();
  }
  // Both ends of a reply are covered: the end of turn, and max_new_tokens.
  EXPECT_GE(ended_at_eos, 1);
  EXPECT_LT(ended_at_eos, static_cast<int>(golden["cases"].size()));
}

// A --context that holds the prompt but not the reply does not slide the window (which would drop
// the conversation's start, as generate() never does): the window widens and the reply is the
// same. For this case a window that slid (the last prompt-length + 1 tokens) would reply
// "... about Tokyo." instead of "... about the bridge." (transformers' forward on such windows).
TEST(SftGenerateTest, AContextShorterThanPromptAndReplyStillSeesTheWholeConversation) {
  const nlohmann::json golden = ReadGolden();
  ASSERT_TRUE(golden.is_object()) << kExport << "/generate.json";
  const nlohmann::json& golden_case = golden["cases"][0];
  ASSERT_EQ(golden_case["name"], "single_turn");
  const nlohmann::json sampled =
      SampleChat(golden_case, {absl::StrCat("--context=", golden_case["prompt_ids"].size() + 1)});
  ASSERT_TRUE(sampled.is_object()) << sampled.dump();
  EXPECT_EQ(sampled["reply_ids"], golden_case["reply_ids"]);
}

// A conversation sample cannot read is refused naming the flag or the field.
TEST(SftGenerateTest, BadConversationsAreNamed) {
  auto run = [](const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {"engine/train/sample", absl::StrCat("--model=", kExport),
                                     "--chat", "--chat_tool=tools/hf_chat/megatrain_chat_tokenize",
                                     "--tokens=2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<server::ChildResult> r = server::RunChildProcess(argv, [] { return false; });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : server::ChildResult{};
  };
  const server::ChildResult not_an_object = run({"--conversation=[1]"});
  EXPECT_EQ(not_an_object.exit_code, 1);
  EXPECT_NE(not_an_object.err.find("--conversation must be a JSON object"), std::string::npos)
      << not_an_object.err;
  const server::ChildResult bad_role =
      run({R"(--conversation={"messages": [{"role": "bot", "content": "hi"}]})"});
  EXPECT_EQ(bad_role.exit_code, 1);
  EXPECT_NE(bad_role.err.find("field messages[0]"), std::string::npos) << bad_role.err;
  const server::ChildResult both =
      run({"--prompt=hi", R"(--conversation={"messages": [{"role": "user", "content": "hi"}]})"});
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
  // A lone continuation byte, then an overlong "/" and a surrogate: each refused at its byte,
  // never a crash in the JSON encoder.
  for (const auto& [prompt, offset] : std::vector<std::pair<std::string, int>>{
           {"ok \x80", 3}, {"\xC0\xAF", 0}, {"ab\xED\xA0\x80", 2}}) {
    const server::ChildResult invalid = run({absl::StrCat("--prompt=", prompt)});
    EXPECT_EQ(invalid.exit_code, 1) << invalid.err;
    EXPECT_NE(invalid.err.find(absl::StrCat("--prompt is not valid UTF-8 (byte ", offset)),
              std::string::npos)
        << invalid.err;
  }
  const server::ChildResult valid = run({"--prompt=caf\xC3\xA9 \xF0\x9F\x98\x80"});
  EXPECT_EQ(valid.exit_code, 0) << valid.err;
  absl::StatusOr<server::ChildResult> plain = server::RunChildProcess(
      {"engine/train/sample", absl::StrCat("--model=", kExport), "--json"}, [] { return false; });
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->exit_code, 1);
  EXPECT_NE(plain->err.find("need --chat"), std::string::npos) << plain->err;
}

}  // namespace
}  // namespace megatrain
