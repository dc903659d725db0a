// export_sample: trains a golden fixture's three steps on the CPU device,
// exports the model in Hugging Face layout to <out_dir>, and writes the
// engine's logits for the fixture's first micro-batch to
// <out_dir>/engine_logits.safetensors, for tests/golden/export_check.py.
// Usage: export_sample <fixture dir> <out_dir>
#include <cstdio>

#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/model/safetensors_writer.h"
#include "tests/checkpoint/export_util.h"

int main(int argc, char** argv) {
  using namespace megatrain::engine;
  if (argc != 3) {
    fprintf(stderr, "usage: %s <fixture dir, e.g. tests/golden/llama_tiny> <out_dir>\n", argv[0]);
    return 2;
  }
  auto run = testing::LoadGolden(argv[1]);
  if (!run.ok()) {
    fprintf(stderr, "error: %s\n", run.status().ToString().c_str());
    return 1;
  }
  absl::Status s = testing::TrainGoldenSteps(*run);
  if (s.ok()) s = ExportHfModel(*run->trainer, argv[2]);
  auto logits = run->trainer->Logits(run->input_ids.data());
  if (s.ok()) s = logits.status();
  if (s.ok()) {
    const int64_t vocab = run->trainer->config().vocab_size;
    const size_t ids = static_cast<size_t>(run->batch) * run->seq;
    s = WriteSafetensors(
        std::string(argv[2]) + "/engine_logits.safetensors",
        {{"input_ids",
          SafetensorsDtype::kI32,
          {run->batch, run->seq},
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(run->input_ids.data()),
                              ids * sizeof(int32_t))},
         {"logits",
          SafetensorsDtype::kF32,
          {run->batch, run->seq, vocab},
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(logits->data()),
                              logits->size() * sizeof(float))}});
  }
  if (!s.ok()) {
    fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  printf("exported the trained %s to %s (with engine_logits.safetensors)\n", argv[1], argv[2]);
  return 0;
}
