# cmake --install BUILD --prefix PREFIX: aiacc::comm for other LibTorch programs.
#   PREFIX/include/aiacc/config.h             the build's options (cmake/config.h.in)
#   PREFIX/include/aiacc/comm/*.h             the public headers (AIACC_PUBLIC_HEADERS below)
#   PREFIX/include/aiacc/common/error.h       the error family they throw
#   PREFIX/lib/libaiacc_comm.a, libaiacc_common.a (static, position-independent), libaiacc_comm.so
#   PREFIX/lib/cmake/aiacc/                   aiaccConfig.cmake, its version file, the targets
# find_package(aiacc 0.1) then gives aiacc::comm (static) and aiacc::comm_shared; both bring
# LibTorch (found again, and refused when it is not the version and C++ ABI aiacc was built
# with) and, in a build with the system's Gloo, Gloo. Only aiacc/ is installed under include/:
# tests/install_test.sh checks that and builds and runs a consumer project (tests/consumer/) with
# both libraries; cmake/HeadersAlone.cmake compiles every installed header on its own.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The headers a user of DataParallel, the transports and the rendezvous reaches, and every header
# they include, and nccl_env.h (the environment a GPU program sets at start-up). channel_worker.h,
# op_timing.h, half.h, reduce_ops.h and the test transports (throttled, fault) stay inside the
# library.
set(AIACC_PUBLIC_HEADERS agreement autotune bucket_codec bucket_plan buffer_sync comm_error comm_hook data_parallel
    data_parallel_options factory failure
    grad_scale gradient_sync hierarchical key_log launch_env membership nccl_env process_group reducer shm_transport store striped_transport timeline timeout
    transport)
if(AIACC_WITH_GLOO)
  list(APPEND AIACC_PUBLIC_HEADERS gloo_transport)
endif()
if(AIACC_WITH_NCCL)
  list(APPEND AIACC_PUBLIC_HEADERS nccl_transport)
endif()
list(TRANSFORM AIACC_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/comm/)
list(TRANSFORM AIACC_PUBLIC_HEADERS APPEND .h)

set(aiacc_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/aiacc)
set_target_properties(aiacc_comm PROPERTIES EXPORT_NAME comm)
set_target_properties(aiacc_comm_shared PROPERTIES EXPORT_NAME comm_shared)
set_target_properties(aiacc_common PROPERTIES EXPORT_NAME common)
install(TARGETS aiacc_comm aiacc_comm_shared aiacc_common EXPORT aiaccTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${AIACC_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/aiacc/comm)
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
