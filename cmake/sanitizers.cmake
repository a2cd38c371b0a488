# DDP_SANITIZE=address,undefined (or thread) instruments every target; set globally so that
# libraries and tests agree. UBSan findings abort the test instead of printing and going on.
if(DDP_SANITIZE)
  message(STATUS "ddprun: sanitizers ${DDP_SANITIZE}")
  add_compile_options(-fsanitize=${DDP_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${DDP_SANITIZE})
  # Line tables are all a sanitizer's report needs (file:line in every frame); full debug info
  # (-g, from RelWithDebInfo) costs a quarter of these trees' compile time on Asio, CLI11 and
  # nlohmann/json, so sanitized trees use -g1 (it comes after -g and wins).
  # -O1, as the sanitizers' own documentation advises: GCC's UBSan at -O2 doubles the compile of
  # an Asio, CLI11 or json unit (Beast's http_server.cpp: 104 s at -O2, 51 s at -O1). The
  # kernels' CPU loops keep their -O3 (kernels/CMakeLists.txt), so training under ASan stays quick.
  add_compile_options(-g1 -O1)
  if(DDP_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # Asio's fenced_block uses std::atomic_thread_fence, which GCC warns TSan cannot model.
    # The hand-offs it guards also go through Asio's scheduler mutex, which TSan does see.
    add_compile_options(-Wno-tsan)
  endif()
endif()
