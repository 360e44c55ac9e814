# Every installed header compiled on its own, as a user's program includes it: one translation
# unit per header, with only the installed include folder (a copy of what cmake --install puts
# under PREFIX/include, made here) and LibTorch on the include path, warnings as errors. A public
# header that needs another to be included first, that includes a private header, or that warns
# in a user's build fails the build itself, and ccache keeps the result until a header changes
# (tests/install_test.sh then builds and runs programs against a real prefix).
# Needs AIACC_PUBLIC_HEADERS and AIACC_TESTING_HEADERS (cmake/Install.cmake).
set(aiacc_alone_include ${PROJECT_BINARY_DIR}/installed_headers/include)
set(aiacc_alone_headers ${AIACC_PUBLIC_HEADERS} ${AIACC_TESTING_HEADERS})
set(aiacc_alone_sources "")
set(aiacc_alone_installed "")
# A header no longer installed leaves no copy behind for another to include by mistake.
file(GLOB_RECURSE aiacc_alone_stale RELATIVE ${aiacc_alone_include} ${aiacc_alone_include}/*)
foreach(header ${aiacc_alone_stale})
  get_filename_component(name ${header} NAME_WE)
  if(NOT header MATCHES "^aiacc/(config|common/error)\\.h$" AND NOT "${PROJECT_SOURCE_DIR}/comm/${name}.h" IN_LIST
                                                                aiacc_alone_headers)
    file(REMOVE ${aiacc_alone_include}/${header})
  endif()
endforeach()
foreach(header ${aiacc_alone_headers})
  get_filename_component(name ${header} NAME)
  configure_file(${header} ${aiacc_alone_include}/aiacc/comm/${name} COPYONLY)
  list(APPEND aiacc_alone_installed aiacc/comm/${name})
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/common/error.h ${aiacc_alone_include}/aiacc/common/error.h COPYONLY)
list(APPEND aiacc_alone_installed aiacc/common/error.h)
# (config.h is made at configure time, by comm/CMakeLists.txt.)
configure_file(${AIACC_BUILD_INCLUDE_DIR}/aiacc/config.h ${aiacc_alone_include}/aiacc/config.h COPYONLY)
list(APPEND aiacc_alone_installed aiacc/config.h)
foreach(header ${aiacc_alone_installed})
  string(MAKE_C_IDENTIFIER ${header} name)
  set(src ${PROJECT_BINARY_DIR}/installed_headers/alone/${name}.cc)
  file(CONFIGURE OUTPUT ${src} CONTENT "#include \"${header}\"\n")
  list(APPEND aiacc_alone_sources ${src})
endforeach()
add_library(aiacc_headers_alone OBJECT ${aiacc_alone_sources})
set_target_properties(aiacc_headers_alone PROPERTIES UNITY_BUILD OFF)
target_include_directories(aiacc_headers_alone PRIVATE ${aiacc_alone_include})
target_link_libraries(aiacc_headers_alone PRIVATE aiacc_torch)
target_compile_features(aiacc_headers_alone PRIVATE cxx_std_17)
target_compile_options(aiacc_headers_alone PRIVATE -Wall -Wextra -Werror -Werror=undef)
