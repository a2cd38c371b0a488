# The Debian package (issue 33, docs/install.md): `cpack -G DEB` in a build configured with
# -DDDP_BUILD_KIND=package -DCMAKE_INSTALL_PREFIX=/usr makes ddprun_<version>_<arch>.deb with
# the four programs in /usr/bin, their man pages (help2man over each program's --help and
# --version: the same flag tables), the ddprund systemd unit with its settings file, and the
# maintainer scripts of packaging/debian (the ddprund user and its secret).
if(SKBUILD)
  return()  # the wheel ships the programs alone
endif()

# Man pages, made from the built programs.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(DDP_MAN_DESCRIPTIONS
      "ddprun=a torchrun-compatible launcher for distributed training"
      "ddprund=the rendezvous store of ddprun jobs (c10d TCPStore-compatible)"
      "ddpstore=a command-line client of ddprund and torch's TCPStore"
      "ddp-train=data-parallel training on the CPU and the GPU")
  set(DDP_MAN_PAGES "")
  foreach(entry IN LISTS DDP_MAN_DESCRIPTIONS)
    string(REPLACE "=" ";" entry "${entry}")
    list(GET entry 0 prog)
    list(GET entry 1 what)
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.1.gz)
    add_custom_command(
      OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${HELP2MAN} --no-info --no-discard-stderr --name=${what}
              --output=${CMAKE_BINARY_DIR}/man/${prog}.1 $<TARGET_FILE:${prog}>
      COMMAND gzip -9nf ${CMAKE_BINARY_DIR}/man/${prog}.1
      DEPENDS ${prog}
      COMMENT "Man page of ${prog}"
      VERBATIM)
    list(APPEND DDP_MAN_PAGES ${page})
  endforeach()
  add_custom_target(man_pages ALL DEPENDS ${DDP_MAN_PAGES})
  install(FILES ${DDP_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
elseif(DDP_BUILD_KIND STREQUAL "package")
  message(FATAL_ERROR "the Debian package needs help2man for its man pages (apt-get install help2man)")
endif()

# The service. /lib/systemd/system is Debian 12's place for a package's units.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/ddprund.service DESTINATION /lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/ddprund.default DESTINATION /etc/default
        RENAME ddprund)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddprun developers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "torchrun-compatible launcher and rendezvous store")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
       "ddprun launches distributed training jobs as torchrun does (its flags, environment and "
       "rendezvous), restarts what fails and rides out store outages; ddprund is its rendezvous "
       "store, run as a service.")
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from the programs' libraries
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/postinst ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
    ${PROJECT_SOURCE_DIR}/packaging/debian/postrm ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
