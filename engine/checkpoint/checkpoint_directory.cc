// Checkpoint naming, listing and retention.
#include "engine/checkpoint/checkpoint_directory.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/common/safe_files.h"
#include "engine/provenance/record.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
constexpr char kPrefix[] = "step-";
constexpr size_t kDigits = 12;

constexpr char kLineageSuffix[] = ".provenance.json";

// Copies the checkpoint's provenance.json (and .sig, when signed) into
// root/lineage; a checkpoint without a record has nothing to keep.
absl::Status PreserveProvenanceRecord(const std::string& root, const std::string& checkpoint) {
  const std::string name = fs::path(checkpoint).filename().string();
  const std::string lineage = absl::StrCat(root, "/", provenance::kLineageDirName);
  struct Copy {
    const char* from;
    std::string to;
  };
  bool created = false;
  for (const Copy& c :
       {Copy{provenance::kProvenanceFileName, provenance::LineageRecordFileName(name)},
        Copy{provenance::kSignatureFileName, provenance::LineageSignatureFileName(name)}}) {
    const std::string from = absl::StrCat(checkpoint, "/", c.from);
    std::error_code ec;
    // Only the checkpoint's own regular file: never through a symlink (it could copy any file
    // the daemon may read into lineage/), never a FIFO.
    if (!fs::is_regular_file(fs::symlink_status(from, ec)) || ec) continue;
    absl::StatusOr<std::string> text = ReadRegularFile(from, provenance::kMaxProvenanceBytes);
    if (!text.ok()) return text.status();
    if (!created) {
      fs::create_directories(lineage, ec);
      if (ec) return absl::InternalError(absl::StrCat(lineage, ": cannot create: ", ec.message()));
      created = true;
    }
    if (absl::Status s = ReplaceFileDurably(absl::StrCat(lineage, "/", c.to), *text); !s.ok()) {
      return s;
    }
  }
  return created ? FsyncDirectory(root) : absl::OkStatus();
}

}  // namespace

std::string CheckpointDirName(uint64_t step) { return absl::StrFormat("step-%012u", step); }

std::optional<uint64_t> ParseCheckpointDirName(const std::string& name) {
  const size_t prefix = sizeof(kPrefix) - 1;
  if (name.size() < prefix + kDigits || name.compare(0, prefix, kPrefix) != 0) return std::nullopt;
  uint64_t step = 0;
  for (size_t i = prefix; i < name.size(); ++i) {
    const char c = name[i];
    if (c < '0' || c > '9') return std::nullopt;
    if (step > (UINT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + static_cast<uint64_t>(c - '0');
  }
  if (CheckpointDirName(step) != name) return std::nullopt;
  return step;
}

absl::StatusOr<std::vector<CheckpointListing>> ListCheckpoints(const std::string& root) {
  std::vector<CheckpointListing> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    // Never through a symlink (a step-* link could point a resume anywhere); an entry that
    // vanished or cannot be looked at is not a checkpoint, and does not end the listing.
    std::error_code entry_ec;
    if (!fs::is_directory(it->symlink_status(entry_ec)) || entry_ec) continue;
    const std::string name = it->path().filename().string();
    if (std::optional<uint64_t> step = ParseCheckpointDirName(name)) {
      out.push_back({*step, it->path().string()});
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(root, ": cannot list: ", ec.message()));
  std::sort(out.begin(), out.end(),
            [](const CheckpointListing& a, const CheckpointListing& b) { return a.step < b.step; });
  return out;
}

absl::StatusOr<std::vector<CheckpointListing>> ListLineageRecords(const std::string& root) {
  std::vector<CheckpointListing> out;
  const std::string lineage = absl::StrCat(root, "/", provenance::kLineageDirName);
  std::error_code ec;
  if (!fs::is_directory(lineage, ec)) return out;
  const size_t suffix = sizeof(kLineageSuffix) - 1;
  for (fs::directory_iterator it(lineage, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= suffix || !name.ends_with(kLineageSuffix)) continue;
    if (std::optional<uint64_t> step =
            ParseCheckpointDirName(name.substr(0, name.size() - suffix))) {
      out.push_back({*step, it->path().string()});
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(lineage, ": cannot list: ", ec.message()));
  std::sort(out.begin(), out.end(),
            [](const CheckpointListing& a, const CheckpointListing& b) { return a.step < b.step; });
  return out;
}

absl::StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& root) {
  absl::StatusOr<std::vector<CheckpointListing>> all = ListCheckpoints(root);
  if (!all.ok()) return all.status();
  if (all->empty()) return std::optional<std::string>();
  return std::optional<std::string>(all->back().path);
}

absl::Status ApplyRetention(const std::string& root, int keep_last, const std::string& keep) {
  if (keep_last < 0) return absl::InvalidArgumentError(absl::StrCat("keep_last=", keep_last));
  if (keep_last == 0) return absl::OkStatus();
  absl::StatusOr<std::vector<CheckpointListing>> all = ListCheckpoints(root);
  if (!all.ok()) return all.status();
  if (all->size() <= static_cast<size_t>(keep_last)) return absl::OkStatus();
  const size_t remove = all->size() - static_cast<size_t>(keep_last);
  if (!keep.empty()) {
    const fs::path kept = fs::path(keep).lexically_normal();
    for (size_t i = 0; i < remove; ++i) {
      if (fs::path((*all)[i].path).lexically_normal() != kept) continue;
      all->erase(all->begin() + static_cast<std::ptrdiff_t>(i));  // a newer one goes instead
      break;
    }
  }
  std::vector<std::string> trash;
  for (size_t i = 0; i < remove; ++i) {
    if (absl::Status s = PreserveProvenanceRecord(root, (*all)[i].path); !s.ok()) return s;
    const std::string target = absl::StrCat(root, "/.trash-", CheckpointDirName((*all)[i].step));
    std::error_code ec;
    fs::remove_all(target, ec);  // a leftover of an earlier interrupted deletion
    fs::rename((*all)[i].path, target, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("rename ", (*all)[i].path, " -> ", target, ": ", ec.message()));
    }
    trash.push_back(target);
  }
  if (absl::Status s = FsyncDirectory(root); !s.ok()) return s;
  for (const std::string& t : trash) {
    std::error_code ec;
    fs::remove_all(t, ec);
    if (ec) return absl::InternalError(absl::StrCat(t, ": cannot remove: ", ec.message()));
  }
  return FsyncDirectory(root);
}

absl::Status RemoveCheckpointLeftovers(const std::string& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return absl::OkStatus();
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(".tmp-") || name.starts_with(".trash-")) leftovers.push_back(it->path());
  }
  if (ec) return absl::InternalError(absl::StrCat(root, ": cannot list: ", ec.message()));
  for (const fs::path& p : leftovers) {
    fs::remove_all(p, ec);
    if (ec) return absl::InternalError(absl::StrCat(p.string(), ": cannot remove: ", ec.message()));
  }
  return leftovers.empty() ? absl::OkStatus() : FsyncDirectory(root);
}

}  // namespace megatrain::engine
