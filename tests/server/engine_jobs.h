// Jobs on a real DeviceJobEngine in daemon tests: the engine over a TestDaemon's settings, the
// job RPCs (submit, pause, resume, cancel), a held job paused, and a finished job's result.json.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/megatrain.grpc.pb.h"
#include "server/job_engine.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {

// A real engine on the daemon's state directory and device; `chat_tokenize_binary` empty means
// the engine's default (the tool beside the running executable). Null after a failed expectation.
inline std::unique_ptr<DeviceJobEngine> MakeDeviceEngine(
    TestDaemon& daemon, const std::string& tokenize_binary,
    const std::string& chat_tokenize_binary = "") {
  DeviceJobEngineOptions options;
  options.state_dir = daemon.settings().state_dir;
  options.device = daemon.settings().device;
  options.tokenize_binary = tokenize_binary;
  options.chat_tokenize_binary = chat_tokenize_binary;
  absl::StatusOr<std::unique_ptr<DeviceJobEngine>> engine = DeviceJobEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// SubmitJob's status (the new job in `job`, when given), for specs a test expects refused.
inline grpc::Status TrySubmit(TestDaemon& daemon, const v1::JobSpec& spec,
                              v1::Job* job = nullptr) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job submitted;
  grpc::ClientContext context;
  const grpc::Status s = daemon.stub().SubmitJob(&context, request, &submitted);
  if (job != nullptr) *job = submitted;
  return s;
}

// The new job's id; "" after a failed expectation.
inline std::string Submit(TestDaemon& daemon, const v1::JobSpec& spec) {
  v1::Job job;
  const grpc::Status s = TrySubmit(daemon, spec, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.id();
}

// PauseJob or CancelJob (the RPCs that take a JobRef) on job `id`.
inline grpc::Status CallWithJobRef(
    TestDaemon& daemon, const std::string& id,
    grpc::Status (v1::Trainer::Stub::*method)(grpc::ClientContext*, const v1::JobRef&, v1::Job*)) {
  grpc::ClientContext context;
  v1::JobRef r;
  r.set_id(id);
  v1::Job job;
  return (daemon.stub().*method)(&context, r, &job);
}

inline grpc::Status Pause(TestDaemon& daemon, const std::string& id) {
  return CallWithJobRef(daemon, id, &v1::Trainer::Stub::PauseJob);
}

inline grpc::Status Cancel(TestDaemon& daemon, const std::string& id) {
  return CallWithJobRef(daemon, id, &v1::Trainer::Stub::CancelJob);
}

inline grpc::Status Resume(TestDaemon& daemon, const std::string& id) {
  grpc::ClientContext context;
  v1::ResumeJobRequest r;
  r.set_id(id);
  v1::Job job;
  return daemon.stub().ResumeJob(&context, r, &job);
}

// A job held RUNNING after `step` (settings().test_hold_after_step: a state, so the machine's
// speed does not matter) is paused, which checkpoints it; returns the job once PAUSED.
inline v1::Job PauseWhenHeld(TestDaemon& daemon, const std::string& id, uint64_t step,
                             int timeout_seconds) {
  daemon.AwaitState(id, v1::RUNNING, step, timeout_seconds);
  const grpc::Status paused = Pause(daemon, id);
  EXPECT_TRUE(paused.ok()) << paused.error_message();
  return daemon.AwaitState(id, v1::PAUSED, 0, 120);
}

// The file's JSON; a discarded (non-object) value when it is missing or not JSON.
inline nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadAll(path), nullptr, false);
}

// The job's result.json, as ReadJson.
inline nlohmann::json Result(const v1::JobSpec& spec) {
  return ReadJson(spec.output_dir() + "/result.json");
}

// A tokenized job's tokens directory holds exactly <key>.json (the tool's report), <key><ext>
// (its token or sample file) and the job's link <id><ext>; `names` gets them, sorted. Use under
// ASSERT_NO_FATAL_FAILURE.
inline void ExpectTokenFiles(const std::string& tokens_dir, const std::string& id,
                             const std::string& ext, std::vector<std::string>& names) {
  names = DirEntries(tokens_dir);
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  EXPECT_THAT(names[0], ::testing::MatchesRegex("[0-9a-f]{64}\\.json"));
  EXPECT_THAT(names[1], ::testing::MatchesRegex("[0-9a-f]{64}\\" + ext));
  EXPECT_EQ(names[2], id + ext);
}

// Two runs' result.json agree bitwise on each of `keys` (losses, entropies: doubles).
inline void ExpectSameResults(const nlohmann::json& a, const nlohmann::json& b,
                              std::initializer_list<const char*> keys) {
  ASSERT_TRUE(a.is_object() && b.is_object()) << a.dump() << " / " << b.dump();
  for (const char* key : keys) {
    EXPECT_EQ(a[key].get<double>(), b[key].get<double>()) << key;
  }
}

}  // namespace megatrain::server::testing
