# cmake/QvgDeps.cmake — finding the packages the C++ core builds with.
#
# qvg_require_package(<package> <debian-package>): find_package(<package> CONFIG);
# when it is missing the configuration stops with one line naming the Debian
# package that provides it (scripts/deps.sh installs them all; docs/python.md
# lists the ones `pip install .` needs).
function(qvg_require_package package debian_package)
  find_package(${package} CONFIG QUIET)
  if(NOT ${package}_FOUND)
    qvg_fatal("qvg: ${package} not found: install the Debian package ${debian_package} "
              "(apt-get install ${debian_package}, or scripts/deps.sh for every package qvg needs)")
  endif()
endfunction()

# qvg_fatal(<text>...) / qvg_warning(<text>...): the text (the arguments joined, no
# semicolons) as ONE line of CMake's error or warning block (CMake wraps message
# text, except lines that start with a space, which it prints as they are).
function(qvg_fatal)
  string(CONCAT text ${ARGN})
  message(FATAL_ERROR " ${text}")
endfunction()
function(qvg_warning)
  string(CONCAT text ${ARGN})
  message(WARNING " ${text}")
endfunction()
