// Issue 16, point 2, "read from that fd": a real job (in-process daemon, real DeviceJobEngine) whose
// input is swapped after the run-time check and before anything reads it (the runner's
// test_after_input_check hook: a state, no timing) still trains on the checked content. Each
// swap puts in a file that fails the job if read: a symlink to an empty file outside the data
// root for a text corpus, a file of an odd byte length for a u16 token file, a symlink to an
// empty file for a SentencePiece job's text (tokenized in a child process) and its model, a
// three-byte file for a Hugging Face directory's model.safetensors.
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/job_engine.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {

class InputSwapTest : public ::testing::Test {
 protected:
  // Starts the daemon on a real engine; `swap` runs once the job's inputs were checked.
  void Start(std::function<void(const std::string& id)> swap) {
    std::filesystem::create_directories(daemon_.root() + "/outside");
    std::ofstream(daemon_.root() + "/outside/empty");
    daemon_.settings().test_after_input_check = swap;
    DeviceJobEngineOptions options;
    options.state_dir = daemon_.settings().state_dir;
    options.device = daemon_.settings().device;
    options.tokenize_binary = Runfile("engine/data/megatrain_tokenize");
    absl::StatusOr<std::unique_ptr<DeviceJobEngine>> engine = DeviceJobEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    daemon_.Start(engine_.get());
  }

  // `path` replaced (atomically, by rename) with a symlink to the empty file outside the roots.
  void SwapForOutsideSymlink(const std::string& path) {
    const std::string tmp = path + ".swap";
    std::filesystem::create_symlink(daemon_.root() + "/outside/empty", tmp);
    std::filesystem::rename(tmp, path);
  }

  // Submits, waits for the end (bounded) and returns the job.
  v1::Job RunToEnd(const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::ClientContext context;
    const grpc::Status submitted = daemon_.stub().SubmitJob(&context, request, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    return daemon_.AwaitState(job.id(), v1::SUCCEEDED, 0, 120);
  }

  v1::JobSpec Spec() {
    v1::JobSpec spec = daemon_.ValidSpec(3);
    spec.mutable_data()->clear_text_files();
    spec.mutable_data()->set_eval_windows(2);
    return spec;
  }

  std::string Fortunes() {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog\n%\n";
    return text;
  }

  TestDaemon daemon_{"input_swap"};
  std::unique_ptr<DeviceJobEngine> engine_;
};

TEST_F(InputSwapTest, ATextFileSwappedForASymlinkAfterTheCheckIsNotRead) {
  const std::string corpus = daemon_.root() + "/data/fortunes.txt";
  std::ofstream(corpus) << Fortunes();
  bool swapped = false;
  Start([&](const std::string&) {
    SwapForOutsideSymlink(corpus);
    swapped = true;
  });
  v1::JobSpec spec = Spec();
  spec.mutable_data()->add_text_files(corpus);
  const v1::Job done = RunToEnd(spec);
  EXPECT_TRUE(swapped);
  EXPECT_TRUE(std::filesystem::is_symlink(corpus));
  EXPECT_EQ(done.progress().step(), 3u) << done.failure_reason();
}

TEST_F(InputSwapTest, ATokenFileSwappedForAnotherFileAfterTheCheckIsNotRead) {
  const std::string tokens = daemon_.root() + "/data/tokens.u16";
  {
    std::vector<uint16_t> ids(4001);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>('a' + i % 26);
    std::ofstream(tokens, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  }
  Start([&](const std::string&) {
    // Three bytes: not a whole number of u16 tokens, so reading it fails the job.
    std::ofstream(tokens + ".swap", std::ios::binary) << "odd";
    std::filesystem::rename(tokens + ".swap", tokens);
  });
  v1::JobSpec spec = Spec();
  spec.mutable_data()->add_token_files(tokens);
  spec.mutable_data()->set_token_format("u16");
  const v1::Job done = RunToEnd(spec);
  EXPECT_EQ(std::filesystem::file_size(tokens), 3u);
  EXPECT_EQ(done.progress().step(), 3u) << done.failure_reason();
}

TEST_F(InputSwapTest, ASentencePieceJobsTextAndModelSwappedAfterTheCheckAreNotRead) {
  const std::string data = daemon_.root() + "/data";
  std::filesystem::copy_file(Runfile("tests/server/sp_fixture_corpus.txt"), data + "/sp.txt");
  std::filesystem::copy_file(Runfile("tests/server/sp_fixture.model"), data + "/sp.model");
  Start([&](const std::string&) {
    SwapForOutsideSymlink(data + "/sp.txt");
    SwapForOutsideSymlink(data + "/sp.model");
  });
  v1::JobSpec spec = Spec();
  spec.mutable_data()->add_text_files(data + "/sp.txt");
  spec.mutable_data()->set_tokenizer(data + "/sp.model");
  const v1::Job done = RunToEnd(spec);
  EXPECT_EQ(done.progress().step(), 3u) << done.failure_reason();
}

TEST_F(InputSwapTest, AnHfDirectorysWeightsSwappedAfterTheCheckAreNotRead) {
  const std::string corpus = daemon_.root() + "/data/fortunes.txt";
  const std::string hf = daemon_.root() + "/data/hf";
  std::ofstream(corpus) << Fortunes();
  const std::string second_job = "job-000002";  // ids are given in order
  Start([&](const std::string& id) {
    if (id != second_job) return;
    // Three bytes: too short for a safetensors header, so loading it fails the job.
    std::ofstream(hf + "/model.safetensors.swap", std::ios::binary) << "odd";
    std::filesystem::rename(hf + "/model.safetensors.swap", hf + "/model.safetensors");
  });
  // The first job's checkpoint is a Hugging Face directory (config.json + model.safetensors).
  v1::JobSpec first = Spec();
  first.mutable_data()->add_text_files(corpus);
  const v1::Job trained = RunToEnd(first);
  ASSERT_EQ(trained.state(), v1::SUCCEEDED) << trained.failure_reason();
  const std::string checkpoint = trained.progress().last_checkpoint();
  ASSERT_FALSE(checkpoint.empty());
  std::filesystem::create_directories(hf);
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(checkpoint + "/" + name, hf + "/" + name);
  }
  v1::JobSpec spec = Spec();
  spec.mutable_model()->set_hf_directory(hf);
  spec.mutable_data()->add_text_files(corpus);
  spec.mutable_data()->set_tokenizer("bytes");
  const v1::Job done = RunToEnd(spec);
  EXPECT_EQ(done.id(), second_job);
  EXPECT_EQ(std::filesystem::file_size(hf + "/model.safetensors"), 3u);
  EXPECT_EQ(done.progress().step(), 3u) << done.failure_reason();
}

}  // namespace
}  // namespace megatrain::server::testing
