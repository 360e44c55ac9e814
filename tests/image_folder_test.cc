#include "data/image_folder.h"

#include <gtest/gtest.h>

#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc::data {
namespace {

using test::TempDir;
using test::writeText;

TEST(ImageFolder, ClassIndexIsSortedFolderPosition) {
  TempDir d;
  for (const char* c : {"zebra", "ant", "Mole", "bee"}) {
    writeText(d / (std::string("train/") + c + "/a.JPEG"), "x");
    writeText(d / (std::string("train/") + c + "/b.jpg"), "x");
  }
  writeText(d / "train/ant/notes.txt", "not an image");
  ImageFolder f = scanImageFolder(d / "train");
  // Byte-wise sort, as Python's sorted(): uppercase before lowercase.
  ASSERT_EQ(f.classes, (std::vector<std::string>{"Mole", "ant", "bee", "zebra"}));
  ASSERT_EQ(f.samples.size(), 8u);
  EXPECT_EQ(f.samples[0].label, 0);
  EXPECT_NE(f.samples[2].path.find("/ant/a.JPEG"), std::string::npos);
  EXPECT_EQ(f.samples[2].label, 1);
  EXPECT_EQ(f.samples[7].label, 3);
  ASSERT_EQ(f.ignored.size(), 1u);
  EXPECT_NE(f.ignored[0].find("notes.txt"), std::string::npos);
}

TEST(ImageFolder, ErrorsNameTheProblem) {
  TempDir d;
  EXPECT_THROW(scanImageNet(d / "missing"), InputError);
  writeText(d / "train/a/1.jpg", "x");
  try {
    scanImageNet(d.path());
    FAIL() << "no val/ accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no val/"), std::string::npos) << e.what();
  }
  writeText(d / "val/b/1.jpg", "x");
  try {
    scanImageNet(d.path());
    FAIL() << "different class lists accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("class lists differ"), std::string::npos) << e.what();
  }
  TempDir e;
  std::filesystem::create_directories(e / "train");
  std::filesystem::create_directories(e / "val");
  EXPECT_THROW(scanImageNet(e.path()), InputError);  // no class folders
  std::filesystem::create_directories(e / "train/empty");
  try {
    scanImageFolder(e / "train");
    FAIL() << "empty class accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("holds no image"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace aiacc::data
