# Decides whether the CUDA backend is built (TROUPE_CUDA=AUTO|ON|OFF) and sets
# TROUPE_HAVE_CUDA. The toolkit is looked for where Debian and NVIDIA put it.
set(TROUPE_HAVE_CUDA OFF)
if(NOT TROUPE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # One architecture keeps CI's compile short; sm_90 is the H100/H200 we test on.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    # CMake 3.25 does not know the flag for C++20 with nvcc 13; the .cu files need only C++17.
    set(CMAKE_CUDA_STANDARD 17)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TROUPE_HAVE_CUDA ON)
  elseif(TROUPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TROUPE_CUDA=ON but no CUDA compiler was found (looked in PATH and /usr/local/cuda)")
  endif()
endif()
message(STATUS "troupe: CUDA backend ${TROUPE_HAVE_CUDA} (TROUPE_CUDA=${TROUPE_CUDA})")

# troupe_soname(VAR library): VAR = the SONAME of `library` (libcudart.so.13), for a
# dlopen that finds the same major version the build was made against.
function(troupe_soname var library)
  file(REAL_PATH "${library}" real)
  execute_process(COMMAND objdump -p "${real}" OUTPUT_VARIABLE dump RESULT_VARIABLE status ERROR_QUIET)
  if(status EQUAL 0 AND dump MATCHES "SONAME +([^\n ]+)")
    set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    get_filename_component(name "${real}" NAME)
    set(${var} "${name}" PARENT_SCOPE)
  endif()
endfunction()
