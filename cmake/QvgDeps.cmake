# cmake/QvgDeps.cmake — finding the packages the C++ core builds with.
#
# qvg_require_package(<package> <debian-package>): find_package(<package> CONFIG);
# when it is missing the configuration stops with one line naming the Debian
# package that provides it (scripts/deps.sh installs them all; docs/python.md
# lists the ones `pip install .` needs).
function(qvg_require_package package debian_package)
  find_package(${package} CONFIG QUIET)
  if(NOT ${package}_FOUND)
    message(FATAL_ERROR "qvg: ${package} not found: install the Debian package ${debian_package} "
                        "(apt-get install ${debian_package}; scripts/deps.sh installs every package qvg needs)")
  endif()
endfunction()
