# Finds every external dependency once and exposes it as an interface target.
#   aiacc_torch   LibTorch (Debian libtorch-dev, or a CUDA build through CMAKE_PREFIX_PATH)
#   aiacc_opencv  OpenCV core + imgproc (resize), imgcodecs when present (decode fallback)
#   aiacc_jpeg    libjpeg-turbo (libjpeg API for scaled/region decode; TurboJPEG for encode)
#   gflags, glog, GTest
# With AIACC_COMM_ONLY: LibTorch, Threads, nlohmann-json (and GTest for the tests) only.

find_package(Torch REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/aiaccTorchUsage.cmake)
add_library(aiacc_torch INTERFACE)
aiacc_torch_mixed(mixed)
if(mixed)
  message(FATAL_ERROR "aiacc: ${mixed}")
endif()
aiacc_torch_usage(aiacc_torch INTERFACE)
aiacc_torch_cxx11_abi(AIACC_CXX11_ABI)
set(AIACC_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR CUDA_FOUND OR TORCH_CUDA_LIBRARIES)
  set(AIACC_TORCH_HAS_CUDA ON)
endif()
message(STATUS "aiacc: LibTorch ${Torch_VERSION} (CUDA: ${AIACC_TORCH_HAS_CUDA}, C++11 ABI: ${AIACC_CXX11_ABI})")

# The data pipeline's and the trainer's dependencies; the comm-only configuration needs none.
if(NOT AIACC_COMM_ONLY)
  find_package(libjpeg-turbo CONFIG REQUIRED)
  add_library(aiacc_jpeg INTERFACE)
  target_link_libraries(aiacc_jpeg INTERFACE libjpeg-turbo::jpeg libjpeg-turbo::turbojpeg)

  # OpenCV: core and imgproc are required (resize); imgcodecs is optional (fallback decoder for
  # PNG-under-.JPEG and CMYK files). Looked up directly: Debian's per-module -dev packages ship no
  # CMake config, and a GPU host carries only the modules it needs.
  find_path(OPENCV_INCLUDE_DIR opencv2/core.hpp PATH_SUFFIXES opencv4 REQUIRED)
  find_library(OPENCV_CORE_LIB opencv_core REQUIRED)
  find_library(OPENCV_IMGPROC_LIB opencv_imgproc REQUIRED)
  find_library(OPENCV_IMGCODECS_LIB opencv_imgcodecs)
  add_library(aiacc_opencv INTERFACE)
  target_include_directories(aiacc_opencv SYSTEM INTERFACE ${OPENCV_INCLUDE_DIR})
  target_link_libraries(aiacc_opencv INTERFACE ${OPENCV_CORE_LIB} ${OPENCV_IMGPROC_LIB})
  if(OPENCV_IMGCODECS_LIB)
    target_link_libraries(aiacc_opencv INTERFACE ${OPENCV_IMGCODECS_LIB})
    target_compile_definitions(aiacc_opencv INTERFACE AIACC_HAVE_IMGCODECS=1)
    message(STATUS "aiacc: OpenCV imgcodecs found: fallback decoder enabled")
  else()
    message(STATUS "aiacc: OpenCV imgcodecs not found: non-JPEG/CMYK files will be skipped")
  endif()

  find_package(gflags REQUIRED)
  find_package(glog REQUIRED)
endif()
find_package(Threads REQUIRED)

# JSON (reports, metrics, timeline, diagnostics, args.json): nlohmann-json, header-only, linked
# PRIVATE by the targets that write or read JSON and never included from an installed header.
find_package(nlohmann_json 3.9 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "aiacc: nlohmann-json 3.9 or newer not found; run scripts/setup.sh (Debian: apt install nlohmann-json3-dev)")
endif()

if(AIACC_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
