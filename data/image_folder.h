// ImageNet-layout folder index: DIR/train/<class>/* and DIR/val/<class>/*.
//
// Class index = position of the class folder's name in sorted (byte-wise) order, the convention of
// torchvision's ImageFolder, so label ids agree with PyTorch. Files are listed in sorted order
// within each class. Only files with an image extension (torchvision's list, case-insensitive)
// are samples; other files are counted as ignored and reported, never silently dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aiacc::data {

struct Sample {
  std::string path;
  int64_t label = 0;
};

struct ImageFolder {
  std::string root;
  std::vector<std::string> classes;  // sorted; classes[label] is the folder name
  std::vector<Sample> samples;       // grouped by class, sorted by path within a class
  std::vector<std::string> ignored;  // files without an image extension
};

// Indexes one split folder. Throws InputError when the folder is missing, has no class folders,
// or a class folder holds no image file.
ImageFolder scanImageFolder(const std::string& dir);

struct ImageNetLayout {
  ImageFolder train;
  ImageFolder val;
};

// Indexes ROOT/train and ROOT/val and checks both have the same class list. Every error is
// raised before any training work starts and names the folder to fix.
ImageNetLayout scanImageNet(const std::string& root);

// True for the extensions torchvision's ImageFolder accepts (.jpg .jpeg .png .ppm .bmp .pgm
// .tif .tiff .webp), case-insensitive.
bool hasImageExtension(const std::string& path);

}  // namespace aiacc::data
