# The stand-in runtime with a header that refuses to compile: exit code 4.
include(${CMAKE_CURRENT_LIST_DIR}/../fake-runtime/AdaptRuntimeConfig.cmake)
target_compile_definitions(adapt_fake_runtime INTERFACE ADAPT_FAKE_BREAK)
