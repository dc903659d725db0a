// Writes the malformed safetensors corpus into a directory (default: the source testdata dir).
#include <cstdio>
#include <fstream>
#include <string>

#include "engine/model/safetensors_corpus.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  for (const auto& c : megatrain::engine::MalformedSafetensorsCases()) {
    const std::string path = dir + "/" + c.file_name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
    if (!out) {
      std::fprintf(stderr, "%s: write failed\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
