# One line per SIMD family; each owner edits only its own line(s).
# kiln_simd_sources(avx2 ${CMAKE_CURRENT_SOURCE_DIR}/legacy_avx2.cc)
