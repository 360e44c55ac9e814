# aiacc_torch_usage(TARGET SCOPE): what compiling and linking against the LibTorch that
# find_package(Torch) found takes: its include directories (as SYSTEM: warnings inside LibTorch
# are not ours), libraries and flags (its C++ ABI), given to TARGET with SCOPE (INTERFACE, PUBLIC).
# One definition for aiacc's own build (cmake/Dependencies.cmake) and for the installed package
# (aiaccConfig.cmake), which applies it to the imported aiacc::comm targets.
function(aiacc_torch_usage target scope)
  target_include_directories(${target} SYSTEM ${scope} ${TORCH_INCLUDE_DIRS})
  target_link_libraries(${target} ${scope} ${TORCH_LIBRARIES})
  target_compile_options(${target} ${scope} ${TORCH_CXX_FLAGS})
  # A LibTorch built against an older libstdc++ with the newer parts linked in statically (the
  # pip wheels: pytorch/pytorch#133437) exports copies of libstdc++ functions, std::filesystem
  # among them, and those copies crash when called from code built with the system's compiler
  # (remove_all calls a null pointer). The system libstdc++ is put first among the binary's
  # libraries, so the dynamic linker binds those names to it; tests/symbol_binding_test.sh checks
  # the binding.
  if(DEFINED TORCH_INSTALL_PREFIX AND NOT TORCH_INSTALL_PREFIX STREQUAL "/usr")
    target_link_options(${target} ${scope} "SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
  endif()
endfunction()

# aiacc_torch_mixed(OUT): a message when the LibTorch found is two: TorchConfig finds its Caffe2
# half with a hint searched after the system's folders, so with another LibTorch installed
# system-wide (Debian's) and this one's prefix not on CMAKE_PREFIX_PATH (Torch_DIR alone), the two
# mix and the link fails far from the cause. Empty when Torch_DIR and Caffe2_DIR share a root.
function(aiacc_torch_mixed out)
  set(${out} "" PARENT_SCOPE)
  if(DEFINED Caffe2_DIR)
    get_filename_component(torch_root "${Torch_DIR}/.." REALPATH)
    get_filename_component(caffe2_root "${Caffe2_DIR}/.." REALPATH)
    if(NOT torch_root STREQUAL caffe2_root)
      set(${out} "LibTorch's Torch config (${Torch_DIR}) found the Caffe2 config of another LibTorch (${Caffe2_DIR}): put the LibTorch prefix on CMAKE_PREFIX_PATH, not only Torch_DIR" PARENT_SCOPE)
    endif()
  endif()
endfunction()

# aiacc_torch_cxx11_abi(OUT): 1 or 0, the _GLIBCXX_USE_CXX11_ABI that LibTorch's flags set
# (libstdc++'s default, 1, when they set none).
function(aiacc_torch_cxx11_abi out)
  if("${TORCH_CXX_FLAGS}" MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
  else()
    set(${out} 1 PARENT_SCOPE)
  endif()
endfunction()
