// This build's paths for the tests: the source folder, the Pythons with the golden PyTorch and
// the pinned tensorboard, aiacc_train and the peer-rank program. They live in one source
// tests/CMakeLists.txt generates (build_paths_<config>.cc, library aiacc_test_paths) rather than on the
// test sources' compile lines: the tests' objects are then the same in every clone of the project,
// and ccache's entries for them serve another clone's build (a fresh clone's CI).
#pragma once

namespace aiacc::test::build {
const char* sourceDir();       // the project's folder
const char* goldenPython();    // AIACC_GOLDEN_PYTHON
const char* toolsPython();     // AIACC_TOOLS_PYTHON
const char* trainBin();        // aiacc_train; "" in a build without it (sanitizer, comm only)
const char* hookedTrainBin();  // aiacc_train_hooked (app/binary_hooks.h): AIACC_TEST_* faults on cue
const char* peerRankBin();     // tests/peer_rank.cc's program
}  // namespace aiacc::test::build

#define AIACC_SOURCE_DIR (::aiacc::test::build::sourceDir())
#define AIACC_GOLDEN_PYTHON (::aiacc::test::build::goldenPython())
#define AIACC_TOOLS_PYTHON (::aiacc::test::build::toolsPython())
#define AIACC_TRAIN_BIN (::aiacc::test::build::trainBin())
#define AIACC_HOOKED_TRAIN_BIN (::aiacc::test::build::hookedTrainBin())
#define AIACC_PEER_RANK_BIN (::aiacc::test::build::peerRankBin())
