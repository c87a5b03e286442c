# A stand-in for the runtime's package (build/runtime/AdaptRuntimeConfig.cmake)
# so lit can compile a generated trainer without LibTorch: trainMain prints
# what the ModelDef holds.
if(NOT TARGET adapt::runtime)
  add_library(adapt_fake_runtime STATIC ${CMAKE_CURRENT_LIST_DIR}/FakeTrainMain.cpp)
  target_include_directories(adapt_fake_runtime PUBLIC
    ${CMAKE_CURRENT_LIST_DIR}/../trainmain-stub ${CMAKE_CURRENT_LIST_DIR}/../../../..)
  add_library(adapt::runtime ALIAS adapt_fake_runtime)
endif()
