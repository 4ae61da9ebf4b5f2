// The commit protocol (core/commit.h): what a claim refuses and clears, and what Mark writes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "core/commit.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "core/process.h"
#include "test_support.h"

namespace fs = std::filesystem;
using ucp::OutputFolder;

namespace {

fs::path Fresh(const std::string& name) {
  const fs::path dir = ucp::test::WorkDir() / "commit" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

void Touch(const fs::path& p, const std::string& text = "x") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace

TEST_CASE("a folder that holds something is refused by name, and the refusal leaves it as it was", "[commit]") {
  const fs::path dir = Fresh("refused");
  Touch(dir / "latest", "tag");
  Touch(dir / "tag" / "file.pt");
  OutputFolder folder(dir.string(), "test", {"latest"});
  CHECK_FALSE(folder.Empty());
  try {
    folder.RequireEmpty(false, {"tag"}, "use --force");
    FAIL("a non-empty folder was taken");
  } catch (const ucp::Error& e) {
    CHECK(std::string(e.what()) == dir.string() + ": exists and is not empty; use --force");
  }
  CHECK(fs::exists(dir / "latest"));
  CHECK(fs::exists(dir / "tag" / "file.pt"));
}

TEST_CASE("--force clears the markers, the contents named and the temporaries, and keeps the rest", "[commit]") {
  const fs::path dir = Fresh("force");
  Touch(dir / "latest", "tag");
  Touch(dir / "iteration.txt", "6");
  Touch(dir / "tag" / "file.pt");
  Touch(dir / "tag" / "part.pt.tmp-1-0");
  Touch(dir / "other" / "kept.txt");
  OutputFolder folder(dir.string(), "test", {"iteration.txt", "latest"});
  folder.RequireEmpty(true, {"tag"});
  CHECK_FALSE(fs::exists(dir / "latest"));
  CHECK_FALSE(fs::exists(dir / "iteration.txt"));
  CHECK_FALSE(fs::exists(dir / "tag"));
  CHECK(fs::exists(dir / "other" / "kept.txt"));  // what the tool does not name is not its to remove
}

TEST_CASE("an empty folder is taken as it is; Mark writes the markers in order, skipping an absent one", "[commit]") {
  const fs::path dir = Fresh("mark");
  OutputFolder folder(dir.string(), "test", {"iteration.txt", "latest"});
  CHECK(folder.Empty());
  folder.RequireEmpty(false, {"tag"});
  folder.Mark({std::nullopt, std::string("global_step6")});
  CHECK_FALSE(fs::exists(dir / "iteration.txt"));
  CHECK(ucp::test::ReadText(dir / "latest") == "global_step6");
  folder.Mark({std::string("6"), std::string("global_step7")});
  CHECK(ucp::test::ReadText(dir / "iteration.txt") == "6");
  CHECK(ucp::test::ReadText(dir / "latest") == "global_step7");
  CHECK_THROWS_AS(folder.Mark({std::string("only one")}), ucp::Error);
}

TEST_CASE("a path that is a file is refused before any lock is taken", "[commit]") {
  const fs::path file = Fresh("a-file");
  Touch(file);
  CHECK_THROWS_WITH(OutputFolder(file.string(), "test", {"latest"}), file.string() + ": exists and is not a folder");
}

TEST_CASE("a second claim of a folder a live run holds is refused, naming the holder", "[commit]") {
  const fs::path dir = Fresh("held");
  OutputFolder first(dir.string(), "first-tool", {"latest"});
  CHECK_THROWS_WITH(OutputFolder(dir.string(), "second-tool", {"latest"}), Catch::Contains("first-tool"));
}

TEST_CASE("RemoveStale removes the lock of a run that is gone, and refuses a live holder's", "[commit]") {
  const fs::path dir = Fresh("stale");
  CHECK(ucp::OutputLock::RemoveStale(dir.string(), "reader").empty());  // no lock: nothing to do, nothing written
  CHECK_FALSE(fs::exists(dir / ucp::OutputLock::kFileName));
  Touch(dir / "ucp_manifest.json");
  // The lock a writer killed after its commit point leaves, on this host (a pid above any pid_max: gone).
  Touch(dir / ucp::OutputLock::kFileName, R"({"tool": "killed-tool", "host": ")" + ucp::HostName() + R"(", "pid": 2147483646, "start_ticks": "1"})");
  CHECK_THAT(ucp::OutputLock::RemoveStale(dir.string(), "reader"), Catch::Contains("killed-tool"));
  CHECK_FALSE(fs::exists(dir / ucp::OutputLock::kFileName));
  CHECK(fs::exists(dir / "ucp_manifest.json"));
  OutputFolder live(dir.string(), "live-tool", {"latest"});
  CHECK_THROWS_WITH(ucp::OutputLock::RemoveStale(dir.string(), "reader"), Catch::Contains("live-tool"));
  CHECK(fs::exists(dir / ucp::OutputLock::kFileName));
}
