#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "aiacc/common/error.h"

namespace fs = std::filesystem;

namespace aiacc::data {

bool hasImageExtension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const char* kExts[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  for (const char* e : kExts) {
    if (ext == e) return true;
  }
  return false;
}

ImageFolder scanImageFolder(const std::string& dir) {
  std::error_code ec;
  AIACC_CHECK_INPUT(fs::is_directory(dir, ec), "data folder '", dir, "' does not exist or is not a directory");
  ImageFolder folder;
  folder.root = dir;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) folder.classes.push_back(entry.path().filename().string());
  }
  AIACC_CHECK_INPUT(!folder.classes.empty(), "data folder '", dir, "' has no class folders (expected ", dir,
                    "/<class>/<image files>)");
  std::sort(folder.classes.begin(), folder.classes.end());
  for (size_t label = 0; label < folder.classes.size(); ++label) {
    const fs::path class_dir = fs::path(dir) / folder.classes[label];
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(class_dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string p = entry.path().string();
      if (hasImageExtension(p)) {
        files.push_back(p);
      } else {
        folder.ignored.push_back(p);
      }
    }
    AIACC_CHECK_INPUT(!files.empty(), "class folder '", class_dir.string(),
                      "' holds no image file (.jpg/.jpeg/.png/...); remove it or add images");
    std::sort(files.begin(), files.end());
    for (auto& f : files) folder.samples.push_back({std::move(f), static_cast<int64_t>(label)});
  }
  return folder;
}

ImageNetLayout scanImageNet(const std::string& root) {
  std::error_code ec;
  AIACC_CHECK_INPUT(fs::is_directory(root, ec), "--data folder '", root,
                    "' does not exist (give an ImageNet-layout folder with train/ and val/, "
                    "or run aiacc_train --make-sample DIR to generate one)");
  const std::string train = (fs::path(root) / "train").string();
  const std::string val = (fs::path(root) / "val").string();
  AIACC_CHECK_INPUT(fs::is_directory(train, ec), "'", root,
                    "' has no train/ folder (expected ImageNet layout: train/<class>/*, "
                    "val/<class>/*)");
  AIACC_CHECK_INPUT(fs::is_directory(val, ec), "'", root,
                    "' has no val/ folder (expected ImageNet layout: train/<class>/*, "
                    "val/<class>/*)");
  ImageNetLayout layout{scanImageFolder(train), scanImageFolder(val)};
  if (layout.train.classes != layout.val.classes) {
    const auto& a = layout.train.classes;
    const auto& b = layout.val.classes;
    std::string first;
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string x = i < a.size() ? a[i] : "<none>";
      const std::string y = i < b.size() ? b[i] : "<none>";
      if (x != y) {
        first = strCat("class #", i, " is '", x, "' in train/ but '", y, "' in val/");
        break;
      }
    }
    AIACC_THROW(InputError, "train/ and val/ class lists differ (", a.size(), " vs ", b.size(), " classes; ", first,
                ")");
  }
  return layout;
}

}  // namespace aiacc::data
