// Compiles tests/CMakeLists.txt's precompiled header (kiln_test_pch) once for every unit test.
