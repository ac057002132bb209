# Run after the ops library links (python/CMakeLists.txt, POST_BUILD): fails the build when the
# library carries its own copy of libstdc++ instead of needing the shared one. torch's libraries
# use the shared libstdc++; a private static copy crashes the first time a stream or string made
# by one is used by the other (an error message naming a shape is enough). Some GCC installs
# (one without libstdc++.so in its library directory) link the static copy by default.
# -DLIB=<the built module> -DREADELF=<readelf>
execute_process(COMMAND "${READELF}" -d "${LIB}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moekit: cannot read the dynamic section of ${LIB} with ${READELF}")
endif()
if(NOT dyn MATCHES "NEEDED[^\n]*libstdc\\+\\+\\.so")
  message(FATAL_ERROR "moekit: ${LIB} links libstdc++ statically (it does not need "
          "libstdc++.so), so it cannot share strings and streams with torch's libraries: use a "
          "C++ compiler whose library directory has libstdc++.so (CMAKE_CXX_COMPILER), as torch's "
          "libraries need it")
endif()
