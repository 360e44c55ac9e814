# cmake --install BUILD --prefix PREFIX: aiacc::comm for other LibTorch programs.
#   PREFIX/include/aiacc/config.h             the build's options (cmake/config.h.in)
#   PREFIX/include/aiacc/comm/*.h             the public headers (AIACC_PUBLIC_HEADERS below), and
#                                             fault_transport.h (aiacc::comm_testing)
#   PREFIX/include/aiacc/common/error.h       the error family they throw
#   PREFIX/lib/libaiacc_comm.a, libaiacc_common.a (static, position-independent), libaiacc_comm.so,
#              libaiacc_comm_testing.a (FaultTransport; it links aiacc::comm)
#   PREFIX/lib/cmake/aiacc/                   aiaccConfig.cmake, its version file, the targets
# find_package(aiacc 0.1) then gives aiacc::comm (static), aiacc::comm_shared and
# aiacc::comm_testing (with aiacc::comm, for a program's tests); they bring
# LibTorch (found again, and refused when it is not the version and C++ ABI aiacc was built
# with) and, in a build with the system's Gloo, Gloo. Only aiacc/ is installed under include/:
# tests/install_test.sh checks that and builds and runs a consumer project (tests/consumer/) with
# both libraries; cmake/HeadersAlone.cmake compiles every installed header on its own.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# What a program calls, and nothing more: DataParallel and its options, the process group, the
# comm hook and transport interfaces, the errors, the timeline (and options.h, the plain types
# they take; gradient_sync.h, DataParallel's base; bucket_plan.h and grad_scale.h, what it
# reports and shares; nccl_env.h, the environment a GPU program sets at start-up). The parts
# behind them (reducer, codec, striping, tuner, store, factory, the transports themselves) and
# aiacc_train's own protocol (membership, key log, agreement, launch variables) stay inside the
# library; their headers are not installed, and no installed header names one (checked below).
set(AIACC_PUBLIC_HEADERS bucket_plan comm_error comm_hook data_parallel data_parallel_options failure grad_scale
    gradient_sync nccl_env options process_group timeline timeout transport)
list(TRANSFORM AIACC_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/comm/)
list(TRANSFORM AIACC_PUBLIC_HEADERS APPEND .h)
# aiacc::comm_testing: FaultTransport, for a program's own tests.
set(AIACC_TESTING_HEADERS ${PROJECT_SOURCE_DIR}/comm/fault_transport.h)
# Every header installed names only installed headers, in its #includes and in its comments
# ("comm/reducer.h", "gloo_transport.h"): a user reading one is never sent to a file they lack.
set(aiacc_installed_names config error)
foreach(header ${AIACC_PUBLIC_HEADERS} ${AIACC_TESTING_HEADERS})
  get_filename_component(name ${header} NAME_WE)
  list(APPEND aiacc_installed_names ${name})
endforeach()
file(GLOB aiacc_project_headers ${PROJECT_SOURCE_DIR}/app/*.h ${PROJECT_SOURCE_DIR}/comm/*.h
     ${PROJECT_SOURCE_DIR}/common/*.h ${PROJECT_SOURCE_DIR}/data/*.h ${PROJECT_SOURCE_DIR}/models/*.h)
set(aiacc_private_names "")
foreach(header ${aiacc_project_headers})
  get_filename_component(name ${header} NAME_WE)
  if(NOT name IN_LIST aiacc_installed_names)
    list(APPEND aiacc_private_names ${name})
  endif()
endforeach()
foreach(header ${AIACC_PUBLIC_HEADERS} ${AIACC_TESTING_HEADERS} ${PROJECT_SOURCE_DIR}/common/error.h
               ${PROJECT_SOURCE_DIR}/cmake/config.h.in)
  file(STRINGS ${header} lines)
  foreach(line IN LISTS lines)
    string(REGEX MATCHALL [[[a-z_]+\.h]] named "${line}")
    foreach(n IN LISTS named)
      string(REGEX REPLACE [[\.h$]] "" n "${n}")
      if(n IN_LIST aiacc_private_names AND NOT line MATCHES "^#include <")
        message(FATAL_ERROR "aiacc: ${header} is installed but names ${n}.h, which is not: ${line}")
      endif()
    endforeach()
  endforeach()
endforeach()

set(aiacc_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/aiacc)
set_target_properties(aiacc_comm PROPERTIES EXPORT_NAME comm)
set_target_properties(aiacc_comm_shared PROPERTIES EXPORT_NAME comm_shared)
set_target_properties(aiacc_common PROPERTIES EXPORT_NAME common)
set_target_properties(aiacc_comm_testing PROPERTIES EXPORT_NAME comm_testing)
install(TARGETS aiacc_comm aiacc_comm_shared aiacc_common aiacc_comm_testing EXPORT aiaccTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${AIACC_PUBLIC_HEADERS} ${AIACC_TESTING_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/aiacc/comm)
install(FILES ${PROJECT_SOURCE_DIR}/common/error.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/aiacc/common)
install(FILES ${AIACC_BUILD_INCLUDE_DIR}/aiacc/config.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/aiacc)
install(EXPORT aiaccTargets NAMESPACE aiacc:: DESTINATION ${aiacc_cmake_dir})

# What the package config checks and finds again: LibTorch's version and C++ ABI, and Gloo when
# the library links the system's.
set(AIACC_NEEDS_SYSTEM_GLOO OFF)
if(AIACC_WITH_GLOO AND AIACC_GLOO_MODE STREQUAL "system")
  set(AIACC_NEEDS_SYSTEM_GLOO ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/aiaccConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/aiaccConfig.cmake INSTALL_DESTINATION ${aiacc_cmake_dir})
# 0.x: a minor version may change the API, so only the same minor version is accepted.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/aiaccConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/aiaccConfig.cmake ${PROJECT_BINARY_DIR}/aiaccConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/aiaccTorchUsage.cmake
        DESTINATION ${aiacc_cmake_dir})
