# KILN_STATIC_DEPS: link Abseil and Protobuf (lite) from their static archives, so that the
# shipped libkiln.so needs none of their shared libraries (libkiln.so also links libstdc++ and
# libgcc statically: see lib/c_api). The version script keeps every symbol of them local, so an
# application with its own Abseil, Protobuf or libstdc++ never sees kiln's copies.
#
# The archives must be fit for a shared library: position-independent code AND a TLS model a
# shared object can use. Debian 12's libabsl-dev and libprotobuf-dev archives are built as PIE:
# their thread_locals use the local-exec model (R_X86_64_TPOFF32 relocations in libabsl_base.a,
# libabsl_raw_hash_set.a, libabsl_cord.a, libprotobuf-lite.a, ...), which the linker refuses in a
# shared object. scripts/build_static_deps.sh builds the same versions from Debian's sources with
# -fPIC into a prefix; configure with -DCMAKE_PREFIX_PATH=<that prefix>.

# Sets ${out} to "target|property|archive" entries: each imported absl:: or protobuf:: library
# location of this directory and the static archive to link instead (libX.so[.N...] -> libX.a;
# an archive already imported as such is listed as is). Fails when an archive does not exist.
function(kiln_static_archive_plan out)
  get_property(imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  set(plan "")
  foreach(target IN LISTS imported)
    if(NOT target MATCHES "^(absl|protobuf)::")
      continue()
    endif()
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY" OR type STREQUAL "EXECUTABLE")
      continue()
    endif()
    get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
    set(properties IMPORTED_LOCATION)
    if(configs)
      foreach(config IN LISTS configs)
        list(APPEND properties IMPORTED_LOCATION_${config})
      endforeach()
    endif()
    foreach(property IN LISTS properties)
      get_target_property(location ${target} ${property})
      if(NOT location)
        continue()
      endif()
      string(REGEX REPLACE "\\.so(\\.[0-9]+)*$" ".a" archive "${location}")
      if(NOT EXISTS "${archive}")
        message(FATAL_ERROR "KILN_STATIC_DEPS: ${target} has no static archive: ${archive} does not "
                            "exist (install the -dev package that ships it, or -DKILN_STATIC_DEPS=OFF)")
      endif()
      list(APPEND plan "${target}|${property}|${archive}")
    endforeach()
  endforeach()
  set(${out} "${plan}" PARENT_SCOPE)
endfunction()

# Links every archive of the plan, whole, into a probe shared library. Sets ${ok} and, on failure,
# ${why} to the linker's first complaint.
function(kiln_static_archive_probe plan ok why)
  set(archives "")
  foreach(entry IN LISTS plan)
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 2 archive)
    list(APPEND archives "${archive}")
  endforeach()
  list(REMOVE_DUPLICATES archives)
  # Only the archives kiln's targets can pull in: Protobuf's full runtime and protoc's are not.
  list(FILTER archives EXCLUDE REGEX "/lib(protobuf|protoc)\\.a$")
  set(dir ${CMAKE_BINARY_DIR}/CMakeFiles/kiln_static_deps_probe)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/probe.cc "int kiln_static_deps_probe() { return 0; }\n")
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} -shared -fPIC -o ${dir}/probe.so ${dir}/probe.cc
            -Wl,--whole-archive ${archives} -Wl,--no-whole-archive
    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(result EQUAL 0)
    set(${ok} TRUE PARENT_SCOPE)
  else()
    set(${ok} FALSE PARENT_SCOPE)
    string(REGEX MATCH "[^\n]*(can not be used when making a shared object|recompile with -fPIC)[^\n]*"
           first "${output}")
    if(NOT first)
      string(REGEX MATCH "[^\n]+" first "${output}")
    endif()
    set(${why} "${first}" PARENT_SCOPE)
  endif()
endfunction()

function(kiln_apply_static_archive_plan plan)
  foreach(entry IN LISTS plan)
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 target)
    list(GET fields 1 property)
    list(GET fields 2 archive)
    set_target_properties(${target} PROPERTIES ${property} "${archive}")
  endforeach()
endfunction()

# Decides KILN_HAVE_STATIC_DEPS from KILN_STATIC_DEPS (AUTO, ON, OFF) and, when on, rewrites the
# imported targets so that everything kiln builds links the archives.
function(kiln_configure_static_deps)
  set(KILN_HAVE_STATIC_DEPS OFF PARENT_SCOPE)
  if(KILN_STATIC_DEPS STREQUAL "OFF")
    return()
  endif()
  kiln_static_archive_plan(plan)
  if(NOT plan)
    message(FATAL_ERROR "KILN_STATIC_DEPS: found no imported Abseil or Protobuf library")
  endif()
  kiln_static_archive_probe("${plan}" ok why)
  if(NOT ok)
    string(CONCAT message "the static Abseil/Protobuf archives cannot go into a shared library ("
                  "${why}). Debian's are built as PIE (local-exec TLS); build PIC ones with "
                  "scripts/build_static_deps.sh and configure with -DCMAKE_PREFIX_PATH=<its prefix>")
    if(KILN_STATIC_DEPS STREQUAL "ON")
      message(FATAL_ERROR "KILN_STATIC_DEPS=ON: ${message}")
    endif()
    message(STATUS "kiln: static dependencies OFF (KILN_STATIC_DEPS=AUTO): ${message}")
    return()
  endif()
  kiln_apply_static_archive_plan("${plan}")
  set(KILN_HAVE_STATIC_DEPS ON PARENT_SCOPE)
  message(STATUS "kiln: static dependencies ON: Abseil, Protobuf and libstdc++ linked into libkiln.so")
endfunction()
