# One line per SIMD family; each owner edits only its own line(s).
# Float types + legacy quants (lib/quant/legacy_kernels.h); no FP contraction: FMAs are explicit.
set(KILN_LEGACY_SIMD_AVX2 ${CMAKE_CURRENT_SOURCE_DIR}/legacy_avx2.cc ${CMAKE_CURRENT_SOURCE_DIR}/float_avx2.cc)
set(KILN_LEGACY_SIMD_AVX512 ${CMAKE_CURRENT_SOURCE_DIR}/legacy_avx512.cc ${CMAKE_CURRENT_SOURCE_DIR}/float_avx512.cc)
kiln_simd_sources(avx2 ${KILN_LEGACY_SIMD_AVX2})
kiln_simd_sources(avx512 ${KILN_LEGACY_SIMD_AVX512})
set_property(SOURCE ${KILN_LEGACY_SIMD_AVX2} ${KILN_LEGACY_SIMD_AVX512} TARGET_DIRECTORY kiln_core APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
kiln_simd_sources(avx2 ${CMAKE_CURRENT_SOURCE_DIR}/ops_avx2.cc)      # CPU backend ops (lib/backend/cpu)
kiln_simd_sources(avx512 ${CMAKE_CURRENT_SOURCE_DIR}/ops_avx512.cc)  # CPU backend ops (lib/backend/cpu)
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/ops_avx2.cc ${CMAKE_CURRENT_SOURCE_DIR}/ops_avx512.cc TARGET_DIRECTORY kiln_core APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
# K-quants Q2_K..Q6_K, Q8_K (lib/quant/kquants.h); no FP contraction: results match the scalar bits.
set(KILN_KQUANTS_SIMD_AVX2 ${CMAKE_CURRENT_SOURCE_DIR}/kquants_avx2.cc)
set(KILN_KQUANTS_SIMD_AVX512 ${CMAKE_CURRENT_SOURCE_DIR}/kquants_avx512.cc)
kiln_simd_sources(avx2 ${KILN_KQUANTS_SIMD_AVX2})
kiln_simd_sources(avx512 ${KILN_KQUANTS_SIMD_AVX512})
set_property(SOURCE ${KILN_KQUANTS_SIMD_AVX2} ${KILN_KQUANTS_SIMD_AVX512} TARGET_DIRECTORY kiln_core APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
# Rows x tokens tile kernels (kernels/cpu/tile_kernels.h); no FP contraction: same bits as their
# references (vec_dot, or the integer order of lib/quant/interleave.h).
set(KILN_TILE_SIMD_AVX512 ${CMAKE_CURRENT_SOURCE_DIR}/tile_q8_0_avx512.cc ${CMAKE_CURRENT_SOURCE_DIR}/tile_q4_1_avx512.cc ${CMAKE_CURRENT_SOURCE_DIR}/interleaved_avx512.cc)
kiln_simd_sources(avx512 ${KILN_TILE_SIMD_AVX512})
set_property(SOURCE ${KILN_TILE_SIMD_AVX512} TARGET_DIRECTORY kiln_core APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
# MatMul's activation quantizers (lib/quant/activation.h).
kiln_simd_sources(avx512 ${CMAKE_CURRENT_SOURCE_DIR}/activation_avx512.cc)
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/activation_avx512.cc TARGET_DIRECTORY kiln_core APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)
