// Precompiled header for every target that uses LibTorch (see CMakeLists.txt).
#pragma once
#include <torch/nn.h>
#include <torch/optim.h>
#include <torch/serialize.h>
