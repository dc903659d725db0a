// The rank protocol's lines (see rank_protocol.h).
#include "server/rank_protocol.h"

#include "absl/strings/str_cat.h"
#include "engine/train/step_report_json.h"
#include "nlohmann/json.hpp"

namespace megatrain::server {
namespace {

// Invalid UTF-8 (a reply or a path cut mid-character) is replaced, never a throw.
std::string Line(const nlohmann::json& event) {
  return event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string RankLineEvent(const std::string& line, bool keep) {
  return Line({{"line", line}, {"keep", keep}});
}

std::string RankStepEvent(const engine::StepReport& report, double validation_loss) {
  return Line({{"step", engine::StepReportToJson(report)},
               {"validation_loss", engine::NumberToJson(validation_loss)}});
}

std::string RankCheckpointEvent(uint64_t step, const std::string& path) {
  return Line({{"checkpoint", {{"step", step}, {"path", path}}}});
}

std::string RankResultEvent(const engine::TrainingRunResult& result) {
  return Line({{"result", engine::TrainingRunResultToJson(result)}});
}

std::string RankStoppedEvent(const std::string& why) { return Line({{"stopped", why}}); }

std::string RankErrorEvent(int rank, const std::string& host, const absl::Status& error) {
  return Line({{"error",
                {{"rank", rank},
                 {"host", host},
                 {"code", static_cast<int>(error.code())},
                 {"message", std::string(error.message())}}}});
}

void RankEvents::OnOutputLine(const std::string& line) {
  if (line.empty()) return;
  const nlohmann::json event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto as_line = [&] { observer_.OnLine(line, true); };
  if (!event.is_object() || event.size() == 0) return as_line();
  try {
    if (event.contains("line")) {
      observer_.OnLine(event.at("line").get<std::string>(), event.value("keep", true));
      started_ = true;
    } else if (event.contains("step")) {
      absl::StatusOr<engine::StepReport> report = engine::StepReportFromJson(event.at("step"));
      absl::StatusOr<double> validation_loss =
          engine::NumberFromJson(event.value("validation_loss", nlohmann::json()));
      if (!report.ok() || !validation_loss.ok()) return as_line();
      observer_.OnStep(*report, *validation_loss);
      started_ = true;
    } else if (event.contains("checkpoint")) {
      const nlohmann::json& c = event.at("checkpoint");
      observer_.OnCheckpoint(c.at("step").get<uint64_t>(), c.at("path").get<std::string>());
    } else if (event.contains("result")) {
      absl::StatusOr<engine::TrainingRunResult> result =
          engine::TrainingRunResultFromJson(event.at("result"));
      if (!result.ok()) return as_line();
      result_ = *std::move(result);
    } else if (event.contains("stopped")) {
      stopped_ = event.at("stopped").get<std::string>();
    } else if (event.contains("error")) {
      const nlohmann::json& e = event.at("error");
      const int code = e.at("code").get<int>();
      const absl::StatusCode status_code =
          code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
      const int rank = e.at("rank").get<int>();
      const std::string where =
          absl::StrCat(rank >= 0 ? absl::StrCat("rank ", rank) : std::string("a rank before MPI"),
                       " on ", e.at("host").get<std::string>());
      const std::string message = e.at("message").get<std::string>();
      observer_.OnLine(absl::StrCat(where, ": ", message), true);
      if (!first_error_.has_value()) {
        first_error_ = absl::Status(status_code, absl::StrCat(where, ": ", message));
      }
    } else {
      as_line();
    }
  } catch (const nlohmann::json::exception&) {
    as_line();
  }
}

}  // namespace megatrain::server
