// Hostile and malformed requests against a real Trainer service (in-process daemon, Unix socket
// and TLS TCP listener) while a job keeps running: each gets the right gRPC code and a message
// naming the problem, and the running job is unaffected.
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "gmock/gmock.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string name;
  std::function<void(v1::JobSpec&)> mutate;
  grpc::StatusCode code;
  std::string message_part;
};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tls = daemon_.root() + "/tls";
    std::filesystem::create_directories(tls);
    const std::string openssl =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
        tls + "/key.pem -out " + tls + "/cert.pem > " + tls + "/openssl.log 2>&1";
    ASSERT_EQ(std::system(openssl.c_str()), 0) << ReadAll(tls + "/openssl.log");
    std::ofstream(tls + "/token") << "s3cret-token-0123456789abcdef\n";
    service::DaemonSettings& s = daemon_.settings();
    s.tcp_address = "127.0.0.1:0";
    s.tls_cert_file = tls + "/cert.pem";
    s.tls_key_file = tls + "/key.pem";
    s.token_file = tls + "/token";
    // Hostile filesystem fixtures: a symlink out of the data root, one out of the output root.
    std::filesystem::create_symlink("/etc/hostname", daemon_.root() + "/data/escape.txt");
    std::filesystem::create_directories(daemon_.root() + "/elsewhere");
    std::filesystem::create_directory_symlink(daemon_.root() + "/elsewhere",
                                              daemon_.root() + "/out/link");
    std::ofstream(daemon_.root() + "/data/broken.json") << "{\"model_type\": ";
    // Hugging Face directories whose files escape, block or are too large (issue 16, point 2).
    const std::string hf = daemon_.root() + "/data/hf_";
    for (const char* dir : {"escape", "fifo", "big", "shard"}) {
      std::filesystem::create_directories(hf + dir);
    }
    std::filesystem::create_symlink("/etc/hostname", hf + "escape/config.json");
    ASSERT_EQ(mkfifo((hf + "fifo/config.json").c_str(), 0600), 0);
    std::ofstream(hf + "big/config.json") << std::string((1 << 20) + 1, ' ');
    std::filesystem::copy_file(daemon_.root() + "/data/config.json", hf + "shard/config.json");
    std::filesystem::create_symlink("/etc/hostname", hf + "shard/model.safetensors");
    // Token files: a valid u16 one, one of 3 bytes (not whole u16 tokens), one holding id 300
    // (outside the test model's 256 ids).
    const uint16_t tokens[] = {1, 2, 3, 4, 5, 6, 7};
    const uint16_t big[] = {1, 300};
    std::ofstream(daemon_.root() + "/data/ok.u16", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens), sizeof(tokens));
    std::ofstream(daemon_.root() + "/data/odd.u16", std::ios::binary) << "abc";
    std::ofstream(daemon_.root() + "/data/big.u16", std::ios::binary)
        .write(reinterpret_cast<const char*>(big), sizeof(big));
    // NVMe tier fixtures: a disk directory under the output root and, when /dev/shm is a tmpfs,
    // a memory-backed one the daemon must refuse (made an output root so only tmpfs is wrong).
    std::filesystem::create_directories(daemon_.root() + "/out/nvme");
    char shm_template[] = "/dev/shm/mt-bad-input.XXXXXX";
    struct statfs shm_fs;
    if (statfs("/dev/shm", &shm_fs) == 0 && shm_fs.f_type == TMPFS_MAGIC &&
        mkdtemp(shm_template) != nullptr) {
      shm_dir_ = shm_template;
      s.output_roots.push_back(shm_dir_);
    }
    std::ofstream(daemon_.root() + "/data/huge.json")
        << R"({"model_type": "llama", "vocab_size": 256000, "hidden_size": 8192,
              "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "max_position_embeddings": 8192})";
    daemon_.Start();
  }

  std::shared_ptr<grpc::Channel> TcpChannel() {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadAll(daemon_.settings().tls_cert_file);
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(daemon_.daemon().tcp_port()),
                                     grpc::SslCredentials(ssl), args);
  }

  void TearDown() override {
    if (!shm_dir_.empty()) std::filesystem::remove_all(shm_dir_);
  }

  TestDaemon daemon_{"bad_input"};
  std::string shm_dir_;
};

TEST_F(BadInputTest, EveryHostileRequestIsRefusedWhileAJobRuns) {
  // A job that keeps running through all of this.
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = daemon_.ValidSpec(10'000'000);
  v1::Job running;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(daemon_.stub().SubmitJob(&context, submit, &running).ok());
  }
  const uint64_t step_before = daemon_.AwaitState(running.id(), v1::RUNNING, 1).progress().step();

  const std::string root = daemon_.root();
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  using C = grpc::StatusCode;
  const std::vector<Case> cases = {
      {"no model", [](v1::JobSpec& s) { s.clear_model(); }, C::INVALID_ARGUMENT, "model"},
      {"relative config", [](v1::JobSpec& s) { s.mutable_model()->set_config_json_path("c.json"); },
       C::INVALID_ARGUMENT, "model.config_json_path"},
      {"dotdot config",
       [&](v1::JobSpec& s) {
         s.mutable_model()->set_config_json_path(root + "/data/../data/config.json");
       },
       C::INVALID_ARGUMENT, "'..'"},
      {"missing config",
       [&](v1::JobSpec& s) { s.mutable_model()->set_config_json_path(root + "/data/none.json"); },
       C::NOT_FOUND, "model.config_json_path"},
      {"config outside roots",
       [](v1::JobSpec& s) { s.mutable_model()->set_config_json_path("/etc/hostname"); },
       C::PERMISSION_DENIED, "outside the allowed roots"},
      {"broken config json",
       [&](v1::JobSpec& s) { s.mutable_model()->set_config_json_path(root + "/data/broken.json"); },
       C::INVALID_ARGUMENT, "model.config_json_path"},
      {"huge model",
       [&](v1::JobSpec& s) { s.mutable_model()->set_config_json_path(root + "/data/huge.json"); },
       C::RESOURCE_EXHAUSTED, "parameters exceed"},
      {"config is a directory",
       [&](v1::JobSpec& s) { s.mutable_model()->set_config_json_path(root + "/data"); },
       C::INVALID_ARGUMENT, "is a directory"},
      {"hf directory without config.json",
       [&](v1::JobSpec& s) { s.mutable_model()->set_hf_directory(root + "/data"); },
       C::INVALID_ARGUMENT, "model.hf_directory"},
      {"hf config.json symlinked out of the roots",
       [&](v1::JobSpec& s) { s.mutable_model()->set_hf_directory(root + "/data/hf_escape"); },
       C::PERMISSION_DENIED, "model.hf_directory: config.json"},
      {"hf config.json is a FIFO (never opened)",
       [&](v1::JobSpec& s) { s.mutable_model()->set_hf_directory(root + "/data/hf_fifo"); },
       C::INVALID_ARGUMENT, "is a FIFO"},
      {"hf config.json over 1 MiB",
       [&](v1::JobSpec& s) { s.mutable_model()->set_hf_directory(root + "/data/hf_big"); },
       C::RESOURCE_EXHAUSTED, "model.hf_directory: config.json"},
      {"hf shard symlinked out of the roots",
       [&](v1::JobSpec& s) { s.mutable_model()->set_hf_directory(root + "/data/hf_shard"); },
       C::PERMISSION_DENIED, "model.hf_directory: model.safetensors"},
      {"no text", [](v1::JobSpec& s) { s.mutable_data()->clear_text_files(); }, C::INVALID_ARGUMENT,
       "data.text_files"},
      {"missing text",
       [&](v1::JobSpec& s) { s.mutable_data()->add_text_files(root + "/data/absent.txt"); },
       C::NOT_FOUND, "data.text_files[1]"},
      {"symlink escape",
       [&](v1::JobSpec& s) { s.mutable_data()->add_text_files(root + "/data/escape.txt"); },
       C::PERMISSION_DENIED, "data.text_files[1]"},
      {"NUL in path",
       [&](v1::JobSpec& s) {
         s.mutable_data()->add_text_files(root + std::string("/data/x\0y", 9));
       },
       C::INVALID_ARGUMENT, "NUL"},
      {"token and text files",
       [&](v1::JobSpec& s) { s.mutable_data()->add_token_files(root + "/data/ok.u16"); },
       C::INVALID_ARGUMENT, "data.token_files: set either"},
      {"token file outside roots",
       [](v1::JobSpec& s) {
         s.mutable_data()->clear_text_files();
         s.mutable_data()->add_token_files("/etc/hostname");
       },
       C::PERMISSION_DENIED, "data.token_files[0]"},
      {"token file of 3 bytes",
       [&](v1::JobSpec& s) {
         s.mutable_data()->clear_text_files();
         s.mutable_data()->add_token_files(root + "/data/odd.u16");
       },
       C::INVALID_ARGUMENT, "data.token_files"},
      {"token id outside the vocabulary",
       [&](v1::JobSpec& s) {
         s.mutable_data()->clear_text_files();
         s.mutable_data()->add_token_files(root + "/data/big.u16");
       },
       C::INVALID_ARGUMENT, "token id 300"},
      {"unknown token format",
       [&](v1::JobSpec& s) {
         s.mutable_data()->clear_text_files();
         s.mutable_data()->add_token_files(root + "/data/ok.u16");
         s.mutable_data()->set_token_format("u7");
       },
       C::INVALID_ARGUMENT, "data.token_format"},
      // A SentencePiece model is only located at submit (the first run tokenizes with it in a
      // megatrain_tokenize process), with the data files' path policy.
      {"missing tokenizer",
       [&](v1::JobSpec& s) { s.mutable_data()->set_tokenizer(root + "/data/none.model"); },
       C::NOT_FOUND, "data.tokenizer"},
      {"tokenizer outside the data roots",
       [&](v1::JobSpec& s) { s.mutable_data()->set_tokenizer(root + "/data/escape.txt"); },
       C::PERMISSION_DENIED, "data.tokenizer"},
      {"tokenizer is a directory",
       [&](v1::JobSpec& s) { s.mutable_data()->set_tokenizer(root + "/data"); },
       C::INVALID_ARGUMENT, "data.tokenizer"},
      {"relative tokenizer path",
       [&](v1::JobSpec& s) { s.mutable_data()->set_tokenizer("sp.model"); }, C::INVALID_ARGUMENT,
       "data.tokenizer"},
      {"NaN validation fraction",
       [&](v1::JobSpec& s) { s.mutable_data()->set_validation_fraction(nan); }, C::INVALID_ARGUMENT,
       "data.validation_fraction"},
      {"validation fraction 0.9",
       [](v1::JobSpec& s) { s.mutable_data()->set_validation_fraction(0.9); }, C::INVALID_ARGUMENT,
       "data.validation_fraction"},
      {"eval every > steps", [](v1::JobSpec& s) { s.mutable_data()->set_eval_every_steps(999); },
       C::INVALID_ARGUMENT, "data.eval_every_steps"},
      {"zero steps", [](v1::JobSpec& s) { s.mutable_hyper()->set_steps(0); }, C::INVALID_ARGUMENT,
       "hyper.steps"},
      {"absurd steps", [](v1::JobSpec& s) { s.mutable_hyper()->set_steps(uint64_t{1} << 62); },
       C::INVALID_ARGUMENT, "hyper.steps"},
      {"batch over 4096", [](v1::JobSpec& s) { s.mutable_hyper()->set_batch_size(4097); },
       C::INVALID_ARGUMENT, "hyper.batch_size"},
      {"micro batch not dividing",
       [](v1::JobSpec& s) {
         s.mutable_hyper()->set_batch_size(6);
         s.mutable_hyper()->set_micro_batch_size(4);
       },
       C::INVALID_ARGUMENT, "hyper.micro_batch_size"},
      {"absurd seq_len", [](v1::JobSpec& s) { s.mutable_hyper()->set_seq_len(1u << 30); },
       C::INVALID_ARGUMENT, "hyper.seq_len"},
      {"NaN lr", [&](v1::JobSpec& s) { s.mutable_hyper()->mutable_lr()->set_peak_lr(nan); },
       C::INVALID_ARGUMENT, "hyper.lr.peak_lr"},
      {"infinite lr", [&](v1::JobSpec& s) { s.mutable_hyper()->mutable_lr()->set_peak_lr(inf); },
       C::INVALID_ARGUMENT, "hyper.lr.peak_lr"},
      {"negative lr", [](v1::JobSpec& s) { s.mutable_hyper()->mutable_lr()->set_peak_lr(-1e-3); },
       C::INVALID_ARGUMENT, "hyper.lr.peak_lr"},
      {"warmup > steps",
       [](v1::JobSpec& s) { s.mutable_hyper()->mutable_lr()->set_warmup_steps(1000); },
       C::INVALID_ARGUMENT, "hyper.lr.warmup_steps"},
      {"unknown decay",
       [](v1::JobSpec& s) { s.mutable_hyper()->mutable_lr()->set_decay(v1::LrSchedule_Decay(7)); },
       C::INVALID_ARGUMENT, "hyper.lr.decay"},
      {"beta1 1.5", [](v1::JobSpec& s) { s.mutable_hyper()->set_adam_beta1(1.5); },
       C::INVALID_ARGUMENT, "hyper.adam_beta1"},
      {"negative eps", [](v1::JobSpec& s) { s.mutable_hyper()->set_adam_eps(-1); },
       C::INVALID_ARGUMENT, "hyper.adam_eps"},
      {"NaN weight decay", [&](v1::JobSpec& s) { s.mutable_hyper()->set_weight_decay(nan); },
       C::INVALID_ARGUMENT, "hyper.weight_decay"},
      {"negative clip", [](v1::JobSpec& s) { s.mutable_hyper()->set_grad_clip(-1); },
       C::INVALID_ARGUMENT, "hyper.grad_clip"},
      {"arena above daemon",
       [](v1::JobSpec& s) { s.mutable_memory()->set_device_arena_bytes(uint64_t{1} << 40); },
       C::RESOURCE_EXHAUSTED, "memory.device_arena_bytes"},
      {"pinned above daemon",
       [](v1::JobSpec& s) { s.mutable_memory()->set_pinned_ram_bytes(uint64_t{1} << 50); },
       C::RESOURCE_EXHAUSTED, "memory.pinned_ram_bytes"},
      {"ram too small for moments", [](v1::JobSpec& s) { s.mutable_memory()->set_ram_bytes(16); },
       C::RESOURCE_EXHAUSTED, "memory.ram_bytes"},
      {"activations beyond the arena",
       [](v1::JobSpec& s) {
         s.mutable_hyper()->set_batch_size(4096);
         s.mutable_hyper()->set_micro_batch_size(4096);
         s.mutable_hyper()->set_seq_len(256);
       },
       C::RESOURCE_EXHAUSTED, "memory.device_arena_bytes: the executor's device plan"},
      {"nvme outside roots",
       [](v1::JobSpec& s) {
         s.mutable_memory()->set_nvme_dir("/nvme");
         s.mutable_memory()->set_nvme_bytes(1 << 30);
       },
       C::PERMISSION_DENIED, "memory.nvme_dir"},
      {"nvme without a size",
       [&](v1::JobSpec& s) { s.mutable_memory()->set_nvme_dir(root + "/out/nvme"); },
       C::INVALID_ARGUMENT, "memory.nvme_bytes"},
      {"nvme size without a directory",
       [](v1::JobSpec& s) { s.mutable_memory()->set_nvme_bytes(1 << 30); }, C::INVALID_ARGUMENT,
       "memory.nvme_bytes"},
      {"master on nvme without a directory",
       [](v1::JobSpec& s) { s.mutable_memory()->set_master_on_nvme(true); }, C::INVALID_ARGUMENT,
       "memory.master_on_nvme"},
      {"nvme too small for master, m and v",
       [&](v1::JobSpec& s) {
         s.mutable_memory()->set_nvme_dir(root + "/out/nvme");
         s.mutable_memory()->set_nvme_bytes(4096);
         s.mutable_memory()->set_master_on_nvme(true);
       },
       C::RESOURCE_EXHAUSTED, "master"},
      {"nvme directory missing",
       [&](v1::JobSpec& s) {
         s.mutable_memory()->set_nvme_dir(root + "/out/no-such-dir");
         s.mutable_memory()->set_nvme_bytes(1 << 30);
       },
       C::NOT_FOUND, "memory.nvme_dir"},
      {"nvme too small for m and v",
       [&](v1::JobSpec& s) {
         s.mutable_memory()->set_nvme_dir(root + "/out/nvme");
         s.mutable_memory()->set_nvme_bytes(4096);
         s.mutable_memory()->set_states_on_nvme(true);
       },
       C::RESOURCE_EXHAUSTED, "memory.nvme_bytes"},
      {"nvme larger than the disk",
       [&](v1::JobSpec& s) {
         s.mutable_memory()->set_nvme_dir(root + "/out/nvme");
         s.mutable_memory()->set_nvme_bytes(uint64_t{1} << 60);
       },
       C::FAILED_PRECONDITION, "memory.nvme_bytes"},
      {"unknown activation policy",
       [](v1::JobSpec& s) { s.mutable_executor()->set_activation_policy("sometimes"); },
       C::INVALID_ARGUMENT, "executor.activation_policy: 'sometimes' is not"},
      {"fragment size without a ring",
       [](v1::JobSpec& s) { s.mutable_executor()->set_fragment_bytes(65536); }, C::INVALID_ARGUMENT,
       "executor.fragment_bytes: 65536 needs executor.weight_ring_bytes"},
      {"fragment size of 100 bytes",
       [](v1::JobSpec& s) {
         s.mutable_executor()->set_weight_ring_bytes(1 << 20);
         s.mutable_executor()->set_fragment_bytes(100);
       },
       C::INVALID_ARGUMENT, "executor.fragment_bytes: 100 is below"},
      {"ring smaller than an LM-head vocabulary block",
       [](v1::JobSpec& s) { s.mutable_executor()->set_weight_ring_bytes(40000); },
       C::INVALID_ARGUMENT,
       "executor.weight_ring_bytes: weight_ring_bytes=40000 is smaller than tensor "
       "'lm_head rows 0-255'"},
      {"ring beyond the arena",
       [](v1::JobSpec& s) { s.mutable_executor()->set_weight_ring_bytes(uint64_t{1} << 40); },
       C::RESOURCE_EXHAUSTED, "executor.weight_ring_bytes: 1099511627776 exceed the device arena"},
      {"activation budget below the working sets",
       [](v1::JobSpec& s) { s.mutable_executor()->set_activation_budget_bytes(1); },
       C::INVALID_ARGUMENT, "executor.activation_budget_bytes: activation_budget_bytes=1 is below"},
      {"activation budget beyond the arena",
       [](v1::JobSpec& s) { s.mutable_executor()->set_activation_budget_bytes(uint64_t{1} << 40); },
       C::RESOURCE_EXHAUSTED, "executor.activation_budget_bytes: 1099511627776 exceed"},
      {"output outside roots", [](v1::JobSpec& s) { s.set_output_dir("/etc/megatrain-out"); },
       C::PERMISSION_DENIED, "output_dir"},
      {"output dotdot", [&](v1::JobSpec& s) { s.set_output_dir(root + "/out/../../x"); },
       C::INVALID_ARGUMENT, "output_dir"},
      {"output via symlink", [&](v1::JobSpec& s) { s.set_output_dir(root + "/out/link/run"); },
       C::PERMISSION_DENIED, "output_dir"},
      {"long name", [](v1::JobSpec& s) { s.set_name(std::string(1000, 'n')); }, C::INVALID_ARGUMENT,
       "name"},
      {"control char name", [](v1::JobSpec& s) { s.set_name("a\nb"); }, C::INVALID_ARGUMENT,
       "name"},
      {"checkpoint interval > steps",
       [](v1::JobSpec& s) { s.mutable_checkpoints()->set_every_steps(10'000); },
       C::INVALID_ARGUMENT, "checkpoints.every_steps"},
  };
  std::vector<Case> all = cases;
  if (!shm_dir_.empty()) {
    all.push_back({"nvme on tmpfs",
                   [&](v1::JobSpec& s) {
                     s.mutable_memory()->set_nvme_dir(shm_dir_);
                     s.mutable_memory()->set_nvme_bytes(1 << 30);
                   },
                   C::FAILED_PRECONDITION, "memory.nvme_dir"});
  }
  int checked = 0;
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = daemon_.ValidSpec(10);
    c.mutate(*request.mutable_spec());
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status status = daemon_.stub().SubmitJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message_part));
    // Plan validates the same way.
    grpc::ClientContext plan_context;
    v1::PlanResponse plan;
    EXPECT_EQ(daemon_.stub().Plan(&plan_context, request.spec(), &plan).error_code(), c.code);
    ++checked;
  }

  auto expect = [&](grpc::Status status, grpc::StatusCode code, const std::string& part) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(part));
    ++checked;
  };
  {
    grpc::ClientContext context;
    v1::Job job;
    expect(daemon_.stub().SubmitJob(&context, v1::SubmitJobRequest(), &job), C::INVALID_ARGUMENT,
           "spec");
  }
  for (const std::string& id :
       {std::string(), std::string("../etc/passwd"), std::string(100, 'x')}) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id(id);
    v1::Job job;
    expect(daemon_.stub().GetJob(&context, request, &job), C::INVALID_ARGUMENT, "id");
  }
  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id("job-424242");
    v1::Job job;
    expect(daemon_.stub().GetJob(&context, request, &job), C::NOT_FOUND, "job-424242");
  }
  {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.add_states(v1::JobState(99));
    v1::ListJobsResponse response;
    expect(daemon_.stub().ListJobs(&context, request, &response), C::INVALID_ARGUMENT, "states[0]");
  }
  {
    grpc::ClientContext context;
    v1::JobRef ref;
    ref.set_id("job-424242");
    v1::Job job;
    expect(daemon_.stub().CancelJob(&context, ref, &job), C::NOT_FOUND, "not found");
  }
  {
    grpc::ClientContext context;
    v1::ResumeJobRequest ref;
    ref.set_id(running.id());
    v1::Job job;
    expect(daemon_.stub().ResumeJob(&context, ref, &job), C::FAILED_PRECONDITION, "not PAUSED");
  }
  {
    // 5 MiB request: over the daemon's 4 MiB receive limit, refused before any handler.
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = daemon_.ValidSpec(10);
    request.mutable_spec()->set_name(std::string(5 << 20, 'x'));
    v1::Job job;
    expect(daemon_.stub().SubmitJob(&context, request, &job), C::RESOURCE_EXHAUSTED, "");
  }
  // TCP: TLS plus the bearer token, compared in constant time.
  auto tcp = v1::Trainer::NewStub(TcpChannel());
  {
    grpc::ClientContext context;
    v1::DaemonStatus status;
    expect(tcp->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status),
           C::UNAUTHENTICATED, "authorization");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer wrong-token-0123456789");
    v1::DaemonStatus status;
    expect(tcp->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status),
           C::PERMISSION_DENIED, "token");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Basic czNjcmV0");
    v1::DaemonStatus status;
    expect(tcp->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status),
           C::UNAUTHENTICATED, "Bearer");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret-token-0123456789abcdef");
    v1::DaemonStatus status;
    grpc::Status ok = tcp->GetDaemonStatus(&context, v1::GetDaemonStatusRequest(), &status);
    EXPECT_TRUE(ok.ok()) << ok.error_message();
    EXPECT_EQ(status.running_job_id(), running.id());
  }
  EXPECT_GE(checked, 30);

  // The running job kept running and kept stepping.
  v1::Job after = daemon_.AwaitState(running.id(), v1::RUNNING, step_before + 1);
  EXPECT_GT(after.progress().step(), step_before);
  {
    grpc::ClientContext context;
    v1::JobRef ref;
    ref.set_id(running.id());
    v1::Job job;
    ASSERT_TRUE(daemon_.stub().CancelJob(&context, ref, &job).ok());
  }
  daemon_.AwaitState(running.id(), v1::CANCELLED);
}

TEST(TokenAuthTest, RefusesToStartTcpWithoutTls) {
  v1::DaemonConfig config;
  config.set_config_version(1);
  config.set_state_dir("/tmp/x");
  config.set_socket_path("/tmp/x/s.sock");
  config.add_data_roots("/tmp");
  config.add_output_roots("/tmp");
  config.set_tcp_address("127.0.0.1:0");
  config.set_token_file("/tmp/token");
  absl::StatusOr<service::DaemonSettings> settings = service::ValidateDaemonConfig(config);
  EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(settings.status().message(), HasSubstr("tls_cert_file"));
}

}  // namespace
}  // namespace megatrain::server::testing
