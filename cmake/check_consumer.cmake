# ctest script: install the built moekit into a scratch prefix; configure, build and run
# examples/consumer and examples/checkpoint_fast against it with find_package(moekit) (for a
# CPU-only build with the CUDA toolkit made unfindable, so the package must not need it); then move
# the prefix and check that the installed CLI reads the configs installed beside it.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${MOEKIT_BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
get_filename_component(SOURCE_ROOT ${CONSUMER_SOURCE_DIR}/../.. ABSOLUTE)

# Whether the installed library links CUDA: only then may its package look for the toolkit.
file(GLOB targets_files ${WORK_DIR}/prefix/lib*/cmake/moekit/moekitTargets*.cmake)
set(links_cuda OFF)
foreach(f ${targets_files})
  file(READ ${f} text)
  if(text MATCHES "CUDA::")
    set(links_cuda ON)
  endif()
endforeach()
set(no_cuda_args "")
if(NOT links_cuda)
  set(no_cuda_args -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
endif()
message(STATUS "installed moekit links CUDA: ${links_cuda}")

function(build_example name)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_ROOT}/examples/${name}
                          -B ${WORK_DIR}/build-${name} -G Ninja
                          -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${no_cuda_args}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring examples/${name} with find_package(moekit) failed (${rc})")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build-${name} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building examples/${name} failed (${rc})")
  endif()
endfunction()

build_example(consumer)
set(ENV{MOEKIT_CONFIG_DIR} ${MOEKIT_CONFIG_DIR})
execute_process(COMMAND ${WORK_DIR}/build-consumer/moekit_consumer deepseek-v2-lite
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "fused vs unfused max rel diff")
  message(FATAL_ERROR "the consumer failed (${rc}): ${out}")
endif()

# A checkpoint written by transformers (tests/golden: config.json beside model.safetensors).
build_example(checkpoint_fast)
set(golden ${SOURCE_ROOT}/tests/golden/deepseek_v3)
execute_process(COMMAND ${WORK_DIR}/build-checkpoint_fast/moekit_checkpoint_fast ${golden} ${golden}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "same experts: yes")
  message(FATAL_ERROR "examples/checkpoint_fast failed (${rc}): ${out}${err}")
endif()

# The installed CLI, its prefix moved, finds a config that only the installed configs/ holds.
set(cli ${WORK_DIR}/moved/bin/moekit)
if(EXISTS ${WORK_DIR}/prefix/bin/moekit)
  file(RENAME ${WORK_DIR}/prefix ${WORK_DIR}/moved)
  file(GLOB installed_configs ${WORK_DIR}/moved/share/moekit/configs/*.json)
  if(NOT installed_configs)
    message(FATAL_ERROR "no configs installed under share/moekit/configs")
  endif()
  file(COPY_FILE ${WORK_DIR}/moved/share/moekit/configs/deepseek-v2-lite.json
       ${WORK_DIR}/moved/share/moekit/configs/installed-only.json)
  unset(ENV{MOEKIT_CONFIG_DIR})
  execute_process(COMMAND ${cli} inspect --model installed-only
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "installed-only")
    message(FATAL_ERROR "the installed CLI did not read its installed configs (${rc}): ${out}${err}")
  endif()
  message(STATUS "installed CLI reads ${WORK_DIR}/moved/share/moekit/configs")
endif()
