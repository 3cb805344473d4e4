# Datasets, IDX files and checkpoints (runtime/src/data, runtime/src/io). Included by
# tests/train/CMakeLists.txt.
tnt_add_test(NAME dataset SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dataset.cpp LABELS data TIMEOUT 120)
tnt_add_test(NAME dataset_distributed SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dataset_distributed.cpp
             RANKS 2 3 LABELS data TIMEOUT 120)
tnt_add_test(NAME idx SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_idx.cpp LABELS data TIMEOUT 120
             LIBS ZLIB::ZLIB)
tnt_add_test(NAME checkpoint SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp LABELS data TIMEOUT 120)
