// Tests for Timeline: span storage, totals, and the Chrome trace JSON.
#include "engine/device/timeline.h"

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

TEST(TimelineTest, IsOffByDefaultAndToggles) {
  Timeline timeline;
  EXPECT_FALSE(timeline.enabled());
  timeline.set_enabled(true);
  EXPECT_TRUE(timeline.enabled());
}

TEST(TimelineTest, SortsSpansAndSumsPerStreamAndKind) {
  Timeline timeline;
  timeline.Add({"compute", SpanKind::kCompute, "fwd", 2, 300, 500});
  timeline.Add({"copy_in", SpanKind::kCopyIn, "w", 3, 100, 400});
  timeline.Add({"compute", SpanKind::kWait, "wait w3", 3, 50, 300});
  const std::vector<TimelineSpan> spans = timeline.Spans();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].begin_ns, 50);
  EXPECT_EQ(spans[1].begin_ns, 100);
  EXPECT_EQ(spans[2].begin_ns, 300);
  EXPECT_EQ(timeline.TotalNs("compute", SpanKind::kWait), 250);
  EXPECT_EQ(timeline.TotalNs("compute", SpanKind::kCompute), 200);
  EXPECT_EQ(timeline.TotalNs("copy_in", SpanKind::kCompute), 0);
  timeline.Clear();
  EXPECT_TRUE(timeline.Spans().empty());
}

TEST(TimelineTest, ChromeTraceHasOneCompleteEventPerSpanAndATrackPerStream) {
  Timeline timeline;
  timeline.RegisterStream("copy_in");
  timeline.RegisterStream("compute");
  timeline.Add({"compute", SpanKind::kCompute, "attn \"q\"", 7, 2000, 5500});
  timeline.Add({"copy_in", SpanKind::kCopyIn, "", -1, 1000, 3000});
  const nlohmann::json trace = nlohmann::json::parse(timeline.ToChromeTraceJson());
  int complete = 0;
  std::map<int, std::string> track_names;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      track_names[event.at("tid").get<int>()] = event.at("args").at("name").get<std::string>();
      continue;
    }
    if (event.at("ph") != "X") continue;
    ++complete;
    if (event.at("cat") == "compute") {
      EXPECT_EQ(event.at("name"), "attn \"q\"");
      EXPECT_DOUBLE_EQ(event.at("ts").get<double>(), 2.0);
      EXPECT_DOUBLE_EQ(event.at("dur").get<double>(), 3.5);
      EXPECT_EQ(event.at("args").at("layer"), 7);
      EXPECT_EQ(event.at("tid"), 2);
    } else {
      EXPECT_EQ(event.at("cat"), "copy_in");
      EXPECT_EQ(event.at("name"), "copy_in");  // the kind names an unlabelled span
      EXPECT_EQ(event.at("tid"), 1);
    }
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(track_names[1], "copy_in");
  EXPECT_EQ(track_names[2], "compute");
}

TEST(TimelineTest, AddIsThreadSafe) {
  Timeline timeline;
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&timeline, t] {
      for (int i = 0; i < 1000; ++i) {
        const int64_t now = timeline.NowNs();
        timeline.Add({"s" + std::to_string(t), SpanKind::kOther, "x", i, now, now + 1});
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(timeline.Spans().size(), 4000u);
}

}  // namespace
}  // namespace megatrain::engine
