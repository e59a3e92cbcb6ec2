# cmake --install: the libraries, their headers, troupe-run, troupe-ckpt and the Python
# tools under the prefix; troupeConfig.cmake (find_package(troupe)) with the targets as
# troupe::<name>, troupe.pc for pkg-config; and CPack's Debian package (scripts/package).
include(CMakePackageConfigHelpers)

set(troupe_libraries troupe_core troupe_tensor troupe_mpi troupe_collectives troupe_actors troupe_nn
                     troupe_checkpoint troupe_checkpoint_actor troupe_checkpoint_parallel troupe_supervisor_client
                     troupe_parallel troupe_train)
foreach(target IN LISTS troupe_libraries)
  string(REPLACE "troupe_" "" name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name} VERSION ${PROJECT_VERSION}
                                             SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
endforeach()
set_target_properties(troupe_all PROPERTIES EXPORT_NAME troupe)

install(TARGETS ${troupe_libraries} troupe_all EXPORT troupeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS troupe-run troupe-ckpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CUDA backend, loaded on demand from beside libtroupe_tensor (tensor/CMakeLists.txt).
if(TARGET troupe_tensor_cuda)
  install(TARGETS troupe_tensor_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
foreach(dir core/include tensor/include mpi/include collectives/include actors/include nn/include checkpoint/include
            supervisor/include parallel/include train/include)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/include/troupe/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/load_in_torch.py ${PROJECT_SOURCE_DIR}/tools/plot_metrics.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/troupe/tools)
# load_in_torch.py --gpt-val-loss imports the model from beside itself.
install(FILES ${PROJECT_SOURCE_DIR}/tools/torch_gpt.py DESTINATION ${CMAKE_INSTALL_DATADIR}/troupe/tools)

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${config_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${config_dir})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${config_dir})

# pkg-config: every library, most dependent first, and the public definitions.
set(TROUPE_PC_LIBS "")
foreach(name train parallel checkpoint_parallel checkpoint_actor checkpoint supervisor_client actors collectives nn tensor mpi
             core)
  string(APPEND TROUPE_PC_LIBS " -ltroupe_${name}")
endforeach()
string(STRIP "${TROUPE_PC_LIBS}" TROUPE_PC_LIBS)
set(TROUPE_PC_DEFINES "")
if(TROUPE_HAVE_CUDA)
  string(APPEND TROUPE_PC_DEFINES " -DTROUPE_HAVE_CUDA=1")
endif()
if(TROUPE_HAVE_NCCL)
  string(APPEND TROUPE_PC_DEFINES " -DTROUPE_HAVE_NCCL=1")
endif()
file(RELATIVE_PATH TROUPE_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${PROJECT_SOURCE_DIR}/cmake/troupe.pc.in ${PROJECT_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Debian package: troupe_<version>_amd64.deb, depending on the Debian packages that
# troupe's headers and libraries need (a -dev package in one: the headers are the API).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "troupe developers <troupe@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++20 actor runtime over MPI for distributed deep-learning training")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "openmpi-bin, libopenmpi-dev, libhdf5-openmpi-dev, libcereal-dev, libboost-dev, libopenblas-dev, zlib1g-dev, cmake, g++")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-h5py, python3-torch, python3-matplotlib")
include(CPack)
