# The installed library: the static libraries behind strata::engine, exported as a CMake package
# (find_package(strata)) and described by a pkg-config file (strata.pc). The programs and the public
# headers are installed by their own directories.
include(CMakePackageConfigHelpers)

if(STRATA_CUDA_EMU)
  # The emulator stands in for the CUDA Toolkit in tests only; such a build installs no library.
  message(STATUS "strata: STRATA_CUDA=EMU, the engine library and its package are not installed")
  return()
endif()

set(strata_libraries strata_engine strata_template strata_arenas strata_gpu_cache strata_kernels)
set(strata_pc_libs "-lstrata_engine")
if(STRATA_HAVE_CUDA)
  list(APPEND strata_libraries strata_gpu_host_pool strata_cuda_kernels)
  string(APPEND strata_pc_libs " -lstrata_gpu_host_pool")
endif()
string(APPEND strata_pc_libs " -lstrata_template -lstrata_arenas -lstrata_gpu_cache")
if(STRATA_HAVE_CUDA)
  string(APPEND strata_pc_libs " -lstrata_cuda_kernels")
endif()
string(APPEND strata_pc_libs " -lstrata_kernels")
if(STRATA_HAVE_CUDA)
  string(APPEND strata_pc_libs " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -ldl")
endif()

# Exported names: strata::engine (what users link), strata::kernels, strata::arenas, ...
foreach(lib IN LISTS strata_libraries)
  string(REGEX REPLACE "^strata_" "" export_name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
install(TARGETS ${strata_libraries} EXPORT strataTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

set(strata_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${strata_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${strata_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/strataConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/strataConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/strataConfigVersion.cmake
  DESTINATION ${strata_cmake_dir})

# strata.pc finds its prefix from its own place, so `cmake --install --prefix P` may pick any P.
file(RELATIVE_PATH strata_pc_prefix "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" strata_pc_prefix "${strata_pc_prefix}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/strata.pc.in ${CMAKE_CURRENT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/strata.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
