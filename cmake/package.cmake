# Man pages and the Debian package.
#
# `cmake --build build --target package` writes build/mlxdist_<version>_<arch>.deb with the
# library (shared and static), the mpi plugin, the tools, the headers, the pkg-config file, the
# CMake package and the man pages, installed under /usr. Configure with
# -DCMAKE_INSTALL_PREFIX=/usr so that the library's built-in plugin directory is the one the
# package installs (the loader also looks next to libmlxdist.so itself, so either works).

# Man pages: docs/man/*.1, compressed as Debian's policy asks (gzip -9n: no name, no time stamp,
# so the package is reproducible).
set(MLXDIST_MAN_PAGES mlxdist-launch.1 mlxdist-bench.1 mlxdist-info.1)
set(_man_out "")
find_program(MLXDIST_GZIP gzip)
foreach(page ${MLXDIST_MAN_PAGES})
  set(_src ${PROJECT_SOURCE_DIR}/docs/man/${page})
  if(MLXDIST_GZIP)
    set(_dst ${PROJECT_BINARY_DIR}/man/${page}.gz)
    add_custom_command(OUTPUT ${_dst}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND ${MLXDIST_GZIP} -9n -c ${_src} > ${_dst}
      DEPENDS ${_src} VERBATIM)
  else()
    set(_dst ${_src})
  endif()
  list(APPEND _man_out ${_dst})
endforeach()
add_custom_target(man ALL DEPENDS ${_man_out})
if(MLXDIST_BUILD_TOOLS)
  install(FILES ${_man_out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "mlxdist")
set(CPACK_PACKAGE_VENDOR "mlxdist")
set(CPACK_PACKAGE_CONTACT "mlxdist maintainers <mlxdist@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "MLX distributed API in C: ring over TCP and shared memory, MPI, launcher")
set(CPACK_PACKAGE_DESCRIPTION
  "mlxdist implements the mlx_distributed_* C interface of mlx-c: process groups that sum,\
 gather, scatter, send and receive arrays, over TCP and shared memory (ring) or MPI (plugin),\
 with mlxdist-launch (one host or many over ssh), mlxdist-bench and mlxdist-info.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "libs")
# What the library and tools link (checked by tests/install/check_deb.sh with dpkg-shlibdeps'
# view of the files); the mpi plugin's Open MPI is only suggested: it is loaded at run time
# when a program asks for the mpi backend, and the rest works without it.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.34), libcjson1 (>= 1.7.13), libssl3 (>= 3.0.0)")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openssh-client")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "openmpi-bin, libopenmpi3")
set(CPACK_STRIP_FILES OFF)
# No maintainer scripts: the ld.so cache is refreshed by libc-bin's ldconfig trigger, which
# the package activates (Debian's way since 2015), so the package also installs into a root
# that has no shell (tests/install/check_deb.sh).
file(WRITE ${PROJECT_BINARY_DIR}/deb/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/deb/triggers)
include(CPack)
