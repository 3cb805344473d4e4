# ImageNet input pipeline (runtime/src/data/imagenet.cpp, jpeg.cpp, tfrecord.cpp). Included
# by tests/train/CMakeLists.txt. The tests write their own tiny datasets.
tnt_add_test(NAME imagenet SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_imagenet.cpp LABELS data TIMEOUT 120
             LIBS JPEG::JPEG)
tnt_add_test(NAME imagenet_distributed SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_imagenet_distributed.cpp
             RANKS 2 3 LABELS data TIMEOUT 120)

# Pipeline throughput (decode + augment), run by hand: build/bin/tnt_imagenet_bench.
add_executable(tnt_imagenet_bench ${CMAKE_CURRENT_LIST_DIR}/test_imagenet_bench.cpp)
target_link_libraries(tnt_imagenet_bench PRIVATE tarantella)
