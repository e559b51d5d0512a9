# Installation: headers, shared + static library, pkg-config files, CMake package.
# Plugin authors get the frozen ABI headers (include/mlx/c/plugin, installed with the rest),
# mlxdist-plugin.pc (cflags only) and the INTERFACE target mlxdist::plugin_abi.
include(CMakePackageConfigHelpers)

install(TARGETS mlxdist mlxdist_static mlxdist_plugin_abi
  EXPORT mlxdistTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mlx DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  PATTERN ".clang-format" EXCLUDE)

install(EXPORT mlxdistTargets
  NAMESPACE mlxdist::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mlxdist)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mlxdistConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mlxdistConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mlxdist)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mlxdistConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mlxdistConfig.cmake
  ${PROJECT_BINARY_DIR}/mlxdistConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mlxdist)

# The .pc file is relocatable: paths are relative to where it is installed, so
# `cmake --install --prefix P` works for any P.
file(RELATIVE_PATH MLXDIST_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
configure_file(${PROJECT_SOURCE_DIR}/cmake/mlxdist.pc.in ${PROJECT_BINARY_DIR}/mlxdist.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/mlxdist-plugin.pc.in ${PROJECT_BINARY_DIR}/mlxdist-plugin.pc
  @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mlxdist.pc ${PROJECT_BINARY_DIR}/mlxdist-plugin.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
