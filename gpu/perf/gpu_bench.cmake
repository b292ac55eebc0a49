# The device-layer benchmark (perf/gpu_bench.c), a standalone executable
# never run by ctest.  Included by gpu/CMakeLists.txt; a top-level
# perf/CMakeLists.txt can take it over with the one line
#   include(${PROJECT_SOURCE_DIR}/gpu/perf/gpu_bench.cmake)
# (the guard makes a second inclusion harmless).
if(NOT TARGET gpu_bench)
  add_executable(gpu_bench ${PROJECT_SOURCE_DIR}/perf/gpu_bench.c)
  target_link_libraries(gpu_bench PRIVATE hurray_static)
endif()
