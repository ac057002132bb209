# NCCL for expert parallelism (include/moekit/ep.h, docs/decisions/expert_parallel.md).
#
# MOEKIT_NCCL: AUTO (use NCCL when the CUDA backend builds and nccl.h + libnccl.so.2 are found),
# ON (fail the configure when not), OFF. Searched, in order: MOEKIT_NCCL_DIR (a directory holding
# include/nccl.h and lib/libnccl.so.2), PyPI's nvidia-nccl-cu13 wheel in .venv (pinned by
# scripts/install_deps.sh: site-packages/nvidia/nccl/{include,lib}), the CUDA toolkit's copy, the
# system's. Sets MOEKIT_HAVE_NCCL, MOEKIT_NCCL_INCLUDE_DIR, MOEKIT_NCCL_LIBRARY.
#
# Only src/ep/nccl_library.cpp sees nccl.h, and nothing links libnccl at build time: moekit loads it
# at run time (dlopen), so a binary built here still starts where the wheel is absent and says
# why expert parallelism is off.
set(MOEKIT_NCCL AUTO CACHE STRING "Expert parallelism over NCCL: AUTO (when found), ON, OFF")
set_property(CACHE MOEKIT_NCCL PROPERTY STRINGS AUTO ON OFF)
set(MOEKIT_NCCL_DIR "" CACHE PATH "Directory holding include/nccl.h and lib/libnccl.so.2")

set(MOEKIT_HAVE_NCCL OFF)
set(moekit_nccl_why "MOEKIT_NCCL=OFF")
if(NOT MOEKIT_NCCL STREQUAL "OFF")
  if(NOT MOEKIT_HAVE_CUDA)
    set(moekit_nccl_why "no CUDA backend")
    if(MOEKIT_NCCL STREQUAL "ON")
      message(FATAL_ERROR "MOEKIT_NCCL=ON needs the CUDA backend (MOEKIT_CUDA is ${MOEKIT_CUDA} "
                          "and no usable nvcc was enabled)")
    endif()
  else()
    set(moekit_nccl_hints "")
    if(MOEKIT_NCCL_DIR)
      list(APPEND moekit_nccl_hints "${MOEKIT_NCCL_DIR}")
    endif()
    file(GLOB moekit_nccl_wheel
         "${CMAKE_CURRENT_SOURCE_DIR}/.venv/lib/python*/site-packages/nvidia/nccl")
    list(APPEND moekit_nccl_hints ${moekit_nccl_wheel})
    if(CUDAToolkit_LIBRARY_ROOT)
      list(APPEND moekit_nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
    endif()
    find_path(MOEKIT_NCCL_INCLUDE_DIR nccl.h HINTS ${moekit_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    # the library next to the header first (a wheel's header with a toolkit's library would
    # mismatch), then the hints in order
    if(MOEKIT_NCCL_INCLUDE_DIR)
      get_filename_component(moekit_nccl_root "${MOEKIT_NCCL_INCLUDE_DIR}" DIRECTORY)
      list(PREPEND moekit_nccl_hints "${moekit_nccl_root}")
    endif()
    find_library(MOEKIT_NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
                 HINTS ${moekit_nccl_hints} PATH_SUFFIXES lib lib64)
    if(MOEKIT_NCCL_INCLUDE_DIR AND MOEKIT_NCCL_LIBRARY)
      set(MOEKIT_HAVE_NCCL ON)
    else()
      set(moekit_nccl_why "nccl.h or libnccl.so.2 not found")
      if(MOEKIT_NCCL STREQUAL "ON")
        message(FATAL_ERROR "MOEKIT_NCCL=ON but NCCL was not found (nccl.h: "
                "'${MOEKIT_NCCL_INCLUDE_DIR}', library: '${MOEKIT_NCCL_LIBRARY}'). Run "
                "./scripts/install_deps.sh (installs nvidia-nccl-cu13 into .venv) or set "
                "-DMOEKIT_NCCL_DIR=<dir with include/nccl.h and lib/libnccl.so.2>")
      endif()
    endif()
  endif()
endif()
if(MOEKIT_HAVE_NCCL)
  message(STATUS "moekit: NCCL ON (${MOEKIT_NCCL_INCLUDE_DIR}/nccl.h, ${MOEKIT_NCCL_LIBRARY})")
else()
  message(STATUS "moekit: NCCL OFF (${moekit_nccl_why}): expert parallelism is off")
endif()

# The one translation unit that reads nccl.h: moekit::ep::nccl_support() (src/ep/nccl_library.cpp).
set(moekit_nccl_info_source "${CMAKE_CURRENT_SOURCE_DIR}/src/ep/nccl_library.cpp")
if(MOEKIT_HAVE_NCCL)
  set_source_files_properties("${moekit_nccl_info_source}" PROPERTIES
    INCLUDE_DIRECTORIES "${MOEKIT_NCCL_INCLUDE_DIR};${CUDAToolkit_INCLUDE_DIRS}"
    COMPILE_DEFINITIONS "MOEKIT_WITH_NCCL=1;MOEKIT_NCCL_LIBRARY=\"${MOEKIT_NCCL_LIBRARY}\"")
else()
  set_source_files_properties("${moekit_nccl_info_source}" PROPERTIES
    COMPILE_DEFINITIONS "MOEKIT_NCCL_OFF_REASON=\"${moekit_nccl_why}\"")
endif()
